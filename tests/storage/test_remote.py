"""Remote datasets read against real servers (moto's S3, an HTTP server on 127.0.0.1).

The reference for every epoch is the same loader over the same dataset on local
disk: a remote epoch must equal it sample for sample (every column, exact values,
same order), whatever the network did meanwhile (outages, 5xx, cut or damaged
bodies). When a fault cannot be ridden out, the error names the URL and what
happened, and nothing is left behind: no download thread, no half-written file.
"""

from __future__ import annotations

import json
import os
import threading

import pyarrow as pa
import pytest

import chute
from tests.storage._helpers import (
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


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[str, list[dict]]:
    """A local dataset and its first two shuffled epochs (the expected values)."""
    root = str(tmp_path_factory.mktemp("reference") / "ds")
    write_dataset(root)
    return root, local_epochs(root, 2)


@pytest.fixture(params=["stdlib", "fsspec"])
def http_client(request, monkeypatch) -> str:
    """Which client makes the HTTP GETs: chute's own (chute/storage/net/http.py, the default) or fsspec's
    aiohttp loop (storage options only aiohttp takes, or CHUTE_HTTP_CLIENT=fsspec). Both must hold."""
    monkeypatch.setenv("CHUTE_HTTP_CLIENT", request.param)
    return request.param


@pytest.fixture
def served(http_server, reference) -> tuple[str, chute.Dataset]:
    """The reference dataset written again under the HTTP server's root; its URL."""
    write_dataset(str(http_server.root / "ds"))
    return http_server.url + "ds"


# ---------------------------------------------------------------------------
# Whole epochs equal local ones
# ---------------------------------------------------------------------------


def test_s3_epochs_equal_local_epochs(moto_s3, s3_bucket, reference, tmp_path, default_cache):
    _, want = reference
    url = s3_bucket + "/ds"
    written = write_dataset(url)
    assert written.root == url and len(written) == 4000
    assert not os.path.exists(default_cache)  # writing (and opening) touches no cache on disk
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=moto_s3.storage_options)
    assert not os.path.exists(tmp_path / "cache")  # nothing until a shard is read
    ld = loader(ds)
    for epoch in range(2):
        assert_same_epoch(epoch_columns(ld), want[epoch])
    stats = ds.cache.stats()
    assert stats["shards_downloaded"] == len(ds.shards)  # the second epoch came from the cache
    assert stats["bytes_downloaded"] == ds.nbytes
    ld.close()  # (its worker threads are kept across passes until then)
    assert chute_threads() == []


def test_cli_convert_to_s3_then_read_back(moto_s3, s3_bucket, tmp_path):
    import numpy as np

    from chute.cli import main

    data = np.arange(500 * 8, dtype=np.float32).reshape(500, 8)
    np.save(tmp_path / "a.npy", data)
    url = s3_bucket + "/converted"
    assert main(["convert", str(tmp_path / "a.npy"), url, "--shard-size", "4KB", "--quiet"]) == 0
    ds = chute.open(url, cache_dir=tmp_path / "cache")
    assert len(ds) == 500 and len(ds.shards) > 1
    got = epoch_columns(chute.Loader(ds, 64))
    assert got["data"].numpy().tolist() == data.tolist()
    keys = {o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=s3_bucket[5:])["Contents"]}
    assert keys == {"converted/manifest.json"} | {f"converted/{s.file}" for s in ds.manifest.shards}


def test_http_epochs_equal_local_epochs(http_server, served, reference, tmp_path, http_client):
    _, want = reference
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    assert (ds.cache.remote.http_client is not None) == (http_client == "stdlib")
    assert ds.root == served and len(ds) == 4000
    ld = loader(ds)
    for epoch in range(2):
        assert_same_epoch(epoch_columns(ld), want[epoch])
    gets = shard_gets(http_server)
    assert sorted(gets) == sorted(s.file for s in ds.manifest.shards)
    assert set(gets.values()) == {1}  # each shard once, over both epochs
    assert http_server.count("ds/manifest.json") == 1
    ld.close()  # (its worker threads are kept across passes until then)
    assert chute_threads() == []


# ---------------------------------------------------------------------------
# Faults the loader rides out
# ---------------------------------------------------------------------------


def test_server_stopped_mid_epoch_and_restarted(http_server, served, reference, tmp_path):
    _, want = reference
    ds = chute.open(served, cache_dir=tmp_path / "cache", cache_limit="300KB")  # ~25%: downloads stay ahead, not done
    sizes = [s.bytes for s in ds.manifest.shards]
    assert sum(sizes) > 4 * 300_000
    from chute.storage.net.remote import RetryPolicy

    ds.cache.remote.retry = RetryPolicy(attempts=40, base=0.05, cap=0.5)  # ~10 s of patience, checked often
    restart = threading.Timer(1.5, http_server.start)
    batches = []
    try:
        for step, batch in enumerate(loader(ds)):
            batches.append(batch)
            if step == 10:
                http_server.stop()  # refuses connections, cuts the live ones
                stopped_at = len(http_server.requests)
                restart.start()
    finally:
        restart.cancel()
        restart.join(10)
    assert http_server.serving
    assert_same_epoch(epoch_columns(batches), want[0])
    assert len(http_server.requests) > stopped_at  # the rest came after the restart
    assert ds.cache.stats()["retries"] > 0  # the outage was seen, and ridden out
    assert part_files(str(tmp_path / "cache")) == []
    assert chute_threads() == []


def test_every_third_request_fails_with_500(http_server, served, reference, tmp_path, http_client):
    _, want = reference
    http_server.fail_every(3)
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    fast_retries(ds)
    assert_same_epoch(epoch_columns(loader(ds)), want[0])
    failed = http_server.count(status=500)
    assert failed >= len(ds.shards) // 3
    assert ds.cache.stats()["retries"] == failed  # each 500 retried once, and nothing else was
    assert sum(shard_gets(http_server, status=200).values()) == len(ds.shards)


def test_truncated_download_is_retried(http_server, served, reference, tmp_path, http_client):
    _, want = reference
    http_server.truncate(r"shard-\d+", times=1)
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    fast_retries(ds)
    assert_same_epoch(epoch_columns(loader(ds)), want[0])
    stats = ds.cache.stats()
    assert stats["retries"] == 1 and stats["checksum_failures"] == 0
    assert sorted(shard_gets(http_server).values()) == [1] * (len(ds.shards) - 1) + [2]


def test_corrupted_download_is_fetched_again(http_server, served, reference, tmp_path, caplog):
    _, want = reference
    http_server.corrupt(r"shard-\d+", times=1)  # same length, one byte flipped
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    assert_same_epoch(epoch_columns(loader(ds)), want[0])
    stats = ds.cache.stats()
    assert stats["checksum_failures"] == 1 and stats["retries"] == 0
    gets = shard_gets(http_server)
    twice = [name for name, n in gets.items() if n == 2]
    assert len(twice) == 1 and sorted(gets.values()) == [1] * (len(ds.shards) - 1) + [2]
    assert any(twice[0] in r.getMessage() and "checksum" in r.getMessage() for r in caplog.records)


def test_shard_corrupted_every_time_is_a_shard_error(http_server, served, tmp_path, no_fd_leak):
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    bad = ds.manifest.shards[7].file
    http_server.corrupt(bad, times=1000)
    with loader(ds) as ld, pytest.raises(chute.ShardError) as info:
        epoch_columns(ld)
    message = str(info.value)
    assert f"{served}/{bad}" in message and "twice" in message and "checksum" in message
    assert shard_gets(http_server)[bad] == 2  # fetched once more after the first mismatch, then reported
    assert ds.cache.stats()["checksum_failures"] == 2
    assert part_files(str(tmp_path / "cache")) == []  # nothing half-written left
    assert not os.path.exists(ds.cache.path(7))
    assert chute_threads() == []


# ---------------------------------------------------------------------------
# Faults that end the epoch, with a clear error and nothing left behind
# ---------------------------------------------------------------------------


def test_retry_budget_exhausted_names_url_error_and_attempts(http_server, served, tmp_path, no_fd_leak):
    ds = chute.open(served, cache_dir=tmp_path / "cache", retries=2)
    http_server.stop()  # for good
    with loader(ds) as ld, pytest.raises(chute.RemoteError) as info:
        for _ in ld:
            pass
    message = str(info.value)
    assert served + "/shard-" in message
    assert "failed after 2 attempts" in message
    assert "Cannot connect" in message or "Connect" in message  # the client's own error, named
    assert chute_threads() == []  # the downloader's threads stopped with the loader
    assert part_files(str(tmp_path / "cache")) == []
    assert ds.cache.stats()["shards_downloaded"] == 0


def test_missing_manifest_is_a_manifest_error_naming_the_url(http_server, moto_s3, s3_bucket, tmp_path):
    with pytest.raises(chute.ManifestError) as info:
        chute.open(http_server.url + "nothing-here", cache_dir=tmp_path / "cache")
    assert f"{http_server.url}nothing-here/manifest.json does not exist" in str(info.value)
    assert http_server.count("nothing-here/manifest.json") == 1  # a 404 is not retried
    with pytest.raises(chute.ManifestError) as info:
        chute.open(s3_bucket + "/nothing-here", cache_dir=tmp_path / "cache")
    assert f"{s3_bucket}/nothing-here/manifest.json does not exist" in str(info.value)


def test_missing_shard_is_not_found_and_not_retried(http_server, served, tmp_path, no_fd_leak):
    ds = chute.open(served, cache_dir=tmp_path / "cache")  # default retries: 8 attempts for transient errors
    gone = ds.manifest.shards[5].file
    os.unlink(http_server.root / "ds" / gone)
    with loader(ds) as ld, pytest.raises(chute.RemoteError) as info:
        epoch_columns(ld)
    message = str(info.value)
    assert f"{served}/{gone}" in message and "not found" in message
    assert shard_gets(http_server)[gone] == 1
    assert http_server.count(gone, status=404) == 1
    assert part_files(str(tmp_path / "cache")) == []
    assert chute_threads() == []


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_objects_deleted_mid_epoch_surface_as_not_found_as_soon_with_worker_processes(http_server, tmp_path, workers):
    """The server holds back the GETs of shards 4 and later, so that what is downloaded when the objects
    go is the same for both kinds of worker: shards 0-3. Their batches may be delivered; none that reads
    a deleted shard is; the error is the 404's, not retried, with either kind."""
    write_dataset(str(http_server.root / "ds"), n=1000)
    ds = chute.open(http_server.url + "ds", cache_dir=tmp_path / "cache")
    kept = 4
    http_server.hang("|".join(s.file for s in ds.shards[kept:]))
    ld = loader(ds, shuffle=False, **({"workers": chute.Workers("processes", count=2)} if workers == "processes" else {}))
    delivered = 0
    with pytest.raises(chute.RemoteError) as info:
        for step, _ in enumerate(ld):
            delivered += 1
            if step == 0:
                for s in ds.shards[kept:]:
                    os.unlink(http_server.root / "ds" / s.file)
                http_server.release()  # the held GETs are answered now: 404
    assert "not found" in str(info.value)
    assert delivered <= sum(s.rows for s in ds.shards[:kept]) // 32  # no batch of a deleted shard
    assert ds.cache.stats()["retries"] == 0
    gets = shard_gets(http_server)
    assert all(gets[s.file] <= 1 for s in ds.shards[kept:])  # each 404 once: not retried
    ld.close()
    assert chute_threads() == []


def pool_threads() -> dict[str, threading.Thread]:
    return {t.name: t for t in threading.enumerate() if t.name.startswith("chute-procs")}


def test_worker_processes_keep_their_receiver_and_gate_threads_across_remote_passes(served, reference, tmp_path):
    """With worker processes this process holds the shards, and a gate thread passes a step on to the receiver
    once they are held: both threads are the pool's, kept across passes, and every pass is exact."""
    _, want = reference
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    ld = loader(ds, workers=chute.Workers("processes", count=2))
    try:
        assert_same_epoch(epoch_columns(ld), want[0])
        kept = pool_threads()
        assert sorted(kept) == ["chute-procs-g0", "chute-procs-r0"]
        it = iter(ld)
        next(it)
        it.close()  # left early: the next pass runs epoch 1 again, from its start
        assert_same_epoch(epoch_columns(ld), want[1])
        assert pool_threads() == kept
    finally:
        ld.close()
    assert chute_threads() == [] and not any(t.is_alive() for t in kept.values())
    assert part_files(str(tmp_path / "cache")) == []


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_the_wait_for_shards_counts_as_the_reads_wait_with_either_kind_of_worker(served, reference, tmp_path, workers):
    """A cold epoch waits for its first shards: with worker threads each batch's task waits, with worker
    processes this process's gate does before it sends the step (chute.storage.node.gate); either way the
    report's counters have it as the read stage's wait for its input, not as work nor as nothing."""
    _, want = reference
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    ld = loader(ds, **({"workers": chute.Workers("processes", count=2)} if workers == "processes" else {}))
    try:
        assert_same_epoch(epoch_columns(ld), want[0])
        read = ld.counters.stage("read").totals()
        assert read.wait_in_ns > 0 and read.items > 0
    finally:
        ld.close()
    assert chute_threads() == []


# ---------------------------------------------------------------------------
# Compressed shards, resume
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["s3", "local"])
def test_zstd_shards_are_decompressed_into_the_cache(where, request, reference, tmp_path):
    pytest.importorskip("zstandard")
    _, want = reference
    if where == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        moto = request.getfixturevalue("moto_s3")
        url = bucket + "/zds"
    else:
        url = str(tmp_path / "zds")
    written = write_dataset(url, compression="zstd")
    ds = chute.open(url, cache_dir=tmp_path / "cache")
    # the manifest lists each shard's compression and stored size
    if where == "s3":
        text = moto.client().get_object(Bucket=bucket[5:], Key="zds/manifest.json")["Body"].read()
        keys = {o["Key"][4:] for o in moto.client().list_objects_v2(Bucket=bucket[5:])["Contents"]}
    else:
        text = open(os.path.join(url, "manifest.json"), "rb").read()
        keys = set(os.listdir(url)) - {".chute-write.lock"}
    entries = json.loads(text)["shards"]
    assert entries and all(e["compression"] == "zstd" and 0 < e["stored_bytes"] for e in entries)
    assert keys == {"manifest.json"} | {e["file"] + ".zst" for e in entries}  # only compressed shards are stored
    assert [s.compression for s in ds.manifest.shards] == ["zstd"] * len(entries)
    assert len(written) == 4000
    assert_same_epoch(epoch_columns(loader(ds)), want[0])
    # the cache holds every shard decompressed: a plain Arrow IPC file, as the manifest describes it
    cached = sorted(os.listdir(ds.cache.dir))
    assert sorted(n for n in cached if n.endswith(".arrow")) == sorted(s.file for s in ds.manifest.shards)
    assert not [n for n in cached if n.endswith((".zst", ".part"))]
    for i, info in enumerate(ds.manifest.shards):
        assert os.path.getsize(ds.cache.path(i)) == info.bytes
        with pa.memory_map(ds.cache.path(i)) as source:
            assert pa.ipc.open_file(source).read_all().num_rows == info.rows
    stats = ds.cache.stats()
    assert stats["bytes_downloaded"] == sum(s.stored_bytes for s in ds.manifest.shards)
    ds.verify()  # every cached shard matches the manifest's checksum of the decompressed bytes
    assert ds.cache.stats()["shards_downloaded"] == len(ds.shards)  # verify read the cache, downloaded nothing


def test_resume_from_a_remote_state_equals_the_local_rest(http_server, served, reference, tmp_path):
    _, want = reference
    k = 40
    ds = chute.open(served, cache_dir=tmp_path / "first")
    ld = loader(ds)
    head = []
    for batch in ld:
        head.append(batch)
        if len(head) == k:
            break
    state = ld.state_dict()
    assert state["consumed"] == k * 32
    again = chute.open(served, cache_dir=tmp_path / "second")  # another machine: a cold cache
    resumed = loader(again)
    resumed.load_state_dict(state)
    rest = epoch_columns(resumed)
    whole = {name: (col[: k * 32], col[k * 32 :]) for name, col in want[0].items()}
    assert_same_epoch(epoch_columns(head), {name: parts[0] for name, parts in whole.items()})
    assert_same_epoch(rest, {name: parts[1] for name, parts in whole.items()})
    assert resumed.epoch == 1
    ld.close()  # (its worker threads are kept across passes until then)
    resumed.close()
    assert chute_threads() == []


# ---------------------------------------------------------------------------
# Classification of errors: what is retried, what fails at once
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("client", ["presigned", "botocore"])
def test_a_corrupted_s3_response_is_downloaded_again(moto_s3, s3_bucket, s3_proxy, reference, tmp_path, monkeypatch, client):
    """botocore's GETs check a whole object against the CRC stored at upload and raise its own
    FlexibleChecksumError: a damaged transfer, retried like one. Presigned GETs (the default) leave it
    to the manifest's checksum: the shard is downloaded again (as over HTTP)."""
    from tests.servers import s3_storage_options

    monkeypatch.setenv("CHUTE_S3_CLIENT", "botocore" if client == "botocore" else "")
    _, want = reference
    url = s3_bucket + "/ds"
    write_dataset(url)
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=s3_storage_options(s3_proxy.endpoint_url))
    fast_retries(ds)
    assert ds.cache.remote.s3_mode == client
    s3_proxy.corrupt(r"shard-\d+", times=2)
    assert_same_epoch(epoch_columns(loader(ds)), want[0])
    stats = ds.cache.stats()
    caught = stats["retries"] if client == "botocore" else stats["checksum_failures"]
    assert caught == 2 and stats["shards_downloaded"] == len(ds.shards)
    assert part_files(str(tmp_path / "cache")) == []


def test_backend_errors_are_classified_by_their_types():
    import aiohttp
    import botocore.exceptions as boto

    from chute.storage.net.remote import ShortRead, is_transient, unreachable

    wrapped = OSError("s3fs wraps it")
    wrapped.__cause__ = boto.FlexibleChecksumError(error_msg="CRC32 mismatch")
    for transient in (boto.FlexibleChecksumError(error_msg="x"), boto.ReadTimeoutError(endpoint_url="u"),
                      boto.EndpointConnectionError(endpoint_url="u"), boto.IncompleteReadError(actual_bytes=1, expected_bytes=2),
                      aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut"), ShortRead("short"),
                      ConnectionResetError(), TimeoutError(), wrapped):
        assert is_transient(transient), transient
    for permanent in (FileNotFoundError("x"), PermissionError("x"), boto.NoCredentialsError(), ValueError("bad url"),
                      boto.ParamValidationError(report="x"), KeyError("x")):
        assert not is_transient(permanent), permanent
    refused = aiohttp.ClientConnectorError(None, ConnectionRefusedError(111, "Connection refused"))
    assert unreachable(refused) == "connection refused" and is_transient(refused)  # an outage after success
    assert unreachable(aiohttp.ServerDisconnectedError()) is None


def test_a_server_that_refuses_connections_from_the_start_fails_at_once(http_server, tmp_path):
    from chute.storage.net.remote import Remote

    url = http_server.url + "ds"
    http_server.stop()  # nothing listens on that port
    remote = Remote(url)
    with pytest.raises(chute.RemoteError) as info:
        remote.read("manifest.json")
    message = str(info.value)
    assert f"{url}/manifest.json" in message and "cannot connect" in message and "not retried" in message
    assert "connection refused" in message
    assert remote.retries == 0
    with pytest.raises(chute.RemoteError, match="cannot connect"):
        chute.open(url, cache_dir=tmp_path / "cache")


def test_a_server_that_ignores_range_requests_gets_whole_object_downloads(http_server, served, reference, tmp_path, http_client, caplog):
    """Like `python -m http.server`: a ranged GET is answered 200 with the whole file."""
    import logging

    _, want = reference
    http_server.ignore_range("shard")
    ds = chute.open(served, cache_dir=tmp_path / "cache")
    ds.cache.remote.part_size = ds.cache.remote.whole_max = 4096  # every ~21 KB shard would be fetched as ranges
    with caplog.at_level(logging.INFO, logger="chute"):
        assert_same_epoch(epoch_columns(loader(ds)), want[0])
    stats = ds.cache.stats()
    assert stats["retries"] == 0 and stats["checksum_failures"] == 0
    assert ds.cache.remote.ranges is False
    gets = shard_gets(http_server)
    # the first shard(s) asked in ranges found out; every later shard came in one request
    assert sum(gets.values()) <= len(ds.shards) + 6 * ds.cache.remote.parallel
    assert sum(1 for n in gets.values() if n == 1) >= len(ds.shards) - ds.cache.remote.parallel
    assert any("ignored a Range request" in r.getMessage() for r in caplog.records)
    assert part_files(str(tmp_path / "cache")) == []
