"""S3 GETs in the thread that asks, on botocore's synchronous client or as presigned URLs: no event loop in between.

By default a GET is a URL presigned by botocore (its credentials, endpoint,
region and signature) fetched by chute's own HTTP client (chute/storage/net/http.py,
:func:`presigns`): on this project's 2-core machine against moto, 0.2-0.35
client CPU seconds per GB where reading botocore's response took 0.8-0.95 (its
urllib3 reads and the CRC check). The object's integrity is then the
manifest's checksum, checked on every download, as over HTTP. Where more than
the URL is needed (``s3_additional_kwargs``, requester pays, a proxy) or
``CHUTE_S3_CLIENT=botocore``, the GET is botocore's:

    botocore client ──(urllib3 socket reads, read1)──► the calling thread: writes them, watches the rate

The fsspec path (chute/storage/net/stream.py) runs every request of a process on
s3fs's one event-loop thread, where aiohttp hands the body over in small
pieces, each a few Python calls holding the GIL. Against moto on this project's
2-core machine that path moved 40-57 MiB/s for 3-5 CPU seconds per GiB, where
the same 8 threads each reading their own response with botocore moved
124-239 MiB/s for 1.3 s per GiB. So chute's own S3 downloads take this path
whenever the dataset's ``storage_options`` are ones it understands
(:func:`client_for`); others (a custom ``session``, ``asynchronous``) keep the
fsspec path, and so does ``CHUTE_S3_CLIENT=fsspec``.

What the fsspec path guarantees holds on both: the floor speed (a read returns
whatever has arrived, so the rate is checked as bytes come; a connection that
sends nothing times out after the floor's window), cancellation at once (the
socket is shut down under the blocked read), and the same errors (a missing
object is ``FileNotFoundError``, a forbidden one ``PermissionError``). botocore's
GETs also check the CRC stored with the object (fed as bytes arrive).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from chute.storage.net.stream import READ_SIZE, Floor, Interrupted, RangeIgnored, Receiver, SlowTransfer

#: s3fs arguments this module maps onto botocore (the others it may ignore: they do not change a GET).
_CLIENT_OPTIONS = {"key", "secret", "token", "anon", "endpoint_url", "use_ssl", "client_kwargs", "config_kwargs",
                   "requester_pays", "s3_additional_kwargs", "version_aware", "username", "password", "profile"}
_GET_NEUTRAL = {"default_block_size", "default_fill_cache", "default_cache_type", "cache_regions", "max_concurrency",
                "fixed_upload_size", "local_expiry_check", "skip_instance_cache", "use_listings_cache",
                "listings_expiry_time", "max_paths"}


def client_for(storage_options: dict[str, Any], parallel: int, floor: Floor) -> Any | None:
    """A botocore S3 client configured as s3fs would be by ``storage_options``; None when this
    path does not apply (botocore missing, ``CHUTE_S3_CLIENT=fsspec``, an option it cannot map)."""
    if os.environ.get("CHUTE_S3_CLIENT", "").lower() == "fsspec":
        return None
    if any(k not in _CLIENT_OPTIONS and k not in _GET_NEUTRAL for k in storage_options):
        return None
    try:
        import botocore.config
        import botocore.session
        from botocore import UNSIGNED
    except ImportError:
        return None
    options = storage_options
    kwargs: dict[str, Any] = dict(options.get("client_kwargs") or {})
    for ours, theirs in (("key", "aws_access_key_id"), ("username", "aws_access_key_id"), ("secret", "aws_secret_access_key"),
                         ("password", "aws_secret_access_key"), ("token", "aws_session_token"), ("endpoint_url", "endpoint_url"),
                         ("use_ssl", "use_ssl")):
        if options.get(ours) is not None:
            kwargs.setdefault(theirs, options[ours])
    config: dict[str, Any] = dict(options.get("config_kwargs") or {})
    # each download thread and each of its byte ranges keeps a connection: no "pool is full" discards
    config.setdefault("max_pool_connections", parallel * (parallel + 1))
    if floor.active:
        config.setdefault("read_timeout", floor.window)  # nothing at all for the floor's window: retried as too slow
    if options.get("anon"):
        config["signature_version"] = UNSIGNED
    session = botocore.session.Session(profile=options.get("profile"))
    return session.create_client("s3", config=botocore.config.Config(**config), **kwargs)


#: Environment variables that send requests through a proxy: botocore honours them, Python's client does not.
_PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def presigns(storage_options: dict[str, Any]) -> bool:
    """Whether GETs go as presigned URLs through chute's own HTTP client (chute/storage/net/http.py) rather than
    botocore's: where nothing but the URL is needed (no extra GET arguments, no proxy) and
    ``CHUTE_S3_CLIENT`` does not ask for botocore or fsspec."""
    if os.environ.get("CHUTE_S3_CLIENT", "").lower() in ("botocore", "fsspec"):
        return False
    if get_kwargs(storage_options) or any(os.environ.get(name) for name in _PROXY_ENV):
        return False
    return "proxies" not in (storage_options.get("config_kwargs") or {})


def verify_of(storage_options: dict[str, Any]) -> bool | str:
    """What HTTPS connections check, as botocore decides it: ``client_kwargs["verify"]`` (False or a CA
    bundle), else ``AWS_CA_BUNDLE``, else the system's certificates."""
    verify = (storage_options.get("client_kwargs") or {}).get("verify")
    if verify is not None:
        return verify
    return os.environ.get("AWS_CA_BUNDLE") or True


def presigned_url(client: Any, bucket: str, key: str, version: str | None) -> str:
    """A GET URL of ``bucket/key`` signed by ``client`` (its credentials, endpoint and region), valid 1 hour."""
    params = {"Bucket": bucket, "Key": key}
    if version:
        params["VersionId"] = version
    return client.generate_presigned_url("get_object", Params=params, ExpiresIn=3600)


def get_kwargs(storage_options: dict[str, Any]) -> dict[str, Any]:
    """What every GET carries besides bucket, key and range (as s3fs's ``req_kw``)."""
    extra = dict(storage_options.get("s3_additional_kwargs") or {})
    if storage_options.get("requester_pays"):
        extra["RequestPayer"] = "requester"
    return extra


def get(client: Any, bucket: str, key: str, version: str | None, extra: dict[str, Any], start: int | None,
        length: int | None, sink: Callable[[int, list[bytes]], None], *, floor: Floor, url: str,
        cancelled: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], Callable[[], None]]) -> int:
    """GET ``length`` bytes of ``bucket/key`` from ``start`` (None: the whole object) into
    ``sink(offset, chunks)``, in this thread; the bytes received. Raises as :func:`chute.storage.net.stream.get`."""
    from botocore.exceptions import ClientError
    from urllib3.exceptions import ReadTimeoutError

    kw = dict(extra, Bucket=bucket, Key=key)
    if version:
        kw["VersionId"] = version
    if start is not None:
        kw["Range"] = f"bytes={start}-{start + max(length or 0, 1) - 1}"
    if cancelled():
        raise Interrupted(url)
    try:
        response = client.get_object(**kw)
    except ClientError as exc:
        mapped = _as_os_error(exc, url)
        if mapped is None:
            raise
        raise mapped from exc
    if start is not None and response["ResponseMetadata"]["HTTPStatusCode"] != 206:
        response["Body"].close()
        raise RangeIgnored(url)
    body = response["Body"]
    raw = body._raw_stream  # urllib3's response: read1 returns what has arrived
    # botocore's check of the object's stored CRC (StreamingChecksumBody), fed as the bytes come
    checksum = getattr(body, "checksum", None) if hasattr(body, "_validate_checksum") else None
    remove = on_cancel(lambda: _shut(raw))
    receiver = Receiver(sink, start or 0, floor)
    try:
        while True:
            if cancelled():
                raise Interrupted(url)
            try:
                chunk = raw.read1(READ_SIZE)
            except Exception as exc:
                if cancelled():  # the socket was shut under the read
                    raise Interrupted(url) from None
                if floor.active and isinstance(exc, ReadTimeoutError):  # the read timeout is the floor's window
                    raise SlowTransfer(f"no bytes for {floor.window:g} s, below the floor speed of {floor.rate:,} bytes/s") from None
                raise
            if not chunk and cancelled():
                raise Interrupted(url)
            if checksum is not None:
                if chunk:
                    checksum.update(chunk)
                else:
                    body._validate_checksum()  # FlexibleChecksumError: a damaged transfer, retried
            receiver.add(chunk)
            if not chunk:
                return receiver.received
    finally:
        remove()
        if not raw.closed:
            raw.close()  # unread bytes left: the connection is dropped, not returned to the pool


def _shut(raw: Any) -> None:
    """Wake a read blocked on ``raw``'s socket from another thread (closing alone does not)."""
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _as_os_error(exc: Any, url: str) -> OSError | None:
    """A missing object as FileNotFoundError and a forbidden one as PermissionError (as s3fs raises
    them); None for other errors (the caller raises them as they are)."""
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = exc.response.get("Error", {}).get("Code")
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "404"):
        return FileNotFoundError(f"{url}: {code or status}")
    if status == 403 or code in ("AccessDenied", "403"):
        return PermissionError(f"{url}: {code or status}")
    return None
