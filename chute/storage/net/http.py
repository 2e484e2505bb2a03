"""HTTP GETs on urllib3, read in the thread that asks: no event loop in between.

    urllib3 connection (chute/storage/net/pools.py) ──(read1: one recv, up to 1 MiB)──► the calling thread:
                                                                                      writes them, watches the rate

Each download thread reads its own response (``read1``: whatever has arrived,
up to 1 MiB, without the GIL) and writes it where it goes; connections are kept
alive in the process's pools (one manager per process, a ProxyManager where the
environment names a proxy: chute/storage/net/pools.py). Chute's HTTP downloads
take this path when the dataset's ``storage_options`` are ones it understands
(:func:`applies`: none, or ``headers``); others (aiohttp's ``client_kwargs``,
authentication objects) keep fsspec's path, and so does
``CHUTE_HTTP_CLIENT=fsspec``. S3 GETs come here too, as presigned or
botocore-signed requests (chute/storage/net/s3.py).

What comes back is bounded and checked before it is written:

* a body never passes ``limit`` (the manifest's size of the object, or the
  range's length): a ``Content-Length`` above it fails before any byte is read,
  and the first byte past it ends the transfer (:class:`~chute.storage.net.stream.TooLong`,
  retried like a cut body), with or without a ``Content-Length``;
* a 206 must carry exactly the range asked for (``Content-Range``), and a 200
  to a range request says the server ignores ranges;
* redirects (up to 5) follow urllib3's rules for credentials: ``Authorization``,
  ``Cookie`` and ``Proxy-Authorization`` are dropped once a hop leaves the
  origin (scheme, host, port) of the first URL, and an https URL is never
  followed to http (:class:`UnsafeRedirect`).

And what the fsspec path guarantees holds too: the floor speed (a read returns
whatever has arrived, so the rate is checked as bytes come; a connection that
sends nothing times out after the floor's window, or after 60 s without a
floor), cancellation at once (the socket is shut down under the blocked read,
whether it waits for the status line or for the body), a body cut short is an
error (urllib3's ``IncompleteRead``, retried), a missing object is
``FileNotFoundError``, a forbidden one ``PermissionError``, and any other status
an :class:`HTTPStatusError` whose ``status`` decides whether it is retried. A
kept connection the server closed meanwhile is reopened once at once (not a
retry: nothing was received).
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from chute.storage.net.pools import Watch, origin, pools
from chute.storage.net.stream import (
    READ_SIZE,
    Floor,
    Interrupted,
    RangeIgnored,
    Receiver,
    SlowTransfer,
    check_length,
    check_range,
)

#: Seconds to connect, and to wait for a byte when no floor speed is set (as chute's aiohttp timeouts).
CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 60.0
MAX_REDIRECTS = 5
#: Most bytes of an error or redirect body read (to keep its connection); a longer one closes it.
SMALL_BODY = 1 << 16
#: The headers that never go to another origin (urllib3's ``Retry.DEFAULT_REMOVE_HEADERS_ON_REDIRECT``).
CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization"})


class HTTPStatusError(OSError):
    """The server answered with an error status (``status``); 5xx, 408 and 429 are retried."""

    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"{url}: HTTP {status} {reason}".rstrip())
        self.status = status


class UnsafeRedirect(Exception):
    """A redirect from https to http: not followed (the request's credentials and the bytes would travel
    in the clear). Not retried."""


def applies(storage_options: Mapping[str, Any]) -> bool:
    """Whether this path serves a dataset opened with ``storage_options`` (else: fsspec's)."""
    if os.environ.get("CHUTE_HTTP_CLIENT", "").lower() == "fsspec":
        return False
    return set(storage_options) <= {"headers"}


@dataclasses.dataclass(frozen=True)
class Client:
    """What a dataset's GETs carry: its ``headers``, what HTTPS checks (``verify``: True for the system's
    certificates, False for none, or a CA bundle's path) and its ``proxies`` (None: the environment's;
    else a mapping as :func:`chute.storage.net.pools.proxy_for` takes). The connections are the process's
    (chute/storage/net/pools.py)."""

    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    verify: bool | str = True
    proxies: Mapping[str, str] | None = None

    def get(self, url: str, start: int | None, length: int | None, sink: Callable[[int, list[bytes]], None], *,
            limit: int, floor: Floor, cancelled: Callable[[], bool],
            on_cancel: Callable[[Callable[[], None]], Callable[[], None]], label: str | None = None,
            headers: Mapping[str, str] | None = None) -> int:
        """GET ``length`` bytes of ``url`` from ``start`` (None: the whole object) into ``sink(offset, chunks)``,
        in this thread; the bytes received, at most ``limit``. ``headers`` are sent besides the client's (a
        signed S3 request's). Raises as :func:`chute.storage.net.stream.get`. Errors name ``label``
        (default: the URL; a presigned URL's signature stays out of messages and logs)."""
        name = label or url
        sent = {**self.headers, **(headers or {})}
        if start is not None:
            length = max(length or 0, 1)
            limit = min(limit, length)
            sent["Range"] = f"bytes={start}-{start + length - 1}"
        first = origin(url)
        target = url
        for hop in range(MAX_REDIRECTS + 1):
            if cancelled():
                raise Interrupted(name)
            response, watch = self._request(target, sent, floor, cancelled, on_cancel, name)
            location = response.get_redirect_location()
            if not location:
                break
            _finish(response)
            if hop == MAX_REDIRECTS:
                raise HTTPStatusError(response.status, f"more than {MAX_REDIRECTS} redirects", name)
            following = urllib.parse.urljoin(target, location)
            if urllib.parse.urlsplit(target).scheme == "https" and urllib.parse.urlsplit(following).scheme != "https":
                there = urllib.parse.urlsplit(following)
                raise UnsafeRedirect(f"{name}: the server redirects to {there.scheme}://{there.netloc}, from https to "
                                     "http; chute does not follow it (credentials and data would travel in the clear)")
            if origin(following) != first:  # once dropped, credentials stay dropped for the later hops
                sent = {k: v for k, v in sent.items() if k.lower() not in CREDENTIALS}
            target = following
        status = response.status
        try:
            if status >= 400:
                _finish(response)
                if status == 404:
                    raise FileNotFoundError(name)
                if status == 403:
                    raise PermissionError(f"{name}: HTTP 403 {response.reason}")
                raise HTTPStatusError(status, response.reason or "", name)
            if start is not None and status != 206:
                raise RangeIgnored(name)
            if start is not None:
                check_range(response.headers.get("Content-Range"), start, length, name)  # type: ignore[arg-type]
            check_length(response.headers.get("Content-Length"), limit)
        except BaseException:
            _drop(response)
            raise
        return _body(response, watch, start or 0, limit, sink, floor, name, cancelled, on_cancel)

    def _request(self, url: str, headers: dict[str, str], floor: Floor, cancelled: Callable[[], bool],
                 on_cancel: Callable[[Callable[[], None]], Callable[[], None]], name: str) -> tuple[Any, Watch]:
        """Send the GET and read the status line and headers; a kept connection the server closed is reopened once."""
        import urllib3

        process = pools()
        manager = process.manager(url, self.verify, self.proxies)
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=floor.window if floor.active else READ_TIMEOUT)
        for attempt in range(2):
            with process.watching() as watch:
                remove = on_cancel(watch.shut)
                try:
                    response = manager.urlopen("GET", url, headers=headers, redirect=False, retries=False,
                                               preload_content=False, decode_content=False, timeout=timeout)
                    return response, watch
                except BaseException as exc:
                    if cancelled():
                        raise Interrupted(name) from None
                    if isinstance(exc, urllib3.exceptions.ReadTimeoutError) and floor.active:
                        raise SlowTransfer(f"no response for {floor.window:g} s, below the floor speed of "
                                           f"{floor.rate:,} bytes/s") from None
                    if attempt or not watch.reused or not _dropped(exc):
                        raise
                finally:
                    remove()
        raise AssertionError("unreachable")


def _dropped(exc: BaseException) -> bool:
    """Whether ``exc`` says the server had closed a kept connection before the request reached it."""
    import http.client

    import urllib3

    if not isinstance(exc, urllib3.exceptions.ProtocolError):
        return False
    cause = exc.args[1] if len(exc.args) > 1 else exc.__context__
    return isinstance(cause, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError))


def _body(response: Any, watch: Watch, offset: int, limit: int, sink: Callable[[int, list[bytes]], None], floor: Floor,
          name: str, cancelled: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], Callable[[], None]]) -> int:
    """Read the body into ``sink`` in batches of chunks, checking the floor speed and ``limit``; the bytes received."""
    import urllib3

    remove = on_cancel(watch.shut)
    receiver = Receiver(sink, offset, floor, limit)
    done = False
    try:
        while True:
            if cancelled():
                raise Interrupted(name)
            try:
                chunk = response.read1(READ_SIZE, decode_content=False)
            except Exception as exc:
                if cancelled():  # the socket was shut under the read
                    raise Interrupted(name) from None
                if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
                    if floor.active:
                        raise SlowTransfer(f"no bytes for {floor.window:g} s, below the floor speed of "
                                           f"{floor.rate:,} bytes/s") from None
                    raise TimeoutError(f"{name}: no bytes for {READ_TIMEOUT:g} s") from None
                raise
            if not chunk and cancelled():
                raise Interrupted(name)
            receiver.add(chunk)
            if not chunk:
                done = True
                return receiver.received
    finally:
        remove()
        if done:
            response.release_conn()  # read to its end: the connection is kept for the next request
        else:
            _drop(response)


def _finish(response: Any) -> None:
    """Read a small response (an error or a redirect) to its end and keep the connection if it can be."""
    try:
        response.read(SMALL_BODY, decode_content=False)
    except Exception:  # noqa: BLE001 - its connection is dropped; the status decides what happens
        _drop(response)
        return
    if response.isclosed():
        response.release_conn()
    else:
        _drop(response)  # longer than a small body: not read on


def _drop(response: Any) -> None:
    """Close the response's connection (unread bytes may be left on it) and hand the closed one back."""
    response.close()
    response.release_conn()


__all__ = ["Client", "HTTPStatusError", "UnsafeRedirect", "applies"]
