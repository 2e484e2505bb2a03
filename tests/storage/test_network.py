"""What comes from outside is bounded: credentials stay with their origin, proxies carry every request,
and no server can make a download pass its shard's size, the cache pass its limit, or a manifest pass its cap.

Real servers on 127.0.0.1 (tests/servers.py): the dataset's server, a second one on another port (another
origin) that redirects lead to, an https one (a test certificate authority the client trusts through
``SSL_CERT_FILE``), a forward proxy that logs what it carried, and servers that send more than asked for.
"""

from __future__ import annotations

import os
import tracemalloc

import pytest

import chute
from tests.servers import FaultyHTTPServer, ForwardProxy, s3_storage_options, server_tls, tls_files
from tests.storage._helpers import (
    CacheChecker,
    assert_same_epoch,
    chute_threads,
    epoch_columns,
    fast_retries,
    loader,
    local_epochs,
    part_files,
    shard_gets,
    write_dataset,
)

CREDENTIALS = {"Authorization": "Bearer secret-token", "Cookie": "session=secret"}
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def no_proxies(monkeypatch) -> None:
    """No proxy variable from the environment the tests run in: each test sets its own."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[str, dict]:
    root = str(tmp_path_factory.mktemp("net-reference") / "ds")
    write_dataset(root, n=1000)
    return root, local_epochs(root, 1)[0]


@pytest.fixture
def served(http_server, reference, no_proxies) -> str:
    write_dataset(str(http_server.root / "ds"), n=1000)  # ~13 shards of ~21 KB
    return http_server.url + "ds"


@pytest.fixture
def other_server(http_server) -> FaultyHTTPServer:
    """A second server over the same files, on another port: another origin."""
    with FaultyHTTPServer(http_server.root) as other:
        yield other
    assert not other.errors, other.errors


@pytest.fixture
def tls(tmp_path, monkeypatch) -> tuple[str, object]:
    """A test certificate authority the client trusts (``SSL_CERT_FILE``); ``(ca, server context)``."""
    pytest.importorskip("cryptography")
    ca, cert, key = tls_files(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", ca)
    return ca, server_tls(cert, key)


@pytest.fixture
def tls_server(tmp_path, tls, reference, no_proxies) -> FaultyHTTPServer:
    root = tmp_path / "tls-www"
    root.mkdir()
    write_dataset(str(root / "ds"), n=1000)
    with FaultyHTTPServer(root, tls=tls[1]) as server:
        yield server
    assert not server.errors, server.errors


# ---------------------------------------------------------------------------
# Redirects: credentials never cross origins, https is never followed to http
# ---------------------------------------------------------------------------


def test_a_redirect_to_another_origin_never_carries_the_user_s_credentials(http_server, other_server, served, reference, tmp_path):
    http_server.redirect(other_server.url, r"^/ds/shard-")  # every shard GET goes to the other port
    ds = chute.open(served, cache_dir=tmp_path / "cache", storage_options={"headers": {**CREDENTIALS, "X-Trace": "t1"}})
    assert_same_epoch(epoch_columns(loader(ds)), reference[1])
    assert sorted(shard_gets(other_server)) == sorted(s.file for s in ds.shards)
    for request in other_server.requests:
        assert request.header("Authorization") is None and request.header("Cookie") is None, request
        assert request.header("X-Trace") == "t1"  # other headers follow the redirect
    here = http_server.requests
    assert len(here) == 1 + len(ds.shards) and all(r.header("Authorization") == CREDENTIALS["Authorization"] for r in here)


def test_a_redirect_within_the_origin_keeps_the_credentials(http_server, served, reference, tmp_path):
    os.symlink(http_server.root, http_server.root / "alias")  # /alias/ds/... serves the same files
    http_server.redirect(http_server.url + "alias", r"^/ds/shard-")
    ds = chute.open(served, cache_dir=tmp_path / "cache", storage_options={"headers": CREDENTIALS})
    assert_same_epoch(epoch_columns(loader(ds)), reference[1])
    moved = [r for r in http_server.requests if r.path.startswith("/alias/")]
    assert len(moved) == len(ds.shards) and all(r.header("Cookie") == CREDENTIALS["Cookie"] for r in moved)


def test_a_redirect_from_https_to_http_is_refused_and_not_retried(tls_server, other_server, tmp_path):
    tls_server.redirect(other_server.url, "manifest.json")
    with pytest.raises(chute.RemoteError) as info:
        chute.open(tls_server.url + "ds", cache_dir=tmp_path / "cache", storage_options={"headers": CREDENTIALS})
    message = str(info.value)
    assert "from https to http" in message and "not retried" in message and other_server.url.rstrip("/") in message
    assert other_server.requests == []  # nothing was sent there
    assert tls_server.count("manifest.json") == 1


def test_https_datasets_are_read_with_the_trusted_certificates(tls_server, reference, tmp_path, monkeypatch):
    ds = chute.open(tls_server.url + "ds", cache_dir=tmp_path / "cache")
    assert_same_epoch(epoch_columns(loader(ds)), reference[1])
    from chute.storage.net.pools import pools

    monkeypatch.delenv("SSL_CERT_FILE")  # the system's certificates do not know the test authority
    pools().clear()  # (a connection kept alive was verified when it was made)
    with pytest.raises(chute.RemoteError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        chute.open(tls_server.url + "ds", cache_dir=tmp_path / "cache2")


# ---------------------------------------------------------------------------
# Proxies: every request through the proxy the environment names, NO_PROXY honoured
# ---------------------------------------------------------------------------


def test_with_http_proxy_set_every_request_goes_through_the_proxy(http_server, served, reference, tmp_path, monkeypatch):
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:p%40ss@"))
        ds = chute.open(served, cache_dir=tmp_path / "cache")
        assert_same_epoch(epoch_columns(loader(ds)), reference[1])
        carried = [r.target for r in proxy.log]
        assert all(r.method == "GET" for r in proxy.log)
        assert carried[0] == served + "/manifest.json"
        assert sorted(carried[1:]) == sorted(f"{served}/{s.file}" for s in ds.shards)
        assert len(http_server.requests) == len(carried)  # the server saw nothing that did not pass the proxy
        assert {r.header("Proxy-Authorization") for r in proxy.log} == {"Basic dXNlcjpwQHNz"}  # user:p@ss, to the proxy
        assert all(r.header("Proxy-Authorization") is None for r in http_server.requests)


def test_no_proxy_is_honoured(http_server, served, reference, tmp_path, monkeypatch):
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        ds = chute.open(served, cache_dir=tmp_path / "cache")
        assert_same_epoch(epoch_columns(loader(ds)), reference[1])
        assert proxy.log == [] and len(http_server.requests) == 1 + len(ds.shards)


def test_https_goes_through_the_proxy_s_connect_tunnel(tls_server, reference, tmp_path, monkeypatch):
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        ds = chute.open(tls_server.url + "ds", cache_dir=tmp_path / "cache", storage_options={"headers": CREDENTIALS})
        assert_same_epoch(epoch_columns(loader(ds)), reference[1])
        assert proxy.log and {(r.method, r.target) for r in proxy.log} == {("CONNECT", f"127.0.0.1:{tls_server.port}")}
        assert all(r.header("Authorization") is None for r in proxy.log)  # the credentials travel inside the tunnel
        assert len(tls_server.requests) == 1 + len(ds.shards)


def test_presigned_s3_gets_go_through_the_proxy(moto_s3, s3_bucket, tmp_path, monkeypatch, no_proxies):
    url = s3_bucket + "/ds"
    write_dataset(url, n=1000)
    with ForwardProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=moto_s3.storage_options)
        assert ds.cache.remote.s3_mode == "presigned"
        assert len(epoch_columns(loader(ds))["y"]) == 1000
        shards = [r.target for r in proxy.log if "/shard-" in r.target]
        assert len(shards) == len(ds.shards) and all("Signature=" in t for t in shards)
        assert any(r.target.split("?")[0].endswith("/ds/manifest.json") for r in proxy.log)


def test_a_proxy_that_does_not_answer_is_named(served, tmp_path, monkeypatch):
    with ForwardProxy() as proxy:
        dead = proxy.url
    monkeypatch.setenv("HTTP_PROXY", dead)  # nothing listens there now
    with pytest.raises(chute.RemoteError) as info:
        chute.open(served, cache_dir=tmp_path / "cache", retries=1)
    message = str(info.value)
    assert served + "/manifest.json" in message and "check the proxy the environment names (HTTP_PROXY" in message


_CONNECTIONS_CHILD = """
import gc, sys
import chute
from chute.storage.net.remote import Remote
from tests.storage._helpers import epoch_columns, loader
url, cache = sys.argv[1], sys.argv[2]
def say(what):
    print(what, flush=True)
    sys.stdin.readline()
ds, other = chute.open(url, cache_dir=cache + "1"), chute.open(url, cache_dir=cache + "2")
ld = loader(ds)
epoch_columns(ld)
ld.close()
say("read")
other.cache.remote.close()
say("one closed")
ds.cache.remote.close()
say("both closed")
remote = Remote(url)
remote.read("manifest.json")
say("read again")
del remote
gc.collect()
say("collected")
"""


def test_a_process_done_with_its_remote_datasets_keeps_no_connection_open(http_server, served, tmp_path):
    """Connections are kept alive in the process's pools while a dataset uses them, and closed once none
    does (its remote closed, or collected): the test server sees its client, a process of its own, hang up."""
    import subprocess
    import sys

    from tests.servers import REPO_ROOT

    child = subprocess.Popen([sys.executable, "-c", _CONNECTIONS_CHILD, served, str(tmp_path / "cache")], cwd=REPO_ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    try:
        want = {"read": False, "one closed": False, "both closed": True, "read again": False, "collected": True}
        for line, closed in want.items():
            assert child.stdout.readline().strip() == line
            # kept alive for the next request while a dataset uses them (not closed within 0.5 s), else closed
            assert http_server.wait_connections(0, timeout=30 if closed else 0.5) is closed, line
            child.stdin.write("\n")
            child.stdin.flush()
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        child.stdin.close()
        child.stdout.close()


# ---------------------------------------------------------------------------
# S3 GETs that need more than a URL: signed by botocore, sent by chute's layer
# ---------------------------------------------------------------------------


def test_s3_gets_with_extra_arguments_are_signed_by_botocore_and_sent_by_chute(moto_s3, s3_bucket, s3_proxy, tmp_path):
    url = s3_bucket + "/ds"
    write_dataset(url, n=1000)
    options = dict(s3_storage_options(s3_proxy.endpoint_url), requester_pays=True)
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=options)
    assert ds.cache.remote.s3_mode == "signed"
    assert len(epoch_columns(loader(ds))["y"]) == 1000
    gets = [r for r in s3_proxy.requests if "/shard-" in r.path]
    assert len(gets) == len(ds.shards)
    for request in gets:
        assert request.header("x-amz-request-payer") == "requester"
        assert request.header("Authorization").startswith("AWS4-HMAC-SHA256 ") and "X-Amz-Signature" not in request.path


# ---------------------------------------------------------------------------
# Bodies bounded by the manifest, the cache by its limit
# ---------------------------------------------------------------------------


@pytest.fixture
def big_shards(http_server, no_proxies) -> tuple[str, list[dict]]:
    """~400 kB shards (three of them) on the HTTP server; (url, the local epoch unshuffled)."""
    root = http_server.root / "big"
    write_dataset(str(root), n=4500, shard_size=400_000)
    return http_server.url + "big", local_epochs(str(root), 1, shuffle=False)


@pytest.mark.parametrize("how", ["no-length", "huge-length"])
def test_a_server_sending_64_mb_for_a_400_kb_shard_never_passes_the_cache_limit(http_server, big_shards, tmp_path, how):
    url, want = big_shards
    cache = str(tmp_path / "cache")
    ds = chute.open(url, cache_dir=cache, cache_limit=900_000, retries=2)
    assert 380_000 < max(s.bytes for s in ds.shards) <= 450_000 and len(ds.shards) >= 3
    bad = ds.shards[1].file
    http_server.oversend(bad, extra=64 << 20, how=how)
    with CacheChecker(cache, 900_000) as checker, loader(ds, shuffle=False) as ld:
        with pytest.raises(chute.RemoteError) as info:
            epoch_columns(ld)
    checker.assert_held()
    message = str(info.value)
    assert f"{url}/{bad} failed after 2 attempts" in message and "sent more than the" in message
    assert shard_gets(http_server)[bad] == 2
    assert part_files(cache) == [] and chute_threads() == []


@pytest.mark.parametrize("how", ["no-length", "huge-length"])
def test_a_server_over_sending_once_is_retried_and_the_epoch_is_exact(http_server, big_shards, tmp_path, how):
    url, want = big_shards
    cache = str(tmp_path / "cache")
    ds = chute.open(url, cache_dir=cache, cache_limit=900_000)
    fast_retries(ds)
    http_server.oversend(ds.shards[0].file, extra=64 << 20, how=how, times=1)
    with CacheChecker(cache, 900_000) as checker:
        assert_same_epoch(epoch_columns(loader(ds, shuffle=False)), want[0])
    checker.assert_held()
    assert ds.cache.stats()["retries"] == 1 and ds.cache.stats()["checksum_failures"] == 0


@pytest.mark.parametrize("how", ["long-range", "wrong-range"])
def test_a_206_is_checked_against_the_range_asked_for(http_server, big_shards, tmp_path, how):
    url, want = big_shards
    cache = str(tmp_path / "cache")
    ds = chute.open(url, cache_dir=cache, cache_limit=900_000)
    fast_retries(ds)
    ds.cache.remote.whole_max = ds.cache.remote.part_size = 100_000  # every shard in ranges of 100 kB
    http_server.oversend(ds.shards[2].file, extra=1 << 20, how=how, times=2)
    with CacheChecker(cache, 900_000) as checker:
        assert_same_epoch(epoch_columns(loader(ds, shuffle=False)), want[0])
    checker.assert_held()
    assert ds.cache.stats()["retries"] == 2 and ds.cache.remote.ranges is True


def test_a_zstd_shard_that_inflates_past_its_size_is_never_written_past_it(http_server, tmp_path, no_proxies):
    zstandard = pytest.importorskip("zstandard")
    root = http_server.root / "z"
    write_dataset(str(root), n=4500, shard_size=400_000, compression="zstd")
    ds = chute.open(http_server.url + "z", cache_dir=tmp_path / "cache", cache_limit=900_000, retries=2)
    bomb = ds.shards[0]  # replaced by 2 kB that inflate to 64 MB
    (root / bomb.stored_file).write_bytes(zstandard.ZstdCompressor().compress(bytes(64 << 20)))
    with CacheChecker(str(tmp_path / "cache"), 900_000) as checker:
        with pytest.raises(chute.RemoteError, match="decompresses to more than the [0-9,]+ bytes the manifest gives it"):
            epoch_columns(loader(ds, shuffle=False))
    checker.assert_held()
    assert part_files(str(tmp_path / "cache")) == []


# ---------------------------------------------------------------------------
# The manifest: a size cap, read as it streams
# ---------------------------------------------------------------------------


def _pad(manifest: str, size: int) -> None:
    """Pad a manifest file with trailing blanks to ``size`` bytes (still valid JSON)."""
    with open(manifest, "ab") as f:
        f.write(b" " * (size - os.path.getsize(manifest)))


def test_a_manifest_over_the_cap_is_a_manifest_error(http_server, served, tmp_path, monkeypatch):
    _pad(str(http_server.root / "ds" / "manifest.json"), 3_000_000)
    assert len(chute.open(served, cache_dir=tmp_path / "cache")) == 1000  # the default cap (64 MiB) reads it
    with pytest.raises(chute.ManifestError) as info:
        chute.open(served, cache_dir=tmp_path / "cache", manifest_limit="1MB")
    message = str(info.value)
    assert f"{served}/manifest.json is larger than 1,000,000 bytes" in message
    assert "manifest_limit=" in message and "CHUTE_MANIFEST_LIMIT" in message
    monkeypatch.setenv("CHUTE_MANIFEST_LIMIT", "2MB")
    with pytest.raises(chute.ManifestError, match="larger than 2,000,000 bytes"):
        chute.open(served, cache_dir=tmp_path / "cache")
    with pytest.raises(chute.ManifestError, match="larger than 2,000,000 bytes"):  # a local manifest too
        chute.open(http_server.root / "ds")
    monkeypatch.setenv("CHUTE_MANIFEST_LIMIT", "lots")
    with pytest.raises(ValueError, match="CHUTE_MANIFEST_LIMIT"):
        chute.open(served, cache_dir=tmp_path / "cache")


def test_a_huge_manifest_is_never_held_in_memory_past_the_cap(http_server, served):
    from chute.storage.net.remote import Remote, TooLarge

    _pad(str(http_server.root / "ds" / "manifest.json"), 40 << 20)
    remote = Remote(served)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge):
            remote.read("manifest.json", 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        remote.close()
    assert peak < 4 << 20, f"reading past a 1 MiB cap held {peak:,} bytes at once"
    assert http_server.count("manifest.json") == 1  # not retried
