"""How chute's downloads use the server: requests per shard, what runs before batch 0, which
threads download, the floor speed, and that closing leaves no download thread behind.

Everything is counted on the server's side (its request log) or from thread names; nothing
depends on how long anything takes.
"""

from __future__ import annotations

import os
import threading

import pytest

import chute
from chute.order import Order
from chute.storage.net import http as http_get, stream
from chute.storage.net.remote import StreamHash
from tests.servers import s3_storage_options
from tests.storage._helpers import (
    BATCH,
    SEED,
    chute_threads,
    epoch_columns,
    loader,
    part_files,
    shard_gets,
    write_dataset,
)


def checksum_bytes(data: bytes, algorithm: str) -> str:
    import hashlib

    import xxhash

    digest = xxhash.xxh3_128(data) if algorithm == "xxh3_128" else hashlib.blake2b(data, digest_size=16)
    return f"{algorithm}:{digest.hexdigest()}"


@pytest.fixture
def served(http_server) -> str:
    write_dataset(str(http_server.root / "ds"), n=1000)  # ~13 shards of ~21 KB
    return http_server.url + "ds"


@pytest.fixture
def on_s3(moto_s3, s3_bucket, s3_proxy, tmp_path) -> tuple[str, dict]:
    """A dataset in moto's S3, reached through the logging proxy; (url, storage_options)."""
    write_dataset(s3_bucket + "/ds", n=1000)
    s3_proxy.log.clear()
    return s3_bucket + "/ds", s3_storage_options(s3_proxy.endpoint_url)


def _download_threads(monkeypatch) -> list[str]:
    """The names of the threads that make streamed GETs from now on (fsspec's path and chute's HTTP client)."""
    names: list[str] = []
    for owner in (stream, http_get.Client):
        def spy(*args, real=owner.get, **kwargs):
            names.append(threading.current_thread().name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, "get", spy)
    return names


# ---------------------------------------------------------------------------
# Requests: one GET per shard, the manifest without a HEAD, batch 0's shards first
# ---------------------------------------------------------------------------


def test_http_epoch_makes_one_get_per_shard_and_downloads_on_chute_threads(http_server, served, tmp_path, monkeypatch):
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    assert [(r.method, r.path) for r in http_server.requests] == [("GET", "/ds/manifest.json")]  # no HEAD
    names = _download_threads(monkeypatch)
    epoch_columns(loader(ds))
    gets = shard_gets(http_server)
    assert sorted(gets) == sorted(s.file for s in ds.shards)
    assert set(gets.values()) == {1}  # whole-object GETs: one request per shard
    assert http_server.count(method="HEAD") == 0
    manifest = (http_server.root / "ds" / "manifest.json").stat().st_size
    assert http_server.bytes_sent == manifest + sum(s.bytes for s in ds.shards)  # the epoch downloaded 1.00x
    assert names and all(n.startswith("chute-") for n in names), names  # never the loop's thread


@pytest.mark.parametrize("how", ["whole", "ranged", "zstd"])
def test_a_downloaded_shard_is_hashed_once_by_the_download_check_not_again_when_mapped(http_server, tmp_path, monkeypatch, how):
    """Whole-object GETs are hashed as the bytes arrive (a compressed shard's as they are decompressed), ranged
    ones once the file is complete; either way the check is remembered for the reader, which does not hash the
    shard again."""
    from chute.format import manifest as manifest_module, validate

    if how == "zstd":
        pytest.importorskip("zstandard")
    write_dataset(str(http_server.root / how), n=1000, **({"compression": "zstd"} if how == "zstd" else {}))
    served = http_server.url + how
    ranged = how == "ranged"

    looked = []
    real = validate._read
    monkeypatch.setattr(validate, "_read", lambda path: looked.append(path) or real(path))
    hashed_files = []
    real_checksum_fd = manifest_module.checksum_fd
    monkeypatch.setattr(manifest_module, "checksum_fd", lambda fd, *a: hashed_files.append(fd) or real_checksum_fd(fd, *a))
    ds = chute.open(served, cache_dir=tmp_path / "cache")  # verify=True
    assert [s.compression for s in ds.manifest.shards] == ["zstd" if how == "zstd" else None] * len(ds.shards)
    if ranged:
        ds.cache.remote.whole_max = ds.cache.remote.part_size = 8192
    rows = epoch_columns(loader(ds))
    assert len(next(iter(rows.values()))) == len(ds) and ds.cache.stats()["shards_downloaded"] == len(ds.shards)
    assert ds._checks.hashed == 0  # each download's checksum check was remembered for the reader's mapping
    assert len(hashed_files) == (len(ds.shards) if ranged else 0)  # a file hashed only where no stream hash was taken
    assert looked == []  # in memory: the reader opened no marker file either (the markers are for other processes)
    other = chute.open(served, cache_dir=tmp_path / "cache")  # the next run's reader: no memory, the markers
    validate._REMEMBERED.clear()
    assert len(next(iter(epoch_columns(loader(other)).values()))) == len(ds)
    assert other._checks.hashed == 0 and len(looked) >= len(ds.shards)


@pytest.mark.parametrize("algorithm", ["xxh3_128", "blake2b"])
def test_a_download_is_hashed_as_it_arrives_only_from_bytes_fed_in_order(algorithm):
    data = bytes(range(256)) * 12
    want = checksum_bytes(data, algorithm)
    whole = StreamHash(algorithm)
    whole.feed(0, [data[:1000]])
    whole.feed(1000, [data[1000:2000], data[2000:]])
    assert whole.result(len(data)) == want
    again = StreamHash(algorithm)  # a retry starts the object over: so does the hash
    again.feed(0, [data[:1000]])
    again.feed(0, [data[:1500]])
    again.feed(1500, [data[1500:]])
    assert again.result(len(data)) == want
    gap = StreamHash(algorithm)  # bytes out of order: no checksum (the file is hashed instead)
    gap.feed(0, [data[:1000]])
    gap.feed(2000, [data[2000:]])
    gap.feed(1000, [data[1000:2000]])
    assert gap.result(len(data)) is None
    short = StreamHash(algorithm)
    short.feed(0, [data[:-1]])
    assert short.result(len(data)) is None


def test_a_download_is_written_exactly_in_aligned_writes_of_at_most_write_max(tmp_path, monkeypatch):
    """Chunks of any sizes, at any offset, land byte for byte; every write system call stays inside one
    WRITE_MAX-aligned stretch of the file (the page cache's folios stay that small), and a write the kernel
    takes only part of is finished."""
    import random

    from chute.storage.net import remote

    calls: list[tuple[int, int]] = []
    pwritev = os.pwritev

    def short_pwritev(fd, pieces, offset):  # records the call, and takes only part of every third one
        total = sum(len(p) for p in pieces)
        calls.append((offset, total))
        if len(calls) % 3 == 0 and total > 1:
            return pwritev(fd, [b"".join(pieces)[: total // 2]], offset)
        return pwritev(fd, pieces, offset)

    monkeypatch.setattr(remote.os, "pwritev", short_pwritev)
    rng = random.Random(0)
    for trial in range(60):
        monkeypatch.setattr(remote, "WRITE_MAX", rng.choice([1, 4096, 256 << 10]))
        chunks = [os.urandom(rng.randint(1, 300_000)) for _ in range(rng.randint(1, 5))]
        offset = rng.randint(0, 1 << 20)
        path = tmp_path / f"{trial}.part"
        calls.clear()
        with open(path, "wb") as f:
            remote._pwritev(f.fileno(), chunks, offset)
        assert path.read_bytes() == bytes(offset) + b"".join(chunks)
        for start, length in calls:
            assert 0 < length <= remote.WRITE_MAX
            assert start // remote.WRITE_MAX == (start + length - 1) // remote.WRITE_MAX


def test_s3_epoch_makes_one_get_per_shard_and_no_head(on_s3, s3_proxy, tmp_path):
    url, options = on_s3
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=options)
    assert s3_proxy.count("manifest.json", method=None) == 1  # one GET, no HEAD first
    epoch_columns(loader(ds))
    gets = shard_gets(s3_proxy)
    assert sorted(gets) == sorted(s.file for s in ds.shards)
    assert set(gets.values()) == {1}
    assert s3_proxy.count("shard-", method="HEAD") == 0


@pytest.mark.parametrize("client", ["presigned", "botocore", "fsspec"])
def test_s3_gets_run_on_chute_threads_with_any_client(on_s3, s3_proxy, tmp_path, monkeypatch, client):
    """By default S3 GETs are URLs presigned by botocore, fetched by chute's HTTP client in chute's threads
    (chute/storage/net/s3.py, chute/storage/net/http.py); CHUTE_S3_CLIENT=botocore reads botocore's own responses
    there, CHUTE_S3_CLIENT=fsspec keeps s3fs's event loop. The same bytes, one GET per shard, each way."""
    from chute.storage.net import s3

    monkeypatch.setenv("CHUTE_S3_CLIENT", "" if client == "presigned" else client)
    url, options = on_s3
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=options)
    assert (ds.cache.remote.s3_client is not None) == (client != "fsspec")
    assert ds.cache.remote.s3_mode == {"presigned": "presigned", "botocore": "botocore", "fsspec": None}[client]
    names: list[str] = []
    module = {"presigned": http_get.Client, "botocore": s3, "fsspec": stream}[client]

    def spy(*args, real=module.get, **kwargs):
        names.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "get", spy)
    epoch_columns(loader(ds))
    assert set(shard_gets(s3_proxy).values()) == {1}
    assert len(names) == len(ds.shards) and all(n.startswith("chute-") for n in names), names


def test_s3_gets_are_presigned_signed_by_botocore_or_botocore_s_own_as_the_options_need(monkeypatch):
    from chute.storage.net import s3

    monkeypatch.setenv("CHUTE_S3_CLIENT", "")
    assert s3.mode({"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}) == "presigned"
    assert s3.mode({"requester_pays": True}) == "signed"  # a header the URL cannot carry: signed by botocore, sent by chute
    assert s3.mode({"s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}}) == "signed"
    assert s3.mode({"config_kwargs": {"proxies": {"https": "http://proxy:3128"}}}) == "presigned"  # chute's layer takes them
    assert s3.proxies_of({"config_kwargs": {"proxies": {"https": "http://proxy:3128"}}}) == {"https": "http://proxy:3128"}
    assert s3.mode({"config_kwargs": {"proxies_config": {"proxy_ca_bundle": "/ca.pem"}}}) == "botocore"
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert s3.mode({}) == "presigned"  # the environment's proxies: chute's layer honours them as botocore does
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("CHUTE_S3_CLIENT", "botocore")
    assert s3.mode({}) == "botocore"
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ca.pem")
    assert s3.verify_of({}) == "/etc/ca.pem" and s3.verify_of({"client_kwargs": {"verify": False}}) is False


def test_s3_options_botocore_cannot_take_keep_the_fsspec_client():
    from chute.storage.net import s3
    from chute.storage.net.stream import Floor

    assert s3.client_for({"session": object()}, 8, Floor()) is None
    assert s3.client_for({"asynchronous": True}, 8, Floor()) is None
    client = s3.client_for({"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "eu-west-1"},
                            "config_kwargs": {"connect_timeout": 3}, "anon": False}, 4, Floor(rate=1, window=7))
    assert client.meta.endpoint_url == "http://127.0.0.1:9" and client.meta.region_name == "eu-west-1"
    assert client.meta.config.read_timeout == 7 and client.meta.config.connect_timeout == 3
    assert client.meta.config.max_pool_connections == 4 * 5
    assert s3.get_kwargs({"requester_pays": True, "s3_additional_kwargs": {"SSECustomerAlgorithm": "AES256"}}) == {
        "SSECustomerAlgorithm": "AES256", "RequestPayer": "requester"}


def test_batch_zero_shards_are_requested_before_any_read_ahead(http_server, served, tmp_path):
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    ld = loader(ds, shuffle=chute.Shuffle(window=2))
    uses = Order(tuple(s.rows for s in ds.shards), BATCH, shuffle=True, seed=SEED, window=2).shard_uses(0)
    first = {ds.shards[shard].file for step, _, shard in uses if step == uses[0][0]}
    epoch_columns(ld)
    requested = [r.path.rsplit("/", 1)[1] for r in http_server.requests if "shard-" in r.path]
    # the log is written when a response starts: no later shard was asked for before batch 0's were served
    assert set(requested[: len(first)]) == first
    assert http_server.requests[0].path == "/ds/manifest.json"


def test_ranged_downloads_split_a_shard_into_part_size_requests(http_server, served, tmp_path, monkeypatch):
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    remote = ds.cache.remote
    remote.whole_max = remote.part_size = 8192  # ~21 KB shards: 3 ranges each
    names = _download_threads(monkeypatch)
    epoch_columns(loader(ds))
    gets = shard_gets(http_server)
    for info in ds.shards:
        assert gets[info.file] == -(-info.bytes // 8192), info.file
    assert names and all(n.startswith("chute-") for n in names), set(names)


# ---------------------------------------------------------------------------
# Closing joins every thread it started
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 200_000])
def test_close_mid_epoch_leaves_no_chute_thread_http_ranges(http_server, served, tmp_path, limit):
    ds = chute.open(served, cache_dir=tmp_path / "cache", cache_limit=limit)
    ds.cache.remote.whole_max = ds.cache.remote.part_size = 4096  # ranged downloads on chute-range threads
    ld = loader(ds, shuffle=chute.Shuffle(window=1))
    for k, _ in enumerate(ld):
        if k == 3:
            break  # downloads in flight
    ld.close()
    ds.close()
    assert chute_threads() == []
    assert part_files(str(tmp_path / "cache")) == []


def test_close_mid_epoch_leaves_no_chute_thread_s3_ranges(on_s3, tmp_path):
    url, options = on_s3
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=options)
    ds.cache.remote.whole_max = ds.cache.remote.part_size = 4096
    ld = loader(ds)
    for k, _ in enumerate(ld):
        if k == 3:
            break
    ld.close()
    ds.close()
    assert chute_threads() == []
    assert part_files(str(tmp_path / "cache")) == []


def test_cancelling_a_trickling_s3_download_ends_it_at_once(on_s3, s3_proxy, tmp_path):
    """A body arriving a byte at a time, no floor: cancelling the thread's requests ends the read
    (its socket is shut under it) and nothing is retried."""
    from chute.storage.net.remote import Cancelled

    url, options = on_s3
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=options, min_speed=0)
    remote, shard = ds.cache.remote, ds.shards[0]
    s3_proxy.trickle(shard.file, interval=5)  # a read blocks for seconds: shutting the socket ends it
    dest = tmp_path / "part"
    dest.write_bytes(b"")
    cancel, errors = threading.Event(), []

    def download() -> None:
        try:
            with remote.cancelled_by(cancel):
                remote.download(shard.file, str(dest), shard.bytes)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=download, name="chute-test-download")
    thread.start()
    for _ in range(600):  # the proxy logs the request once the body starts to flow
        if s3_proxy.count(shard.file) or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    assert thread.is_alive() and s3_proxy.count(shard.file) == 1
    remote.cancel(cancel)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the cancelled download did not end"
    assert len(errors) == 1 and isinstance(errors[0], Cancelled), errors
    assert s3_proxy.count(shard.file) == 1  # not retried
    ds.close()


# ---------------------------------------------------------------------------
# The floor speed, and errors that name the setting to change
# ---------------------------------------------------------------------------


def test_a_trickling_manifest_fails_at_the_floor_speed_naming_the_setting(http_server, served, tmp_path):
    http_server.trickle("manifest.json", interval=0.05)  # 20 bytes/s: never silent, never done
    with pytest.raises(chute.RemoteError) as info:
        chute.open(served, cache_dir=tmp_path / "cache", retries=2, min_speed="1KiB", min_speed_window=2)
    message = str(info.value)
    assert f"{served}/manifest.json failed after 2 attempts" in message
    assert "below the floor speed of 1,024 bytes/s over 2 s" in message
    assert "min_speed=" in message and "min_speed_window=" in message and "retries=N" in message
    assert http_server.count("manifest.json") == 2  # cancelled, retried once, then given up


def test_a_trickling_shard_fails_the_loader_without_the_watchdog(http_server, served, tmp_path):
    ds = chute.open(served, cache_dir=tmp_path / "cache", retries=3, min_speed=1000, min_speed_window=2)
    slow = ds.shards[0].file
    http_server.trickle(slow, interval=0.05)
    with loader(ds, watchdog=None) as ld, pytest.raises(chute.RemoteError) as info:
        epoch_columns(ld)
    message = str(info.value)
    assert f"{served}/{slow} failed after 3 attempts" in message and "floor speed" in message
    assert "min_speed=" in message
    assert shard_gets(http_server)[slow] == 3
    assert chute_threads() == []
    assert part_files(str(tmp_path / "cache")) == []


def test_a_trickling_s3_object_fails_at_the_floor_speed(on_s3, s3_proxy, tmp_path):
    url, options = on_s3
    s3_proxy.trickle("manifest.json", interval=0.05)
    with pytest.raises(chute.RemoteError) as info:
        chute.open(url, cache_dir=tmp_path / "cache", storage_options=options, retries=2, min_speed=1000, min_speed_window=2)
    assert f"{url}/manifest.json failed after 2 attempts" in str(info.value)
    assert "floor speed" in str(info.value)
    # the proxy logs a request once moto has answered it, which may be after the client gave up on it
    assert 1 <= s3_proxy.count("manifest.json") <= 2


def test_no_floor_with_min_speed_zero(http_server, served, tmp_path):
    http_server.trickle("manifest.json", interval=0.0005, times=1)  # slow, but it ends
    ds = chute.open(served, cache_dir=tmp_path / "cache", min_speed=0, min_speed_window=0.01)
    assert ds.cache.remote.retry.floor.active is False
    assert http_server.count("manifest.json") == 1


def test_an_outage_error_names_the_retry_setting(http_server, served, tmp_path):
    ds = chute.open(served, cache_dir=tmp_path / "cache", retries=2)
    http_server.stop()
    with loader(ds) as ld, pytest.raises(chute.RemoteError) as info:
        epoch_columns(ld)
    message = str(info.value)
    assert "failed after 2 attempts" in message
    assert "chute.open(..., retries=N) (now 2 attempts" in message


# ---------------------------------------------------------------------------
# Eviction: a shard this pass reads no more ranks by its first use in the next epoch
# ---------------------------------------------------------------------------


def test_next_use_ranks_a_finished_shard_by_its_use_in_the_next_epoch(http_server, served, tmp_path):
    from chute.storage.node.fetcher import Fetcher

    ds = chute.open(served, cache_dir=tmp_path / "cache")
    uses = [(0, 1, 0), (2, 3, 1)]  # this pass: shard 0 at steps 0-1, shard 1 at steps 2-3
    then = [(0, 0, 1), (1, 2, 2)]  # the next epoch: shard 1 first, then shard 2; shard 3 never
    fetcher = Fetcher(ds.cache, uses, threads=1, then=then)
    try:
        assert [fetcher.next_use(s) for s in range(4)] == [0, 2, 4 + 1, float("inf")]
        fetcher.received(1)  # the consumer is past shard 0's last use
        assert fetcher.next_use(0) == float("inf")  # not read in the next epoch either: evicted first
        fetcher.received(3)
        assert fetcher.next_use(1) == 4 + 0  # read first in the next epoch: kept longest
    finally:
        fetcher.close()
        ds.close()
    assert chute_threads() == []
