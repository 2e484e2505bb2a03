"""S3 GETs in the thread that asks, through chute's connection layer, or botocore's own where asked: no event loop.

botocore makes the request and chute's HTTP client (chute/storage/net/http.py,
urllib3 through the process's pools, proxies from the environment) sends it and
reads the body in the download thread, bounded by the manifest's size:

* by default a GET is a URL presigned by botocore (its credentials, endpoint,
  region and signature; :func:`presigned_url`): against moto on this project's
  2-core machine, 0.2-0.35 client CPU seconds per GB where reading botocore's
  own response took 0.8-0.95 (its urllib3 reads and the CRC check);
* a GET that needs more than the URL (``s3_additional_kwargs`` such as SSE-C
  keys, ``requester_pays``) is built and signed by botocore, headers and all,
  and taken just before botocore would send it (its public ``before-send``
  event: :func:`signed_request`), then sent the same way.

The object's integrity is then the manifest's checksum, checked on every
download, as over HTTP. With ``CHUTE_S3_CLIENT=botocore`` (or a
``config_kwargs["proxies_config"]`` only botocore knows), botocore's own
``get_object`` reads the body through its public ``StreamingBody.read``, which
also checks the CRC stored with the object; that path checks the floor speed
after each read of up to ``BOTOCORE_READ`` bytes (its read timeout is the floor's
window) and a cancel ends it after the read in progress.

The fsspec path (chute/storage/net/stream.py) runs every request of a process on
s3fs's one event-loop thread, where aiohttp hands the body over in small
pieces, each a few Python calls holding the GIL: against moto it moved 40-57
MiB/s for 3-5 CPU seconds per GiB. So chute's own S3 downloads take these paths
whenever the dataset's ``storage_options`` are ones botocore's client can be
made from (:func:`client_for`); others (a custom ``session``, ``asynchronous``)
keep the fsspec path, and so does ``CHUTE_S3_CLIENT=fsspec``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from chute.storage.net.stream import Floor, Interrupted, RangeIgnored, Receiver, SlowTransfer, check_length, check_range

#: s3fs arguments this module maps onto botocore (the others it may ignore: they do not change a GET).
_CLIENT_OPTIONS = {"key", "secret", "token", "anon", "endpoint_url", "use_ssl", "client_kwargs", "config_kwargs",
                   "requester_pays", "s3_additional_kwargs", "version_aware", "username", "password", "profile"}
_GET_NEUTRAL = {"default_block_size", "default_fill_cache", "default_cache_type", "cache_regions", "max_concurrency",
                "fixed_upload_size", "local_expiry_check", "skip_instance_cache", "use_listings_cache",
                "listings_expiry_time", "max_paths"}
#: Bytes asked of botocore's ``StreamingBody.read`` at once (it returns only when they have all arrived).
BOTOCORE_READ = 256 << 10


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


def mode(storage_options: dict[str, Any]) -> str:
    """How GETs are made: ``"presigned"`` (the URL is all a GET needs), ``"signed"`` (botocore builds
    and signs each GET, chute sends it) or ``"botocore"`` (botocore's own GETs: ``CHUTE_S3_CLIENT=botocore``,
    or a ``proxies_config`` only botocore's connections know)."""
    if os.environ.get("CHUTE_S3_CLIENT", "").lower() == "botocore":
        return "botocore"
    if "proxies_config" in (storage_options.get("config_kwargs") or {}):
        return "botocore"
    return "signed" if get_kwargs(storage_options) else "presigned"


def proxies_of(storage_options: dict[str, Any]) -> dict[str, str] | None:
    """The proxies botocore would use for the dataset's endpoint: ``config_kwargs["proxies"]`` (a scheme to a
    proxy URL, as botocore takes them), else None (the environment's, as botocore reads it too)."""
    proxies = (storage_options.get("config_kwargs") or {}).get("proxies")
    return dict(proxies) if proxies else None


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


class _Signed(Exception):
    """Carries the request botocore was about to send (raised from its ``before-send`` event)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(url)
        self.url, self.headers = url, headers


def _take(request: Any, **_: Any) -> None:
    """botocore's ``before-send`` handler: take the signed request instead of letting botocore send it."""
    headers = {k: v.decode("latin-1") if isinstance(v, bytes) else str(v) for k, v in request.headers.items()}
    raise _Signed(request.url, headers)


def signer_for(storage_options: dict[str, Any], parallel: int, floor: Floor) -> Any | None:
    """A botocore client like :func:`client_for`'s that builds and signs GetObject requests and hands them to
    :func:`signed_request` instead of sending them (its own client: the handler would stop its sends too)."""
    client = client_for(storage_options, parallel, floor)
    if client is not None:
        client.meta.events.register("before-send.s3.GetObject", _take)
    return client


def signed_request(signer: Any, params: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """``(url, headers)`` of the GetObject request ``signer`` (see :func:`signer_for`) builds and signs for
    ``params``: every header botocore's handlers add (SSE-C keys and their MD5, the request payer, the
    signature), without sending it."""
    try:
        signer.get_object(**params)
    except _Signed as signed:
        return signed.url, signed.headers
    raise AssertionError("botocore sent a GetObject request chute meant to send itself")


def get_kwargs(storage_options: dict[str, Any]) -> dict[str, Any]:
    """What every GET carries besides bucket, key and range (as s3fs's ``req_kw``)."""
    extra = dict(storage_options.get("s3_additional_kwargs") or {})
    if storage_options.get("requester_pays"):
        extra["RequestPayer"] = "requester"
    return extra


def params(bucket: str, key: str, version: str | None, extra: dict[str, Any]) -> dict[str, Any]:
    """GetObject's parameters for ``bucket/key`` (at ``version``) with the dataset's ``extra`` ones."""
    kw = dict(extra, Bucket=bucket, Key=key)
    if version:
        kw["VersionId"] = version
    return kw


def get(client: Any, kw: dict[str, Any], start: int | None, length: int | None,
        sink: Callable[[int, list[bytes]], None], *, limit: int, floor: Floor, url: str,
        cancelled: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], Callable[[], None]]) -> int:
    """botocore's own GET of ``length`` bytes from ``start`` (None: the whole object; ``kw``: GetObject's
    parameters) into ``sink(offset, chunks)``, in this thread; the bytes received, at most ``limit``.
    Raises as :func:`chute.storage.net.stream.get`, with botocore's CRC check at the end."""
    from botocore.exceptions import ClientError, ReadTimeoutError

    kw = dict(kw)
    if start is not None:
        length = max(length or 0, 1)
        limit = min(limit, length)
        kw["Range"] = f"bytes={start}-{start + length - 1}"
    if cancelled():
        raise Interrupted(url)
    try:
        response = client.get_object(**kw)
    except ClientError as exc:
        mapped = _as_os_error(exc, url)
        if mapped is None:
            raise
        raise mapped from exc
    body = response["Body"]
    try:
        if start is not None:
            if response["ResponseMetadata"]["HTTPStatusCode"] != 206:
                raise RangeIgnored(url)
            check_range(response.get("ContentRange"), start, length, url)  # type: ignore[arg-type]
        check_length(str(response.get("ContentLength", "")), limit)
        receiver = Receiver(sink, start or 0, floor, limit)
        while True:
            if cancelled():
                raise Interrupted(url)
            try:
                chunk = body.read(BOTOCORE_READ)  # at the end, botocore checks the object's stored CRC
            except ReadTimeoutError:
                if floor.active:  # the read timeout is the floor's window
                    raise SlowTransfer(f"no bytes for {floor.window:g} s, below the floor speed of {floor.rate:,} bytes/s") from None
                raise
            receiver.add(chunk)
            if not chunk:
                return receiver.received
    finally:
        body.close()  # unread bytes left: the connection is dropped, not returned to the pool


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
