"""Real servers on 127.0.0.1 for chute's remote-storage tests and benchmarks.

The servers, the first two usable in-process or in a child process:

- ``FaultyHTTPServer``: a read-only HTTP/1.1 file server (GET, HEAD, single byte
  ranges, keep-alive; https with ``tls=``) whose faults can be switched on while
  it runs: error statuses, throttling with Retry-After, truncated and corrupted
  bodies, requests that hang until released, redirects to another server,
  bodies longer than asked for (no Content-Length, a false one, a 206 past or
  beside its range), servers that stop and come back on the same port.
  Given ``upstream=`` instead of a root, it is a reverse proxy with the same
  faults in front of another server (moto's S3), so S3 clients can be tested
  against outages too. Every request is logged, with its headers, when its
  answer began and ended, and whether its whole body went out.
- ``ForwardProxy``: a forward proxy (absolute-URI GETs, CONNECT tunnels) that
  logs what it carried, for ``HTTP_PROXY``/``HTTPS_PROXY``; ``tls_files`` and
  ``server_tls`` make a test certificate authority and a server certificate
  (a client trusts it with ``SSL_CERT_FILE``).
- ``MotoS3Server``: moto's S3 in a child process (its state lives in memory:
  restarting it loses every bucket; to simulate an outage, put a
  ``FaultyHTTPServer(upstream=moto.endpoint_url)`` in front and stop that).

Benchmarks run the servers in a child process so that they do not share the
GIL with the loader being measured::

    python -m tests.servers http ROOT [--port N]    # prints http://127.0.0.1:N/
    python -m tests.servers s3 [--port N]           # prints http://127.0.0.1:N

``HTTPServerProcess`` and ``MotoS3Server`` start those commands and stop them.

S3 clients reach moto with ``s3_storage_options(endpoint_url)`` (s3fs keyword
arguments) or ``s3_client_env(endpoint_url)`` (environment variables that
botocore, aiobotocore and so s3fs read). Both set dummy credentials and the
region, and turn off the EC2 metadata lookup, so nothing tries to reach AWS.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import email.utils
import http.client
import os
import random
import re
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
S3_REGION = "us-east-1"
S3_KEY = "testing"
S3_SECRET = "testing"

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)


class ServerStartError(RuntimeError):
    """A test server did not come up in time, or its process exited first."""


class LoggedRequest(NamedTuple):
    """One request as the server saw it; ``status`` is 0 when it was never answered.

    ``headers`` are the request's; ``start`` and ``end`` (``time.monotonic()``) when the answer
    began and when its body was sent or given up; ``complete`` whether the whole body went out
    (False while it is being sent, and for a body cut short: a client that went away, a fault)."""

    method: str
    path: str
    range: str | None
    status: int
    headers: tuple[tuple[str, str], ...] = ()
    start: float = 0.0
    end: float = 0.0
    complete: bool = False

    def header(self, name: str) -> str | None:
        """The request header ``name`` (any case), or None."""
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def s3_storage_options(endpoint_url: str) -> dict[str, Any]:
    """s3fs keyword arguments that reach the S3 server at ``endpoint_url``.

    ``endpoint_url`` is a top-level s3fs argument (``client_kwargs={"endpoint_url":
    ...}`` works too); the region is set so botocore never looks it up.
    """
    return {
        "key": S3_KEY,
        "secret": S3_SECRET,
        "endpoint_url": endpoint_url,
        "client_kwargs": {"region_name": S3_REGION},
    }


def s3_client_env(endpoint_url: str) -> dict[str, str]:
    """Environment variables that send every botocore/s3fs client to ``endpoint_url``.

    ``AWS_ENDPOINT_URL`` is read by botocore >= 1.31 (and so by aiobotocore and
    s3fs). The config files point nowhere so a developer's own AWS profile cannot
    leak in, and the EC2 metadata lookup (a network call) is disabled.
    """
    return {
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": S3_REGION,
        "AWS_REGION": S3_REGION,
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


# ----------------------------------------------------------------------------
# Faults
# ----------------------------------------------------------------------------


@dataclass
class _Fault:
    """One fault rule. ``fires`` is called under the owning ``Faults`` lock."""

    action: str  # "status", "truncate", "corrupt", "hang", "trickle", "redirect", "oversend"
    pattern: re.Pattern[str] | None = None
    method: str | None = None
    status: int = 500
    every: int = 1
    fraction: float | None = None
    rng: random.Random | None = None
    times: int | None = None  # firings left; None: unlimited
    retry_after: int | None = None
    interval: float = 0.0  # "trickle": seconds between the body's bytes
    to: str = ""  # "redirect": the base URL the request's path is sent to
    extra: int = 0  # "oversend": bytes sent past the body
    how: str = ""  # "oversend": "no-length", "huge-length", "long-range", "wrong-range" (see FaultyHTTPServer.oversend)
    matched: int = 0

    def fires(self, method: str, path: str) -> bool:
        if self.times == 0:
            return False
        if self.method is not None and method != self.method:
            return False
        if self.pattern is not None and not self.pattern.search(path):
            return False
        self.matched += 1
        if self.fraction is not None:
            assert self.rng is not None
            hit = self.rng.random() < self.fraction
        else:
            hit = self.matched % self.every == 0
        if hit and self.times is not None:
            self.times -= 1
        return hit


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    return None if pattern is None else re.compile(pattern)


class Faults:
    """The fault rules of one server, thread-safe and changeable while it serves.

    A pattern is a regular expression searched in the request path (including
    any query string); a plain substring such as ``"shard-00001"`` works. Rules
    are consulted in the order they were added and the first that fires decides
    the request's fate; rules after it do not count that request.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rules: list[_Fault] = []
        self._ignore_range: list[re.Pattern[str] | None] = []
        self._gate = 0  # bumped by release() and by a server stop, waking hung requests
        self._hung = 0

    def add(self, fault: _Fault) -> None:
        with self._cond:
            self._rules.append(fault)

    def add_ignore_range(self, pattern: str | None) -> None:
        with self._cond:
            self._ignore_range.append(_compile(pattern))

    def decide(self, method: str, path: str) -> _Fault | None:
        """The fault this request gets, if any (consuming one firing of it)."""
        with self._cond:
            for rule in self._rules:
                if rule.fires(method, path):
                    return rule
        return None

    def ignores_range(self, path: str) -> bool:
        with self._cond:
            return any(p is None or p.search(path) for p in self._ignore_range)

    def wait_released(self) -> None:
        """Block a hung request until ``release()`` or a server stop."""
        with self._cond:
            gate = self._gate
            self._hung += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._gate != gate)
            finally:
                self._hung -= 1
                self._cond.notify_all()

    def wait_hung(self, n: int, timeout: float) -> bool:
        """Wait until at least ``n`` requests are hung; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._hung >= n, timeout)

    @property
    def hung(self) -> int:
        with self._cond:
            return self._hung

    def release(self) -> None:
        """Let hung requests be answered and remove the hang rules."""
        with self._cond:
            self._rules = [r for r in self._rules if r.action != "hang"]
            self.wake()

    def wake(self) -> None:
        """Wake every hung request (they then check whether the server still runs)."""
        with self._cond:
            self._gate += 1
            self._cond.notify_all()

    def reset(self) -> None:
        with self._cond:
            self._rules.clear()
            self._ignore_range.clear()
            self.wake()


class RequestLog:
    """Every request a server answered (or dropped), and the body bytes it sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[LoggedRequest] = []
        self._bytes_sent = 0

    def add(self, entry: LoggedRequest) -> int:
        """Log ``entry``; its index, for :meth:`finish`."""
        with self._lock:
            self._entries.append(entry)
            return len(self._entries) - 1

    def finish(self, index: int, complete: bool) -> None:
        """The body of request ``index`` went out whole (``complete``) or was given up, now."""
        with self._lock:
            if index < len(self._entries):
                self._entries[index] = self._entries[index]._replace(end=time.monotonic(), complete=complete)

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes_sent += n

    @property
    def entries(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._entries)

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return self._bytes_sent

    def count(self, pattern: str | None = None, method: str | None = "GET", status: int | None = None) -> int:
        rx = _compile(pattern)
        return sum(
            1
            for e in self.entries
            if (method is None or e.method == method)
            and (status is None or e.status == status)
            and (rx is None or rx.search(e.path))
        )

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes_sent = 0


# ----------------------------------------------------------------------------
# Replies: what a backend produces, before faults are applied
# ----------------------------------------------------------------------------


@dataclass
class _Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes | None = None  # in-memory body (proxy, errors)
    file: Path | None = None  # or a slice of a file, sent with sendfile
    offset: int = 0
    length: int = 0

    @property
    def body_length(self) -> int:
        return len(self.body) if self.body is not None else self.length


def _error_reply(status: int, message: str, extra: list[tuple[str, str]] = ()) -> _Reply:  # type: ignore[assignment]
    """An error in S3's XML shape, so that botocore parses it like a real one."""
    code = {500: "InternalError", 503: "SlowDown", 404: "NoSuchKey", 416: "InvalidRange"}.get(status, "Error")
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message></Error>\n"
    ).encode()
    headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body))), *extra]
    return _Reply(status, headers, body=body)


class _Unsatisfiable(Exception):
    pass


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` of a single ``bytes=`` range within ``size`` bytes.

    None means "send the whole object" (no header, several ranges, or a header
    that does not parse: RFC 9110 says to ignore those). Raises
    ``_Unsatisfiable`` for a range that starts past the end.
    """
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (not m[1] and not m[2]):
        return None
    if not m[1]:  # suffix: the last N bytes
        n = int(m[2])
        if n == 0 or size == 0:
            raise _Unsatisfiable
        return max(0, size - n), size
    start = int(m[1])
    if m[2] and int(m[2]) < start:
        return None
    if start >= size:
        raise _Unsatisfiable
    stop = size if not m[2] else min(int(m[2]) + 1, size)
    return start, stop


class _FileBackend:
    """Serves the files under ``root``, read-only."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def reply(self, handler: _Handler, method: str, ignore_range: bool) -> _Reply:
        if method not in ("GET", "HEAD"):
            return _error_reply(405, f"{method} not allowed: this server is read-only", [("Allow", "GET, HEAD")])
        rel = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path).lstrip("/")
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            return _error_reply(404, f"not found: /{rel}")
        st = path.stat()
        size = st.st_size
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("Accept-Ranges", "bytes"),
            ("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True)),
            ("ETag", f'"{st.st_mtime_ns:x}-{size:x}"'),
        ]
        header = None if ignore_range else handler.headers.get("Range")
        try:
            rng = parse_range(header, size)
        except _Unsatisfiable:
            return _error_reply(416, f"range {header} outside /{rel} ({size} bytes)", [("Content-Range", f"bytes */{size}")])
        if rng is None:
            return _Reply(200, headers + [("Content-Length", str(size))], file=path, offset=0, length=size)
        start, stop = rng
        headers += [("Content-Length", str(stop - start)), ("Content-Range", f"bytes {start}-{stop - 1}/{size}")]
        return _Reply(206, headers, file=path, offset=start, length=stop - start)


class _ProxyBackend:
    """Forwards each request to ``upstream`` (one upstream connection per client connection)."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream!r}")
        self.host = parts.hostname
        self.port = parts.port or 80

    def reply(self, handler: _Handler, method: str, ignore_range: bool) -> _Reply:
        body = handler.read_request_body()
        headers = {
            k: v
            for k, v in handler.headers.items()
            if k.lower() not in _HOP_BY_HOP and not (ignore_range and k.lower() == "range")
        }
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn = handler.upstream_connection(self.host, self.port)
        try:
            conn.request(method, handler.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            handler.drop_upstream_connection()
            return _error_reply(502, f"upstream {self.host}:{self.port} failed: {exc!r}")
        out = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        length = resp.getheader("Content-Length") if method == "HEAD" else None
        out.append(("Content-Length", length if length is not None else str(len(data))))
        return _Reply(resp.status, out, body=data)


# ----------------------------------------------------------------------------
# The request handler
# ----------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """One client connection: HTTP/1.1 keep-alive, faults applied to each request."""

    protocol_version = "HTTP/1.1"
    timeout = 60  # an idle keep-alive connection is closed after this
    server: FaultyHTTPServer  # type: ignore[assignment]
    _upstream: http.client.HTTPConnection | None = None

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the server keeps its own log; stderr stays quiet

    def finish(self) -> None:
        super().finish()
        self.drop_upstream_connection()

    # -- helpers used by the backends --

    def read_request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def upstream_connection(self, host: str, port: int) -> http.client.HTTPConnection:
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(host, port, timeout=60)
        return self._upstream

    def drop_upstream_connection(self) -> None:
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None

    # -- the request --

    def _serve(self, method: str) -> None:
        srv = self.server
        headers = tuple(self.headers.items())
        fault = srv.faults.decide(method, self.path)
        if fault is not None and fault.action == "hang":
            srv.faults.wait_released()
            if not srv.serving:
                srv.log.add(LoggedRequest(method, self.path, self.headers.get("Range"), 0, headers, time.monotonic(), time.monotonic()))
                self.close_connection = True
                return
            fault = None
        if fault is not None and fault.action == "status":
            extra = [("Retry-After", str(fault.retry_after))] if fault.retry_after is not None else []
            if method not in ("GET", "HEAD"):
                self.read_request_body()
            reply = _error_reply(fault.status, f"fault injected by the test server ({fault.status})", extra)
            fault = None
        elif fault is not None and fault.action == "redirect":
            location = fault.to.rstrip("/") + self.path
            reply = _Reply(fault.status, [("Location", location), ("Content-Length", "0")], body=b"")
            fault = None
        else:
            reply = srv.backend.reply(self, method, srv.faults.ignores_range(self.path))
            if reply.status == 405:
                self.close_connection = True
        if fault is not None and fault.action == "oversend":
            reply = self._oversized(reply, fault)
        index = srv.log.add(LoggedRequest(method, self.path, self.headers.get("Range"), reply.status, headers, time.monotonic()))
        complete = False
        try:
            self.send_response(reply.status)
            for key, value in reply.headers:
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            complete = method == "HEAD" or self._send_body(reply, fault)
        finally:
            srv.log.finish(index, complete)

    def _oversized(self, reply: _Reply, fault: _Fault) -> _Reply:
        """The headers an over-sending fault announces (its body is the file's, then ``fault.extra`` bytes)."""
        if reply.status >= 300:
            return reply
        n = reply.body_length
        kept = [(k, v) for k, v in reply.headers if k.lower() != "content-length"]
        if fault.how == "no-length":  # the body ends when the connection does
            self.close_connection = True
            return dataclasses.replace(reply, headers=kept)
        if fault.how == "wrong-range" and reply.status == 206:  # the length asked for, other bytes
            shifted = [(k, v) for k, v in kept if k.lower() != "content-range"]
            start = reply.offset + 1
            shifted += [("Content-Range", f"bytes {start}-{start + n - 1}/*"), ("Content-Length", str(n))]
            return dataclasses.replace(reply, headers=shifted)
        return dataclasses.replace(reply, headers=kept + [("Content-Length", str(n + fault.extra))])

    def _send_body(self, reply: _Reply, fault: _Fault | None) -> bool:
        """Send the body (as the fault says); whether all of it went out."""
        n = reply.body_length
        if fault is not None and fault.action == "truncate":
            self._send_span(reply, 0, n // 2)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # the client sees EOF mid-body
            return False
        if fault is not None and fault.action == "trickle":
            for k in range(n):  # one byte at a time: slow, never silent (no read timeout fires)
                if not self.server.serving:
                    return False
                self._send_span(reply, k, k + 1)
                time.sleep(fault.interval)
            self.close_connection = True
            return True
        if fault is not None and fault.action == "corrupt" and n > 0:
            k = n // 2
            self._send_span(reply, 0, k)
            flipped = bytes([self._byte_at(reply, k) ^ 0xFF])
            self.server.log.add_bytes(1)
            self.connection.sendall(flipped)
            self._send_span(reply, k + 1, n)
            return True
        self._send_span(reply, 0, n)
        if fault is not None and fault.action == "oversend" and reply.status < 300 and fault.how != "wrong-range":
            junk = bytes(1 << 20)
            left = fault.extra
            while left > 0:  # until the client hangs up (it must, at the first byte too many)
                piece = memoryview(junk)[: min(left, len(junk))]
                self.server.log.add_bytes(len(piece))
                self.connection.sendall(piece)
                left -= len(piece)
            self.close_connection = True
        return True

    def _send_span(self, reply: _Reply, start: int, stop: int) -> None:
        if stop <= start:
            return
        self.server.log.add_bytes(stop - start)  # counted before sending: a client never sees more than counted
        if reply.body is not None:
            self.connection.sendall(memoryview(reply.body)[start:stop])
            return
        assert reply.file is not None
        with open(reply.file, "rb") as f:
            self.connection.sendfile(f, reply.offset + start, stop - start)

    @staticmethod
    def _byte_at(reply: _Reply, k: int) -> int:
        if reply.body is not None:
            return reply.body[k]
        assert reply.file is not None
        with open(reply.file, "rb") as f:
            f.seek(reply.offset + k)
            return f.read(1)[0]


# ----------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------


class FaultyHTTPServer:
    """A real HTTP server on 127.0.0.1 whose faults tests switch on and off.

    Serves the files under ``root`` (GET, HEAD, one ``Range: bytes=a-b`` per
    request with 206/416, keep-alive), or, with ``upstream="http://host:port"``,
    forwards every request there (a fault-injecting reverse proxy; use it in
    front of moto's S3). One thread per connection; ``stop()`` closes the
    listening socket and every live connection, ends hung requests and joins all
    threads, and ``start()`` listens again on the same port.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, host: str = HOST, port: int = 0, *, upstream: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        if (root is None) == (upstream is None):
            raise ValueError("give exactly one of root (a directory to serve) or upstream (a URL to forward to)")
        self.tls = tls  # serve https with this context (see tls_files)
        self.root = Path(root) if root is not None else None
        self.backend: _FileBackend | _ProxyBackend = _FileBackend(self.root) if self.root is not None else _ProxyBackend(upstream)  # type: ignore[arg-type]
        self.host = host
        self.port = port
        self.faults = Faults()
        self.log = RequestLog()
        self.errors: list[str] = []  # tracebacks of unexpected handler failures (a test asserts it is empty)
        self._lock = threading.Lock()
        self._gone = threading.Condition(self._lock)  # notified when a connection ends
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._conns: dict[socket.socket, threading.Thread] = {}

    # -- lifecycle --

    @property
    def serving(self) -> bool:
        with self._lock:
            return self._listener is not None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT/`` (``https://`` with ``tls``)"""
        return f"{'https' if self.tls is not None else 'http'}://{self.host}:{self.port}/"

    @property
    def endpoint_url(self) -> str:
        """The URL without the trailing slash, as S3 clients want it."""
        return self.url.rstrip("/")

    def start(self) -> FaultyHTTPServer:
        """Listen (again) on ``port``; the first start picks a free port when it is 0."""
        with self._lock:
            if self._listener is not None:
                raise RuntimeError(f"{self.url} is already serving")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
            except OSError:
                sock.close()
                raise
            sock.listen(128)
            self.port = sock.getsockname()[1]
            self._listener = sock
            self._accepter = threading.Thread(target=self._accept_loop, args=(sock,), name=f"faulty-http-accept-{self.port}", daemon=True)
            self._accepter.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every live connection; join every thread.

        Clients see connection errors (refused, reset or EOF). Raises
        ``RuntimeError`` if a thread is still alive after ``timeout`` seconds.
        """
        with self._lock:
            listener, self._listener = self._listener, None
            accepter, self._accepter = self._accepter, None
            conns = list(self._conns.items())
        if listener is None:
            return
        self.faults.wake()  # hung requests see serving == False and drop their connection
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        listener.close()
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        threads = ([accepter] if accepter is not None else []) + [t for _, t in conns]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"test server {self.url}: threads still running {timeout} s after stop: {alive}")

    def wait_connections(self, n: int, timeout: float = 30.0) -> bool:
        """Block until at most ``n`` client connections are open (clients closed the others): True, or
        False after ``timeout`` seconds."""
        with self._gone:
            return self._gone.wait_for(lambda: len(self._conns) <= n, timeout)

    def __enter__(self) -> FaultyHTTPServer:
        if not self.serving:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, addr = listener.accept()
            except OSError:
                return  # stop() shut the listener down
            with self._lock:
                if self._listener is not listener:
                    conn.close()
                    return
                t = threading.Thread(target=self._run_connection, args=(conn, addr), name=f"faulty-http-conn-{addr[1]}", daemon=True)
                self._conns[conn] = t
            t.start()

    def _run_connection(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        try:
            if self.tls is not None:
                raw = conn
                conn = self.tls.wrap_socket(raw, server_side=True)  # the handshake, in this connection's thread
                with self._lock:  # stop() shuts the wrapped socket down (the raw one is detached now)
                    thread = self._conns.pop(raw, None)
                    if thread is not None:
                        self._conns[conn] = thread
            _Handler(conn, addr, self)  # type: ignore[arg-type]
        except OSError:
            pass  # the client went away, or stop() closed the connection
        except Exception:
            self.errors.append(traceback.format_exc())
            traceback.print_exc()
        finally:
            with self._lock:
                self._conns.pop(conn, None)
                self._gone.notify_all()
            conn.close()

    # -- faults (thread-safe; may be changed while serving) --

    def fail_every(self, n: int, status: int = 500, pattern: str | None = None, *, method: str | None = None, times: int | None = None) -> None:
        """Every ``n``-th matching request (the n-th, 2n-th, ...) is answered with ``status``."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.faults.add(_Fault("status", _compile(pattern), method, status=status, every=n, times=times))

    def fail_fraction(self, p: float, seed: int = 0, status: int = 500, pattern: str | None = None, *, method: str | None = None) -> None:
        """Each matching request fails with probability ``p`` (a seeded, repeatable sequence)."""
        self.faults.add(_Fault("status", _compile(pattern), method, status=status, fraction=p, rng=random.Random(seed)))

    def throttle(self, status: int = 503, times: int = 1, *, retry_after: int = 1, pattern: str | None = None, method: str | None = None) -> None:
        """The next ``times`` matching requests get ``status`` with ``Retry-After: retry_after``."""
        self.faults.add(_Fault("status", _compile(pattern), method, status=status, times=times, retry_after=retry_after))

    def truncate(self, pattern: str | None = None, times: int = 1) -> None:
        """The next ``times`` matching GETs announce the full length, send half the body and close."""
        self.faults.add(_Fault("truncate", _compile(pattern), "GET", times=times))

    def corrupt(self, pattern: str | None = None, times: int = 1) -> None:
        """The next ``times`` matching GETs have their middle body byte flipped (same length)."""
        self.faults.add(_Fault("corrupt", _compile(pattern), "GET", times=times))

    def trickle(self, pattern: str | None = None, interval: float = 0.05, *, times: int | None = None) -> None:
        """Matching GETs send their body one byte every ``interval`` seconds (a server that is slow,
        not silent: no read timeout fires)."""
        self.faults.add(_Fault("trickle", _compile(pattern), "GET", times=times, interval=interval))

    def redirect(self, to: str, pattern: str | None = None, *, status: int = 302, times: int | None = None) -> None:
        """Matching GETs are answered ``status`` with ``Location: <to><path>`` (``to``: another server's base URL,
        or this one's under another path)."""
        self.faults.add(_Fault("redirect", _compile(pattern), "GET", status=status, times=times, to=to))

    def oversend(self, pattern: str | None = None, *, extra: int = 64 << 20, how: str = "no-length", times: int | None = None) -> None:
        """Matching GETs send more than was asked for: the file's bytes, then ``extra`` more (until the client
        hangs up). ``how``: ``"no-length"`` (no Content-Length, the connection's end ends the body),
        ``"huge-length"`` (a Content-Length ``extra`` bytes too long), ``"long-range"`` (a 206 whose
        Content-Length and body pass its range), ``"wrong-range"`` (a 206 with the length asked for but a
        Content-Range one byte further on, and no extra bytes)."""
        if how not in ("no-length", "huge-length", "long-range", "wrong-range"):
            raise ValueError(f"unknown over-sending {how!r}")
        self.faults.add(_Fault("oversend", _compile(pattern), "GET", times=times, extra=extra, how=how))

    def hang(self, pattern: str | None = None, *, method: str | None = "GET", times: int | None = None) -> None:
        """Matching requests are read and then never answered until ``release()`` or ``stop()``."""
        self.faults.add(_Fault("hang", _compile(pattern), method, times=times))

    def release(self) -> None:
        """Answer the hung requests normally and stop hanging new ones."""
        self.faults.release()

    def wait_hung(self, n: int = 1, timeout: float = 10.0) -> bool:
        """Block until ``n`` requests are hung (True), or ``timeout`` passes (False)."""
        return self.faults.wait_hung(n, timeout)

    def ignore_range(self, pattern: str | None = None) -> None:
        """Answer matching requests as if they had no Range header (200 with the whole file)."""
        self.faults.add_ignore_range(pattern)

    def reset(self) -> None:
        """Remove every fault and release hung requests (the log is kept: see ``log.clear()``)."""
        self.faults.reset()

    # -- the request log --

    @property
    def requests(self) -> list[LoggedRequest]:
        return self.log.entries

    def count(self, pattern: str | None = None, method: str | None = "GET", status: int | None = None) -> int:
        """How many logged requests match (``method=None``: any method)."""
        return self.log.count(pattern, method, status)

    @property
    def bytes_sent(self) -> int:
        """Body bytes handed to the sockets since the start (or ``log.clear()``)."""
        return self.log.bytes_sent


# ----------------------------------------------------------------------------
# A forward proxy, and certificates for https servers
# ----------------------------------------------------------------------------


class ProxiedRequest(NamedTuple):
    """One request a ``ForwardProxy`` carried: ``GET http://host:port/path`` or ``CONNECT host:port``."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _ProxyServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _logged(self) -> None:
        self.server.owner.add(ProxiedRequest(self.command, self.path, tuple(self.headers.items())))

    def do_GET(self) -> None:
        """An absolute-URI request: forwarded to its origin, the answer sent back whole."""
        self._logged()
        parts = urllib.parse.urlsplit(self.path)
        if parts.scheme != "http" or not parts.hostname:
            self.send_error(400, "a forward proxy takes absolute http:// URIs")
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP and not k.lower().startswith("proxy-")}
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=60)
        try:
            conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.send_error(502, f"upstream failed: {exc!r}")
            return
        finally:
            conn.close()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_CONNECT(self) -> None:
        """A tunnel to ``host:port``: bytes relayed both ways until either side closes."""
        self._logged()
        host, _, port = self.path.rpartition(":")
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=60)
        except (OSError, ValueError) as exc:
            self.send_error(502, f"cannot reach {self.path}: {exc!r}")
            return
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        client = self.connection
        self.server.owner.track(upstream)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(client, selectors.EVENT_READ, upstream)
                sel.register(upstream, selectors.EVENT_READ, client)
                while True:
                    for key, _ in sel.select():
                        data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
                        if not data:
                            return
                        key.data.sendall(data)
        except OSError:
            return
        finally:
            self.server.owner.untrack(upstream)
            upstream.close()


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ForwardProxy


class ForwardProxy:
    """A forward HTTP proxy on 127.0.0.1, as a cluster's egress proxy is: absolute-URI GETs for http://
    targets, CONNECT tunnels for https:// ones. Every request it carried is in ``log``."""

    def __init__(self, host: str = HOST, port: int = 0) -> None:
        self.host, self.port = host, port
        self.log: list[ProxiedRequest] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (as HTTP_PROXY takes it)."""
        return f"http://{self.host}:{self.port}"

    def add(self, entry: ProxiedRequest) -> None:
        with self._lock:
            self.log.append(entry)

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def untrack(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)

    def start(self) -> ForwardProxy:
        server = _ProxyServer((self.host, self.port), _ProxyHandler)
        server.owner = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=f"forward-proxy-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:  # open tunnels end
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        assert self._thread is not None
        self._thread.join(10)

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tls_files(folder: str | os.PathLike[str]) -> tuple[str, str, str]:
    """``(ca, cert, key)``: PEM files of a test certificate authority and of a server certificate it signed
    for 127.0.0.1 and localhost (made with ``cryptography``). A client trusts the server with ``ca``
    (``SSL_CERT_FILE=ca``); ``server_tls(cert, key)`` is the server's context."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chute test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder = Path(folder)
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(paths[0]), str(paths[1]), str(paths[2])


def server_tls(cert: str, key: str) -> ssl.SSLContext:
    """The server side of ``tls_files``' certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


# ----------------------------------------------------------------------------
# Servers in a child process
# ----------------------------------------------------------------------------


class ServerProcess:
    """Runs ``python -m tests.servers ARGS`` in a child process.

    The child prints its URL on its first line; ``start`` waits for it (at most
    ``timeout`` seconds, with the child's stderr in the error). ``stop`` closes
    the child's stdin, which makes it shut down cleanly (so does the death of
    this process), and kills it if it has not exited after 10 s.
    """

    def __init__(self, args: list[str], *, timeout: float = 30.0, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.timeout = timeout
        self.env = env
        self.url = ""
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> ServerProcess:
        if self._proc is not None:
            raise RuntimeError(f"server process {self.url} already running")
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        self._stderr = tempfile.TemporaryFile()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.servers", *self.args, "--watch-stdin"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _read_url(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise ServerStartError(f"`tests.servers {' '.join(self.args)}` printed no URL within {self.timeout} s; its stderr:\n{self._stderr_text()}")
                chunk = os.read(fd, 4096)
                if not chunk:
                    code = self._proc.wait(timeout=5)
                    raise ServerStartError(f"`tests.servers {' '.join(self.args)}` exited with {code} before printing its URL; its stderr:\n{self._stderr_text()}")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode().strip()

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> ServerProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HTTPServerProcess(ServerProcess):
    """A ``FaultyHTTPServer`` over ``root`` in a child process (no fault controls)."""

    def __init__(self, root: str | os.PathLike[str], port: int = 0, *, timeout: float = 30.0) -> None:
        super().__init__(["http", str(Path(root).resolve()), "--port", str(port)], timeout=timeout)


class MotoS3Server(ServerProcess):
    """moto's S3 server in a child process on 127.0.0.1.

    ``endpoint_url`` is where S3 clients go; ``storage_options`` are s3fs's
    keyword arguments for it. ``stop()`` then ``start()`` comes back on the same
    port but empty (moto keeps its state in memory).
    """

    def __init__(self, port: int = 0, *, timeout: float = 30.0) -> None:
        super().__init__(["s3", "--port", str(port)], timeout=timeout)
        self._client: Any = None

    def start(self) -> MotoS3Server:
        super().start()
        self._client = None
        self.args[-1] = str(urllib.parse.urlsplit(self.url).port)  # a restart keeps the port
        return self

    @property
    def endpoint_url(self) -> str:
        return self.url

    @property
    def storage_options(self) -> dict[str, Any]:
        return s3_storage_options(self.endpoint_url)

    def client(self) -> Any:
        """A boto3 S3 client for this server (made once; boto3 is imported here, not at import)."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=S3_KEY,
                aws_secret_access_key=S3_SECRET,
                region_name=S3_REGION,
            )
        return self._client

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (3-63 lowercase letters, digits, dots, hyphens); returns ``"s3://name"``."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def delete_bucket(self, name: str) -> None:
        """Delete every object in bucket ``name``, then the bucket (frees moto's memory)."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys})
        client.delete_bucket(Bucket=name)


# ----------------------------------------------------------------------------
# Command line: the child-process side
# ----------------------------------------------------------------------------


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _wait_for_stop(watch_stdin: bool) -> None:
    """Block until SIGTERM/SIGINT, or until stdin closes when ``watch_stdin``.

    ``main`` blocks these signals in every thread before any starts, so they stay
    pending for ``sigwait`` here whichever thread the kernel picks (and even when
    a shell started us in the background with SIGINT ignored).
    """
    if watch_stdin:

        def watch() -> None:
            sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="stdin-watch", daemon=True).start()
    signal.sigwait(_STOP_SIGNALS)


def _serve_s3(port: int, watch_stdin: bool) -> None:
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(HOST, port, verbose=False)
    server.start()
    host, bound = server.get_host_and_port()
    print(f"http://{host}:{bound}", flush=True)
    try:
        _wait_for_stop(watch_stdin)
    finally:
        server.stop()


def _serve_http(root: str, port: int, watch_stdin: bool) -> None:
    with FaultyHTTPServer(root, port=port) as server:
        print(server.url, flush=True)
        _wait_for_stop(watch_stdin)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.servers", description="Run a test server on 127.0.0.1; prints its URL on the first line.")
    sub = parser.add_subparsers(dest="kind", required=True)
    p_http = sub.add_parser("http", help="serve the files under ROOT (GET, HEAD, byte ranges)")
    p_http.add_argument("root")
    p_s3 = sub.add_parser("s3", help="moto's S3 server (in memory)")
    for p in (p_http, p_s3):
        p.add_argument("--port", type=int, default=0, help="0 picks a free port")
        p.add_argument("--watch-stdin", action="store_true", help="exit when stdin closes (used by ServerProcess)")
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # before any thread starts: threads inherit it
    if args.kind == "http":
        _serve_http(args.root, args.port, args.watch_stdin)
    else:
        _serve_s3(args.port, args.watch_stdin)


if __name__ == "__main__":
    main()
