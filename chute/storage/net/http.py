"""HTTP GETs on the standard library's client, in the thread that asks: no event loop in between.

    http.client connection ──(one recv per read1, up to 1 MiB)──► the calling thread: writes them, watches the rate

The fsspec path (chute/storage/net/stream.py) runs every request of a process on
fsspec's one event-loop thread, where aiohttp hands a body over in pieces of
the socket's reads, each several Python calls holding the GIL: on this
project's 2-core machine that loop thread was a whole core at 1 GB/s, and a
cold epoch's gather and bookkeeping competed with it for the GIL. Here each
download thread reads its own connection (``read1``: one ``recv`` of whatever
has arrived, up to 1 MiB, without the GIL), as chute/storage/net/s3.py does for
S3. Chute's downloads take this path when the dataset's ``storage_options``
are ones it understands (:func:`applies`: none, or ``headers``); others
(``client_kwargs`` for aiohttp, authentication objects) keep the fsspec path,
and so does ``CHUTE_HTTP_CLIENT=fsspec``.

What the fsspec path guarantees holds here too: the floor speed (a read returns
whatever has arrived, so the rate is checked as bytes come; a connection that
sends nothing times out after the floor's window, or after 60 s without a
floor, as chute's aiohttp timeout), cancellation at once (the socket is shut
down under the blocked read), a body cut short is an error (``IncompleteRead``,
retried), a missing object is ``FileNotFoundError``, a forbidden one
``PermissionError``, and any other status an :class:`HTTPStatusError` whose
``status`` decides whether it is retried. Redirects are followed (up to 5).
Connections are kept alive per thread and host; a kept connection the server
closed meanwhile is reopened once at once (not a retry: nothing was received).
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import threading
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any

from chute.storage.net.stream import READ_SIZE, Floor, Interrupted, RangeIgnored, Receiver, SlowTransfer

#: Seconds to connect, and to wait for a byte when no floor speed is set (as chute's aiohttp timeouts).
CONNECT_TIMEOUT = 30.0
READ_TIMEOUT = 60.0
MAX_REDIRECTS = 5


class HTTPStatusError(OSError):
    """The server answered with an error status (``status``); 5xx, 408 and 429 are retried."""

    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"{url}: HTTP {status} {reason}".rstrip())
        self.status = status


def applies(storage_options: dict[str, Any]) -> bool:
    """Whether this path serves a dataset opened with ``storage_options`` (else: fsspec's)."""
    if os.environ.get("CHUTE_HTTP_CLIENT", "").lower() == "fsspec":
        return False
    return set(storage_options) <= {"headers"}


class _Kept(dict):
    """One thread's kept connections by ``(scheme, netloc)``, closed when the thread ends (its
    thread-local storage goes): download threads come and go with each pass."""

    def __del__(self) -> None:
        for conn in self.values():
            conn.close()


class Connections:
    """Keep-alive connections, one per thread and ``(scheme, host, port)``; :meth:`close` closes all,
    and a thread's kept ones are closed when the thread ends.

    ``verify`` (HTTPS): True (the system's certificates), False (none checked), or a CA bundle's path."""

    def __init__(self, headers: dict[str, str] | None = None, verify: bool | str = True) -> None:
        self.headers = dict(headers or {})
        self.verify = verify
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()  # open, in use or kept
        self._ssl: ssl.SSLContext | None = None

    def take(self, scheme: str, netloc: str) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection to ``netloc`` and whether it was used before (kept alive)."""
        kept: _Kept = self._local.__dict__.setdefault("kept", _Kept())
        conn = kept.pop((scheme, netloc), None)
        if conn is not None:
            return conn, True
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context(cafile=self.verify if isinstance(self.verify, str) else None)
                if self.verify is False:
                    self._ssl.check_hostname = False
                    self._ssl.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(netloc, timeout=CONNECT_TIMEOUT, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(netloc, timeout=CONNECT_TIMEOUT)
        with self._lock:
            self._all.add(conn)
        return conn, False

    def give_back(self, scheme: str, netloc: str, conn: http.client.HTTPConnection) -> None:
        """Keep ``conn`` for this thread's next request to ``netloc`` (its response was read to the end)."""
        self._local.__dict__.setdefault("kept", _Kept())[(scheme, netloc)] = conn

    def drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            self._all.discard(conn)

    def close(self) -> None:
        with self._lock:
            conns = list(self._all)
            self._all.clear()
        for conn in conns:
            conn.close()


def get(connections: Connections, url: str, start: int | None, length: int | None,
        sink: Callable[[int, list[bytes]], None], *, floor: Floor, cancelled: Callable[[], bool],
        on_cancel: Callable[[Callable[[], None]], Callable[[], None]], label: str | None = None) -> int:
    """GET ``length`` bytes of ``url`` from ``start`` (None: the whole object) into ``sink(offset, chunks)``,
    in this thread; the bytes received. Raises as :func:`chute.storage.net.stream.get`. Errors name ``label``
    (default: the URL; a presigned URL's signature stays out of messages and logs)."""
    target, url = url, label or url
    headers = dict(connections.headers)
    if start is not None:
        headers["Range"] = f"bytes={start}-{start + max(length or 0, 1) - 1}"
    for _ in range(MAX_REDIRECTS + 1):
        if cancelled():
            raise Interrupted(url)
        parts = urllib.parse.urlsplit(target)
        conn, response = _request(connections, parts, headers, url, floor, cancelled, on_cancel)
        if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
            target = urllib.parse.urljoin(target, response.getheader("Location", ""))
            _finish(connections, parts, conn, response)
            continue
        break
    else:
        connections.drop(conn)
        raise HTTPStatusError(response.status, f"more than {MAX_REDIRECTS} redirects", url)
    if response.status >= 400:
        _finish(connections, parts, conn, response)
        if response.status == 404:
            raise FileNotFoundError(url)
        if response.status == 403:
            raise PermissionError(f"{url}: HTTP 403 {response.reason}")
        raise HTTPStatusError(response.status, response.reason, url)
    if start is not None and response.status != 206:
        connections.drop(conn)
        raise RangeIgnored(url)
    return _body(connections, parts, conn, response, start or 0, sink, floor, url, cancelled, on_cancel)


def _request(connections: Connections, parts: urllib.parse.SplitResult, headers: dict[str, str], url: str,
             floor: Floor, cancelled: Callable[[], bool],
             on_cancel: Callable[[Callable[[], None]], Callable[[], None]]) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Send the GET and read the status line and headers; a kept connection the server closed is reopened once."""
    path = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")  # as a browser sends it; %XX kept
    if parts.query:
        path += "?" + parts.query
    for attempt in range(2):
        conn, kept = connections.take(parts.scheme, parts.netloc)
        remove = on_cancel(lambda conn=conn: _shut(conn))  # type: ignore[misc]
        try:
            conn.request("GET", path, headers=headers)
            if conn.sock is not None:
                conn.sock.settimeout(floor.window if floor.active else READ_TIMEOUT)
            return conn, conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            connections.drop(conn)
            if cancelled():
                raise Interrupted(url) from None
            if not kept or attempt:
                raise ConnectionError(f"{url}: {exc or type(exc).__name__}") from exc
        except BaseException as exc:
            connections.drop(conn)
            if cancelled():
                raise Interrupted(url) from None
            if isinstance(exc, (socket.timeout, TimeoutError)) and floor.active:
                raise SlowTransfer(f"no response for {floor.window:g} s, below the floor speed of {floor.rate:,} bytes/s") from None
            raise
        finally:
            remove()
    raise AssertionError("unreachable")


def _body(connections: Connections, parts: urllib.parse.SplitResult, conn: http.client.HTTPConnection,
          response: http.client.HTTPResponse, offset: int, sink: Callable[[int, list[bytes]], None], floor: Floor,
          url: str, cancelled: Callable[[], bool], on_cancel: Callable[[Callable[[], None]], Callable[[], None]]) -> int:
    """Read the body into ``sink`` in batches of chunks, checking the floor speed; the bytes received."""
    remove = on_cancel(lambda: _shut(conn))
    receiver = Receiver(sink, offset, floor)
    done = False
    try:
        while True:
            if cancelled():
                raise Interrupted(url)
            try:
                chunk = response.read1(READ_SIZE)
            except Exception as exc:
                if cancelled():  # the socket was shut under the read
                    raise Interrupted(url) from None
                if isinstance(exc, (socket.timeout, TimeoutError)):
                    if floor.active:
                        raise SlowTransfer(f"no bytes for {floor.window:g} s, below the floor speed of {floor.rate:,} bytes/s") from None
                    raise TimeoutError(f"{url}: no bytes for {READ_TIMEOUT:g} s") from None
                raise
            if not chunk and cancelled():
                raise Interrupted(url)
            if not chunk and response.length:  # the connection ended before Content-Length's bytes
                raise http.client.IncompleteRead(b"", response.length)
            receiver.add(chunk)
            if not chunk:
                response.close()  # read1 leaves a complete response open; the connection stays usable
                done = True
                return receiver.received
    finally:
        remove()
        if done and not response.will_close:
            connections.give_back(parts.scheme, parts.netloc, conn)
        else:
            connections.drop(conn)  # unread bytes left, or the server closes it: not kept


def _finish(connections: Connections, parts: urllib.parse.SplitResult, conn: http.client.HTTPConnection,
            response: http.client.HTTPResponse) -> None:
    """Read a small response (an error or a redirect) to its end and keep the connection if it can be."""
    try:
        response.read(1 << 16)
    except (OSError, http.client.HTTPException):
        connections.drop(conn)
        return
    if response.isclosed() and not response.will_close:
        connections.give_back(parts.scheme, parts.netloc, conn)
    else:
        connections.drop(conn)


def _shut(conn: http.client.HTTPConnection) -> None:
    """Wake a read blocked on ``conn``'s socket from another thread (closing alone does not)."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


__all__ = ["Connections", "HTTPStatusError", "applies", "get"]
