"""The test servers behave as specified, seen through the clients chute uses.

HTTP is read with fsspec's HTTPFileSystem (aiohttp), S3 with s3fs (aiobotocore).
These tests also pin down which exception each client raises for each fault,
which is what chute's retry logic has to recognise.
"""

from __future__ import annotations

import errno
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.servers import (
    REPO_ROOT,
    FaultyHTTPServer,
    HTTPServerProcess,
    LoggedRequest,
    MotoS3Server,
    ServerProcess,
    ServerStartError,
    _Unsatisfiable,
    parse_range,
    s3_storage_options,
)

aiohttp = pytest.importorskip("aiohttp")
fsspec = pytest.importorskip("fsspec")

DATA = bytes(range(256)) * 4000 + b"tail!"  # 1,024,005 bytes, every offset distinguishable mod 256


def _server_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("faulty-http")]


@pytest.fixture
def served(http_server: FaultyHTTPServer) -> str:
    (http_server.root / "d").mkdir()
    (http_server.root / "d" / "shard.bin").write_bytes(DATA)
    return http_server.url + "d/shard.bin"


def _http_fs(**timeout: float):
    """A fresh HTTPFileSystem; ``timeout`` goes to aiohttp.ClientTimeout (default: 20 s total)."""
    return fsspec.filesystem(
        "http", skip_instance_cache=True, client_kwargs={"timeout": aiohttp.ClientTimeout(**(timeout or {"total": 20}))}
    )


def _raw_get(server: FaultyHTTPServer, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# Plain serving
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, expected",
    [
        (None, None),
        ("bytes=0-9", (0, 10)),
        ("bytes=5-", (5, 100)),
        ("bytes=-10", (90, 100)),
        ("bytes=90-1000", (90, 100)),
        ("bytes=0-0", (0, 1)),
        ("bytes=9-3", None),  # invalid: ignored, whole body
        ("bytes=0-1,5-6", None),  # several ranges: whole body
        ("items=0-9", None),
    ],
)
def test_parse_range(header, expected):
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize("header, size", [("bytes=100-", 100), ("bytes=100-200", 100), ("bytes=-0", 100), ("bytes=0-", 0)])
def test_parse_range_unsatisfiable(header, size):
    with pytest.raises(_Unsatisfiable):
        parse_range(header, size)


def test_whole_get_and_ranges_through_fsspec(http_server, served):
    fs = _http_fs()
    assert fs.info(served)["size"] == len(DATA)
    assert fs.cat_file(served) == DATA
    for start, end in [(0, 1), (10, 1000), (300_000, 700_001), (len(DATA) - 5, len(DATA))]:
        assert fs.cat_file(served, start, end) == DATA[start:end]
    assert http_server.requests[-1][:4] == LoggedRequest("GET", "/d/shard.bin", f"bytes={len(DATA) - 5}-{len(DATA) - 1}", 206)[:4]
    assert http_server.count("shard.bin", status=206) == 4
    assert http_server.count("shard.bin", method="HEAD") == 1
    assert http_server.bytes_sent == len(DATA) + 1 + 990 + 400_001 + 5
    with pytest.raises(FileNotFoundError, match="nothing.bin"):
        fs.cat_file(http_server.url + "d/nothing.bin")


def test_parallel_ranges_return_the_exact_bytes(http_server, served):
    """Many concurrent byte-range GETs (how a large shard is downloaded) each get their own slice."""
    fs = _http_fs()
    step = len(DATA) // 16 + 1
    starts = list(range(0, len(DATA), step))
    ends = [min(s + step, len(DATA)) for s in starts]
    parts = fs.cat_ranges([served] * len(starts), starts, ends)
    assert b"".join(parts) == DATA
    assert http_server.count("shard", status=206) == len(starts)


def test_range_headers_on_the_wire(http_server, served):
    status, headers, body = _raw_get(http_server, "/d/shard.bin", {"Range": "bytes=1000-1999"})
    assert (status, body) == (206, DATA[1000:2000])
    assert headers["Content-Range"] == f"bytes 1000-1999/{len(DATA)}"
    assert headers["Content-Length"] == "1000"
    assert headers["Accept-Ranges"] == "bytes"
    status, headers, _ = _raw_get(http_server, "/d/shard.bin", {"Range": f"bytes={len(DATA)}-"})
    assert (status, headers["Content-Range"]) == (416, f"bytes */{len(DATA)}")
    status, _, _ = _raw_get(http_server, "/../../etc/passwd")
    assert status == 404
    conn = http.client.HTTPConnection(http_server.host, http_server.port, timeout=10)
    conn.request("PUT", "/d/shard.bin", body=b"x")
    assert conn.getresponse().status == 405  # read-only
    conn.close()


def test_server_ignoring_range_makes_fsspec_cat_file_return_the_whole_file(http_server, served):
    """fsspec's cat_file(url, start, end) does not check for 206: callers must check the length."""
    http_server.ignore_range("shard")
    fs = _http_fs()
    assert fs.cat_file(served, 10, 20) == DATA  # not DATA[10:20]
    with fs.open(served, "rb", block_size=1 << 16) as f:
        f.seek(100)
        with pytest.raises(ValueError, match="doesn't appear to support range requests"):
            f.read(10)


# ---------------------------------------------------------------------------
# Faults, and what fsspec's HTTP client raises for each
# ---------------------------------------------------------------------------


def test_fail_every_is_deterministic_and_surfaces_as_client_response_error(http_server, served):
    http_server.fail_every(3, 500, pattern="shard")
    fs = _http_fs()
    outcomes = []
    for _ in range(6):
        try:
            outcomes.append(fs.cat_file(served) == DATA)
        except aiohttp.ClientResponseError as exc:
            outcomes.append(exc.status)
    assert outcomes == [True, True, 500, True, True, 500]
    assert [r.status for r in http_server.requests] == [200, 200, 500, 200, 200, 500]


def test_info_turns_errors_into_file_not_found(http_server, served):
    """HTTPFileSystem.info retries a failed HEAD as a GET, and reports two failures as FileNotFoundError."""
    fs = _http_fs()
    http_server.fail_every(1, 500, method="HEAD")
    assert fs.info(served)["size"] == len(DATA)
    assert [(r.method, r.status) for r in http_server.requests] == [("HEAD", 500), ("GET", 200)]
    http_server.reset()
    http_server.fail_every(1, 503)
    with pytest.raises(FileNotFoundError) as info:
        fs.info(served)
    assert isinstance(info.value.__cause__, aiohttp.ClientResponseError) and info.value.__cause__.status == 503


def test_fail_fraction_repeats_with_its_seed(http_server, served):
    def statuses(seed: int) -> list[int]:
        http_server.reset()
        http_server.log.clear()
        http_server.fail_fraction(0.5, seed=seed)
        for _ in range(20):
            _raw_get(http_server, "/d/shard.bin", {"Range": "bytes=0-0"})
        return [r.status for r in http_server.requests]

    first = statuses(7)
    assert first == statuses(7)
    assert first != statuses(8)
    assert 3 <= first.count(500) <= 17


def test_throttle_sends_retry_after_then_recovers(http_server, served):
    http_server.throttle(503, times=2, retry_after=3)
    fs = _http_fs()
    for _ in range(2):
        with pytest.raises(aiohttp.ClientResponseError) as info:
            fs.cat_file(served)
        assert info.value.status == 503
        assert info.value.headers["Retry-After"] == "3"
    assert fs.cat_file(served) == DATA


def test_truncated_body_raises_client_payload_error(http_server, served):
    http_server.truncate("shard", times=1)
    fs = _http_fs()
    with pytest.raises(aiohttp.ClientPayloadError, match=f"received {len(DATA) // 2} of {len(DATA)} bytes"):
        fs.cat_file(served)
    assert http_server.bytes_sent == len(DATA) // 2
    assert fs.cat_file(served) == DATA  # times=1: the next one is whole


def test_truncated_stream_gives_fewer_bytes_or_an_error(http_server, served):
    """Streaming (block_size=0) sees the short body as an error too, not as a silent EOF."""
    http_server.truncate("shard")
    fs = _http_fs()
    got = bytearray()
    with pytest.raises(aiohttp.ClientPayloadError):
        with fs.open(served, "rb", block_size=0) as f:
            while chunk := f.read(1 << 16):
                got += chunk
    assert len(got) < len(DATA) and DATA.startswith(bytes(got))


def test_corrupt_flips_one_byte_keeping_the_length(http_server, served):
    http_server.corrupt("shard")
    fs = _http_fs()
    got = fs.cat_file(served)
    assert len(got) == len(DATA)
    diff = [i for i in range(len(DATA)) if got[i] != DATA[i]]
    assert diff == [len(DATA) // 2] and got[diff[0]] == DATA[diff[0]] ^ 0xFF
    http_server.corrupt("shard")
    got = fs.cat_file(served, 100, 200)  # a range: its own middle byte
    assert got[:50] + got[51:] == DATA[100:150] + DATA[151:200] and got[50] == DATA[150] ^ 0xFF
    assert fs.cat_file(served) == DATA


def test_hang_blocks_until_a_client_timeout(http_server, served):
    http_server.hang("shard")
    fs = _http_fs(total=None, sock_read=0.3)
    with pytest.raises(fsspec.exceptions.FSTimeoutError):
        fs.cat_file(served)
    assert http_server.wait_hung(1, timeout=5)
    http_server.release()


def test_hang_blocks_until_release_then_answers(http_server, served):
    http_server.hang("shard")
    fs = _http_fs()
    result: dict[str, object] = {}
    reader = threading.Thread(target=lambda: result.setdefault("data", fs.cat_file(served)))
    reader.start()
    assert http_server.wait_hung(1, timeout=5)
    reader.join(0.2)
    assert reader.is_alive() and not result  # still blocked
    http_server.release()
    reader.join(10)
    assert result["data"] == DATA
    assert http_server.requests[-1].status == 200
    assert _http_fs(total=5).cat_file(served, 0, 5) == DATA[:5]  # release() also ends the hang rule


def test_stop_ends_hung_requests_and_every_thread(http_server, served):
    http_server.hang()
    fs = _http_fs()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            fs.cat_file(served, 0, 10)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    assert http_server.wait_hung(3, timeout=5)
    http_server.stop()
    for t in readers:
        t.join(10)
    assert not any(t.is_alive() for t in readers)
    assert len(errors) == 3 and all(isinstance(e, aiohttp.ClientError) for e in errors)
    assert _server_threads() == []
    assert [r.status for r in http_server.requests] == [0, 0, 0]  # logged as never answered


def test_stop_refuses_connections_and_start_serves_on_the_same_port(http_server, served):
    fs = _http_fs()
    assert fs.cat_file(served, 0, 10) == DATA[:10]  # leaves a keep-alive connection in aiohttp's pool
    url = http_server.url
    http_server.stop()
    assert _server_threads() == []
    with pytest.raises(aiohttp.ClientConnectorError) as info:
        fs.cat_file(served)
    assert isinstance(info.value, OSError)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((http_server.host, http_server.port), timeout=5).close()
    http_server.start()
    assert http_server.url == url
    assert fs.cat_file(served) == DATA  # the same client reconnects


def test_stop_closes_live_keep_alive_connections(http_server, served):
    sock = socket.create_connection((http_server.host, http_server.port), timeout=10)
    with sock:
        sock.sendall(b"GET /d/shard.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-3\r\n\r\n")
        reply = b""
        while not reply.endswith(DATA[:4]):
            reply += sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 206")
        http_server.stop()
        try:
            assert sock.recv(4096) == b""  # EOF: the server closed the connection
        except ConnectionResetError:
            pass
    assert _server_threads() == []


def test_context_manager_leaves_nothing_running(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    before = set(os.listdir("/proc/self/fd"))
    with FaultyHTTPServer(tmp_path) as server:
        assert _raw_get(server, "/f")[2] == b"abc"
        port = server.port
    assert _server_threads() == []
    assert set(os.listdir("/proc/self/fd")) <= before
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((server.host, port))


# ---------------------------------------------------------------------------
# Servers in child processes
# ---------------------------------------------------------------------------


def test_http_server_process_serves_and_exits(tmp_path):
    (tmp_path / "a.bin").write_bytes(DATA)
    with HTTPServerProcess(tmp_path) as proc:
        assert proc.url.startswith("http://127.0.0.1:") and proc.url.endswith("/")
        assert _http_fs().cat_file(proc.url + "a.bin", 5, 50) == DATA[5:50]
        child = proc._proc
    assert child is not None and child.returncode == 0  # closed stdin: a clean exit


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_command_line_server_prints_its_url_and_stops_on_a_signal(tmp_path, sig):
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.servers", "http", str(tmp_path), "--port", "0"],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,  # as in a shell script's background job: no stdin to watch
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert _http_fs().cat_file(url + "a.bin", 2, 5) == b"234"
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_server_process_that_fails_reports_its_stderr():
    with pytest.raises(ServerStartError, match="exited with 2 before printing its URL(.|\n)*invalid choice"):
        ServerProcess(["no-such-kind"]).start()


def test_http_server_process_port_in_use_is_reported(http_server):
    with pytest.raises(ServerStartError, match="Address already in use"):
        HTTPServerProcess(http_server.root, port=http_server.port).start()


# ---------------------------------------------------------------------------
# S3: moto through s3fs
# ---------------------------------------------------------------------------


def _s3fs(endpoint_url: str, *, retries: bool = False, read_timeout: float = 2):
    """An s3fs client; without retries, one request per call (botocore and s3fs both retry by default)."""
    import s3fs

    opts = s3_storage_options(endpoint_url)
    if not retries:
        opts["config_kwargs"] = {"retries": {"total_max_attempts": 1}, "read_timeout": read_timeout, "connect_timeout": 2}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
    if not retries:
        fs.retries = 1  # s3fs's own retry loop around botocore's (a class attribute, not an argument)
    return fs


def test_s3_put_get_range_against_moto(moto_s3, s3_bucket):
    assert moto_s3.startup_seconds < 30
    fs = _s3fs(moto_s3.endpoint_url)
    key = f"{s3_bucket[5:]}/ds/shard-00000.arrow"
    fs.pipe_file(key, DATA)
    assert fs.info(key)["size"] == len(DATA)
    assert fs.cat_file(key) == DATA
    assert fs.cat_file(key, start=1000, end=3000) == DATA[1000:3000]  # keywords: s3fs's 2nd parameter is version_id
    assert fs.ls(f"{s3_bucket[5:]}/ds") == [key]
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"{s3_bucket[5:]}/ds/missing")


def test_s3_environment_alone_reaches_moto(moto_s3, s3_bucket):
    """The moto_s3 fixture's environment (AWS_ENDPOINT_URL, credentials, region) is enough for s3fs."""
    import s3fs

    _s3fs(moto_s3.endpoint_url).pipe_file(f"{s3_bucket[5:]}/x", b"hello")
    assert s3fs.S3FileSystem(skip_instance_cache=True).cat_file(f"{s3_bucket}/x") == b"hello"


def test_s3_faults_through_the_proxy(moto_s3, s3_bucket, s3_proxy):
    key = f"{s3_bucket[5:]}/shard.bin"
    _s3fs(moto_s3.endpoint_url).pipe_file(key, DATA)
    fs = _s3fs(s3_proxy.endpoint_url)
    assert fs.cat_file(key, start=10, end=20) == DATA[10:20]

    s3_proxy.fail_every(1, 500, pattern="shard")
    with pytest.raises(OSError) as info:
        fs.cat_file(key, start=0, end=10)
    assert info.value.errno == errno.EREMOTEIO and "fault injected by the test server (500)" in str(info.value)
    s3_proxy.reset()
    s3_proxy.throttle(503, times=1)
    with pytest.raises(OSError) as info:
        fs.cat_file(key, start=0, end=10)
    assert info.value.errno == errno.EBUSY and "(503)" in str(info.value)

    s3_proxy.truncate("shard")
    with pytest.raises(aiohttp.ClientPayloadError):
        fs.cat_file(key, start=0, end=100_000)

    s3_proxy.corrupt("shard")  # a range has no checksum: the bytes are silently wrong
    got = fs.cat_file(key, start=0, end=100)
    assert len(got) == 100 and got != DATA[:100]
    s3_proxy.corrupt("shard")  # a whole object is checked by botocore against the CRC stored at upload
    from botocore.exceptions import FlexibleChecksumError

    with pytest.raises(FlexibleChecksumError):
        fs.cat_file(key)
    assert fs.cat_file(key) == DATA


def test_s3_outage_and_return_keep_moto_data(moto_s3, s3_bucket, s3_proxy):
    from botocore.exceptions import EndpointConnectionError

    key = f"{s3_bucket[5:]}/shard.bin"
    _s3fs(moto_s3.endpoint_url).pipe_file(key, DATA)
    fs = _s3fs(s3_proxy.endpoint_url)
    assert fs.cat_file(key, start=0, end=10) == DATA[:10]
    s3_proxy.stop()
    with pytest.raises(EndpointConnectionError, match=s3_proxy.endpoint_url):
        fs.cat_file(key, start=0, end=10)
    s3_proxy.start()
    assert fs.cat_file(key) == DATA


def test_s3_hang_hits_the_botocore_read_timeout(moto_s3, s3_bucket, s3_proxy):
    from botocore.exceptions import ReadTimeoutError

    key = f"{s3_bucket[5:]}/shard.bin"
    _s3fs(moto_s3.endpoint_url).pipe_file(key, DATA)
    fs = _s3fs(s3_proxy.endpoint_url, read_timeout=0.5)
    s3_proxy.hang("shard")
    with pytest.raises(ReadTimeoutError):
        fs.cat_file(key, start=0, end=10)
    s3_proxy.release()


def test_moto_restart_keeps_the_port_but_not_the_data(moto_s3):
    with MotoS3Server() as server:
        server.create_bucket("restart-check")
        endpoint = server.endpoint_url
        server.stop()
        server.start()
        assert server.endpoint_url == endpoint
        assert server.client().list_buckets()["Buckets"] == []


def test_files_are_served_from_root_only(http_server: FaultyHTTPServer):
    assert isinstance(http_server.root, Path)
    (http_server.root.parent / "secret").write_bytes(b"no")
    assert _raw_get(http_server, "/../secret")[0] == 404
    assert _raw_get(http_server, "/%2e%2e/secret")[0] == 404
