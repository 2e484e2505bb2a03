"""chute/storage/net/http.py, chute's own HTTP GETs on urllib3, against a real server on 127.0.0.1 whose every
answer the test decides: redirects, statuses, kept and dropped connections, bodies cut short or too long,
ranges, headers sent, a request cancelled while it waits for its answer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chute.storage.net import http as http_get
from chute.storage.net.pools import bypassed, origin, proxy_for
from chute.storage.net.remote import Remote, is_transient
from chute.storage.net.stream import BadRange, Floor, Interrupted, RangeIgnored, Receiver, TooLong

BODY = bytes(range(256)) * 1024  # 256 KiB


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        server: _Server = self.server  # type: ignore[assignment]
        server.seen.append((self.path, dict(self.headers)))
        if self.path == "/moved":
            self._reply(302, b"", [("Location", "/data")])
        elif self.path == "/away":  # to another origin (the other server of the test)
            self._reply(302, b"", [("Location", server.elsewhere + "/data")])
        elif self.path.startswith("/status/"):
            self._reply(int(self.path.rsplit("/", 1)[1]), b"no")
        elif self.path == "/cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[:1000])
            self.close_connection = True
        elif self.path == "/once":  # answers, then drops the kept connection without saying so
            self._reply(200, BODY)
            self.close_connection = True
        elif self.path == "/no-length":  # the body ends with the connection
            self.send_response(200)
            self.end_headers()
            self.wfile.write(BODY)
            self.close_connection = True
        elif self.path == "/stall":  # reads the request, answers only once released
            server.stalled.set()
            server.release.wait(60)
            self._reply(200, BODY)
        elif "Range" in self.headers and self.path in ("/data", "/shifted"):
            start, end = (int(v) for v in self.headers["Range"].split("=")[1].split("-"))
            shift = 1 if self.path == "/shifted" else 0
            self._reply(206, BODY[start + shift:end + 1 + shift], [("Content-Range", f"bytes {start + shift}-{end + shift}/{len(BODY)}")])
        else:
            self._reply(200, BODY)

    def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, dict]] = []
        self.connections = 0
        self.elsewhere = ""
        self.stalled, self.release = threading.Event(), threading.Event()

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        self.connections += 1
        super().process_request(request, client_address)


def _serve() -> tuple[_Server, threading.Thread]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, name="test-http", daemon=True)
    thread.start()
    return srv, thread


@pytest.fixture
def server() -> Iterator[_Server]:
    (srv, thread), (other, other_thread) = _serve(), _serve()
    srv.elsewhere = f"http://127.0.0.1:{other.server_port}"  # another port: another origin
    srv.other = other  # type: ignore[attr-defined]
    yield srv
    for s, t in ((srv, thread), (other, other_thread)):
        s.release.set()
        s.shutdown()
        s.server_close()
        t.join(5)


def fetch(url: str, start: int | None = None, length: int | None = None, *, limit: int = 1 << 30,
          client: http_get.Client | None = None, cancelled=lambda: False, on_cancel=lambda wake: lambda: None) -> bytes:
    parts: list[bytes] = []
    (client or http_get.Client()).get(url, start, length, lambda _, chunks: parts.extend(chunks), limit=limit, floor=Floor(),
                                      cancelled=cancelled, on_cancel=on_cancel)
    return b"".join(parts)


def test_gets_reuse_one_kept_connection_and_follow_redirects(server):
    base = f"http://127.0.0.1:{server.server_port}"
    assert fetch(base + "/data") == BODY
    assert fetch(base + "/data", 1000, 5000) == BODY[1000:6000]
    assert fetch(base + "/moved") == BODY
    assert [path for path, _ in server.seen] == ["/data", "/data", "/moved", "/data"]
    assert server.connections == 1  # every request on the process's one kept connection to the host


def test_download_threads_share_the_process_s_kept_connections(server):
    # each pass starts new download threads: they take the connections the pool keeps, not new ones each
    base = f"http://127.0.0.1:{server.server_port}"
    for _ in range(3):
        thread = threading.Thread(target=fetch, args=(base + "/data",))
        thread.start()
        thread.join()
    assert len(server.seen) == 3 and server.connections == 1


def test_a_kept_connection_the_server_dropped_is_reopened_without_an_error(server):
    base = f"http://127.0.0.1:{server.server_port}"
    assert fetch(base + "/once") == BODY
    assert fetch(base + "/data") == BODY  # sent on the dropped connection first, or seen dropped: anew
    assert server.connections == 2


def test_statuses_become_the_errors_the_retry_policy_knows(server):
    import urllib3

    base = f"http://127.0.0.1:{server.server_port}"
    with pytest.raises(FileNotFoundError, match="/status/404"):
        fetch(base + "/status/404")
    with pytest.raises(PermissionError, match="HTTP 403"):
        fetch(base + "/status/403")
    with pytest.raises(http_get.HTTPStatusError, match="HTTP 503") as info:
        fetch(base + "/status/503")
    assert info.value.status == 503 and is_transient(info.value)
    with pytest.raises(http_get.HTTPStatusError) as info:
        fetch(base + "/status/416")
    assert not is_transient(info.value)
    with pytest.raises(urllib3.exceptions.ProtocolError) as cut:
        fetch(base + "/cut")
    assert is_transient(cut.value)
    with pytest.raises(RangeIgnored):
        fetch(base + "/once", 0, 10)  # a 200 to a Range request


def test_a_body_never_passes_its_limit(server):
    base = f"http://127.0.0.1:{server.server_port}"
    assert fetch(base + "/data", limit=len(BODY)) == BODY
    with pytest.raises(TooLong) as info:  # announced: refused before a byte of the body is read
        fetch(base + "/data", limit=len(BODY) - 1)
    assert is_transient(info.value) and f"more than the {len(BODY) - 1:,} bytes" in str(info.value)
    with pytest.raises(TooLong):  # not announced: cut at the first byte too many
        fetch(base + "/no-length", limit=1000)
    assert fetch(base + "/no-length", limit=len(BODY)) == BODY
    with pytest.raises(BadRange, match="asked for bytes 10-19"):  # a 206 of other bytes than those asked for
        fetch(base + "/shifted", 10, 10)


def test_the_receiver_hands_over_nothing_past_its_limit():
    seen: list[bytes] = []
    receiver = Receiver(lambda offset, chunks: seen.extend(chunks), 0, Floor(), limit=10)
    receiver.add(b"12345")
    with pytest.raises(TooLong):
        receiver.add(b"678901")  # one byte too many: this chunk is refused whole
    receiver.add(b"")
    assert b"".join(seen) == b"12345" and receiver.received == 5


def test_credentials_never_follow_a_redirect_to_another_origin(server):
    base = f"http://127.0.0.1:{server.server_port}"
    client = http_get.Client({"Authorization": "Bearer secret", "Cookie": "c=1", "Proxy-Authorization": "Basic x",
                              "X-Trace": "kept"})
    assert fetch(base + "/moved", client=client) == BODY  # the same origin: kept
    assert all(headers.get("Authorization") == "Bearer secret" for _, headers in server.seen)
    assert fetch(base + "/away", client=client) == BODY
    (path, headers), = server.other.seen
    assert path == "/data" and headers.get("X-Trace") == "kept"
    assert not {"Authorization", "Cookie", "Proxy-Authorization"} & set(headers)
    assert origin("http://h/x") == origin("HTTP://H:80/y") != origin("https://h/x") != origin("http://h:81/x")


def test_a_request_waiting_for_its_answer_is_cancelled_at_once(server):
    """Cancelled while it waits for the status line: the socket is shut under the read (no 60 s timeout)."""
    base = f"http://127.0.0.1:{server.server_port}"
    cancel = threading.Event()
    wakers: list = []
    errors: list[BaseException] = []

    def on_cancel(wake):
        wakers.append(wake)
        return lambda: wakers.remove(wake)

    def run() -> None:
        try:
            fetch(base + "/stall", cancelled=cancel.is_set, on_cancel=on_cancel)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=run, name="test-stalled-get")
    thread.start()
    assert server.stalled.wait(30)
    cancel.set()
    for wake in list(wakers):
        wake()
    thread.join(30)
    assert not thread.is_alive() and len(errors) == 1 and isinstance(errors[0], Interrupted), errors


def test_proxies_come_from_the_environment_and_no_proxy_is_honoured(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert proxy_for("http://data.example/x") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("ALL_PROXY", "http://all:3128")
    monkeypatch.setenv("NO_PROXY", "internal.example,.corp.example")
    assert proxy_for("http://data.example/x") == "http://proxy:3128"
    assert proxy_for("https://data.example/x") == "http://all:3128"  # no HTTPS_PROXY: ALL_PROXY
    assert proxy_for("http://internal.example/x") is None
    assert proxy_for("http://a.corp.example:8080/x") is None
    assert proxy_for("http://data.example/x", {"https": "http://p:1"}) is None  # explicit proxies: only those
    monkeypatch.setenv("http_proxy", "http://lower:3128")  # a change between two GETs is seen by the next one
    assert proxy_for("http://data.example/x") == "http://lower:3128"
    monkeypatch.delenv("http_proxy")
    monkeypatch.delenv("ALL_PROXY")
    assert proxy_for("https://data.example/x") is None
    for host, port, no_proxy, direct in [
        ("a.example", None, "*", True), ("a.example", None, "example", True), ("example", 80, ".example", True),
        ("badexample", None, "example", False), ("10.1.2.3", None, "10.0.0.0/8", True), ("11.1.2.3", None, "10.0.0.0/8", False),
        ("127.0.0.1", 8080, "127.0.0.1:8080", True), ("127.0.0.1", 9090, "127.0.0.1:8080", False),
        ("::1", None, "::1", True), ("::1", 5000, "[::1]:5000", True), ("a.example", None, " , a.example ", True),
    ]:
        assert bypassed(host, port, no_proxy) is direct, (host, port, no_proxy)


def test_storage_options_decide_the_client_and_headers_are_sent(server, monkeypatch):
    assert http_get.applies({}) and http_get.applies({"headers": {"Authorization": "Bearer t"}})
    assert not http_get.applies({"client_kwargs": {"trust_env": True}})  # only aiohttp takes these
    monkeypatch.setenv("CHUTE_HTTP_CLIENT", "fsspec")
    assert not http_get.applies({})
    monkeypatch.delenv("CHUTE_HTTP_CLIENT")
    remote = Remote(f"http://127.0.0.1:{server.server_port}", storage_options={"headers": {"X-Token": "abc"}})
    assert remote.read("data") == BODY
    assert server.seen[-1][1]["X-Token"] == "abc"
    assert Remote("http://127.0.0.1:9", storage_options={"client_kwargs": {"trust_env": True}}).http_client is None
    remote.close()
