"""chute/storage/net/http.py, chute's own HTTP GETs, against a real server on 127.0.0.1 whose every answer the
test decides: redirects, statuses, kept and dropped connections, bodies cut short, headers sent."""

from __future__ import annotations

import gc
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chute.storage.net import http as http_get
from chute.storage.net.remote import Remote, is_transient
from chute.storage.net.stream import Floor, RangeIgnored

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
        elif "Range" in self.headers and self.path == "/data":
            start, end = (int(v) for v in self.headers["Range"].split("=")[1].split("-"))
            self._reply(206, BODY[start:end + 1])
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

    def process_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        self.connections += 1
        super().process_request(request, client_address)


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(5)


def fetch(connections: http_get.Connections, url: str, start: int | None = None, length: int | None = None) -> bytes:
    parts: list[bytes] = []
    http_get.get(connections, url, start, length, lambda _, chunks: parts.extend(chunks), floor=Floor(),
                 cancelled=lambda: False, on_cancel=lambda wake: lambda: None)
    return b"".join(parts)


def test_gets_reuse_one_kept_connection_and_follow_redirects(server):
    base = f"http://127.0.0.1:{server.server_port}"
    connections = http_get.Connections()
    assert fetch(connections, base + "/data") == BODY
    assert fetch(connections, base + "/data", 1000, 5000) == BODY[1000:6000]
    assert fetch(connections, base + "/moved") == BODY
    assert [path for path, _ in server.seen] == ["/data", "/data", "/moved", "/data"]
    assert server.connections == 1  # every request on this thread's one connection
    connections.close()


def test_a_kept_connection_the_server_dropped_is_reopened_without_an_error(server):
    base = f"http://127.0.0.1:{server.server_port}"
    connections = http_get.Connections()
    assert fetch(connections, base + "/once") == BODY
    assert fetch(connections, base + "/data") == BODY  # sent on the dropped connection first, then anew
    assert server.connections == 2
    connections.close()


def test_the_connection_a_download_thread_kept_is_closed_when_the_thread_ends(server, monkeypatch):
    # each pass starts new download threads: what an ended thread kept must not stay open
    base = f"http://127.0.0.1:{server.server_port}"
    connections = http_get.Connections()
    used: list[http.client.HTTPConnection] = []
    take = connections.take

    def spy(scheme: str, netloc: str):
        conn, kept = take(scheme, netloc)
        used.append(conn)
        return conn, kept

    monkeypatch.setattr(connections, "take", spy)
    for _ in range(3):
        thread = threading.Thread(target=fetch, args=(connections, base + "/data"))
        thread.start()
        thread.join()
    assert len(used) == 3 and len(set(map(id, used))) == 3  # a connection per thread
    gc.collect()
    assert all(conn.sock is None for conn in used)  # closed, not left to the server's idle timeout
    fetch(connections, base + "/data")  # this thread keeps one: closed by close()
    assert used[-1].sock is not None
    connections.close()
    assert used[-1].sock is None


def test_statuses_become_the_errors_the_retry_policy_knows(server):
    base = f"http://127.0.0.1:{server.server_port}"
    connections = http_get.Connections()
    with pytest.raises(FileNotFoundError, match="/status/404"):
        fetch(connections, base + "/status/404")
    with pytest.raises(PermissionError, match="HTTP 403"):
        fetch(connections, base + "/status/403")
    with pytest.raises(http_get.HTTPStatusError, match="HTTP 503") as info:
        fetch(connections, base + "/status/503")
    assert info.value.status == 503 and is_transient(info.value)
    with pytest.raises(http_get.HTTPStatusError) as info:
        fetch(connections, base + "/status/416")
    assert not is_transient(info.value)
    with pytest.raises(http.client.IncompleteRead) as cut:
        fetch(connections, base + "/cut")
    assert is_transient(cut.value)
    with pytest.raises(RangeIgnored):
        fetch(connections, base + "/once", 0, 10)  # a 200 to a Range request
    connections.close()


def test_storage_options_decide_the_client_and_headers_are_sent(server, monkeypatch):
    assert http_get.applies({}) and http_get.applies({"headers": {"Authorization": "Bearer t"}})
    assert not http_get.applies({"client_kwargs": {"trust_env": True}})  # only aiohttp takes these
    monkeypatch.setenv("CHUTE_HTTP_CLIENT", "fsspec")
    assert not http_get.applies({})
    monkeypatch.delenv("CHUTE_HTTP_CLIENT")
    remote = Remote(f"http://127.0.0.1:{server.server_port}", storage_options={"headers": {"X-Token": "abc"}})
    assert remote.read("data") == BODY
    assert server.seen[-1][1]["X-Token"] == "abc"
    assert Remote("http://127.0.0.1:9", storage_options={"client_kwargs": {"trust_env": True}}).http_connections is None
    remote.close()
