"""The progressive mode, through ``chute.open(url, progressive=True, cache_limit=...)`` and a Loader.

The dataset is served by the real HTTP test server. What each epoch covers
depends on what the filler has downloaded, so the tests decide it: some shards
are put in the cache beforehand and every other shard GET is held by the
server (``hang``) until the test lets it through. Then

- epoch 0 covers exactly the shards cached when it started, each of their
  samples once, and ``progressive_epochs`` says so;
- once the filler has brought more, the next epoch covers more;
- with a limit smaller than the dataset the cache rotates and never holds more
  than the limit, every epoch still exactly once over its own shards;
- ``state_dict()`` mid-epoch resumes the same epoch over the same shards, also
  on a machine whose cache has none of them;
- the mode's misuses are refused with a message that says what to do.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

import chute
from chute.errors import ChuteError
from chute.storage.node import progressive
from tests.storage._helpers import (
    BATCH,
    cache_bytes,
    chute_threads,
    epoch_columns,
    loader,
    part_files,
    write_dataset,
)

ROWS = 1600  # ~21 shards of ~76 rows
SHARDS = r"/ds/shard-"  # the request paths of the dataset's shard files
WAIT_S = 60.0  # bound on every wait for the server or the filler


@pytest.fixture
def served(http_server) -> str:
    write_dataset(str(http_server.root / "ds"), ROWS)
    return http_server.url + "ds"


def row_ids(ds: chute.Dataset, shards: list[int]) -> list[int]:
    """The ``y`` values (global row numbers, see ``samples``) of ``shards``, sorted."""
    starts = [0]
    for info in ds.manifest.shards:
        starts.append(starts[-1] + info.rows)
    return sorted(y for i in shards for y in range(starts[i], starts[i + 1]))


def delivered(batches: list[dict]) -> list[int]:
    return epoch_columns(batches)["y"].tolist()


def prewarm(url: str, cache_dir: str, shards: list[int]) -> None:
    """Download ``shards`` into ``cache_dir`` (a plain, non-progressive open of the same dataset)."""
    ds = chute.open(url, cache_dir=cache_dir)
    try:
        for i in shards:
            ds.cache.acquire(i)
            ds.cache.release(i)
    finally:
        ds.cache.close()


def filler_waits(ld: chute.Loader, until, what: str) -> None:
    """Block until ``until(filler)`` holds, woken by each shard the progressive filler completes."""
    filler = ld._progressive.filler
    with filler.arrived:
        assert filler.arrived.wait_for(lambda: filler.error is not None or until(filler), WAIT_S), f"filler never {what}"
    assert filler.error is None, filler.error


def join_filler(timeout: float = WAIT_S) -> None:
    """Wait for the filler thread to end (it does once the whole dataset is in the cache)."""
    for thread in threading.enumerate():
        if thread.name == "chute-fill":
            thread.join(timeout)
            assert not thread.is_alive(), "the filler did not finish downloading the dataset"


def test_epoch_covers_the_shards_cached_when_it_starts_and_later_epochs_cover_more(http_server, served, tmp_path):
    cache_dir = str(tmp_path / "cache")
    local = chute.open(str(http_server.root / "ds"))
    n = len(local.shards)
    first = [0, 3, 5, 6]  # what the cache holds when training starts
    prewarm(served, cache_dir, first)
    http_server.hang(SHARDS)  # the filler gets nothing more for now
    ds = chute.open(served, progressive=True, cache_dir=cache_dir, cache_limit=2 * local.nbytes)
    ld = loader(ds)
    try:
        epoch0 = list(ld)
        assert http_server.wait_hung(1, WAIT_S)  # the filler asked for a shard and is held
        assert sorted(delivered(epoch0)) == row_ids(local, first)  # each sample of those shards, once
        assert delivered(epoch0) != sorted(delivered(epoch0))  # shuffled
        assert ld.progressive_epochs == [{
            "epoch": 0, "shards": 4, "samples": len(row_ids(local, first)), "new_shards": 4, "shard_ids": first,
        }]
        assert ld.state_dict()["epoch"] == 1

        http_server.release()
        join_filler()  # the limit holds the whole dataset: the filler ends when all of it is cached
        assert len(ld) == ROWS // BATCH
        epoch1 = list(ld)
        assert sorted(delivered(epoch1)) == list(range(ROWS))
        assert ld.progressive_epochs[1] == {
            "epoch": 1, "shards": n, "samples": ROWS, "new_shards": n - 4, "shard_ids": list(range(n)),
        }
        epoch2 = list(ld)  # the same set, a new order
        assert sorted(delivered(epoch2)) == list(range(ROWS))
        assert delivered(epoch2) != delivered(epoch1)
        assert ld.progressive_epochs[2]["new_shards"] == 0
    finally:
        ld.close()
    assert chute_threads() == []
    assert part_files(cache_dir) == []


def test_the_cache_rotates_within_its_limit(http_server, served, tmp_path):
    cache_dir = str(tmp_path / "cache")
    local = chute.open(str(http_server.root / "ds"))
    sizes = [s.bytes for s in local.manifest.shards]
    limit = local.nbytes // 3  # about 7 of the 21 shards
    first = [1, 2, 4]
    assert sum(sizes[i] for i in first) + max(sizes) <= limit  # the filler's first download needs no eviction
    prewarm(served, cache_dir, first)
    http_server.hang(SHARDS)
    ds = chute.open(served, progressive=True, cache_dir=cache_dir, cache_limit=limit)
    ld = loader(ds)

    def run_epoch() -> list[int]:
        got = []
        for batch in ld:
            got.extend(batch["y"].tolist())
            used = cache_bytes(cache_dir)  # complete shards and reserved .part downloads
            assert used <= limit, f"the cache holds {used:,} bytes > its limit {limit:,}"
        return got

    try:
        assert sorted(run_epoch()) == row_ids(local, first)
        http_server.release()
        # the filler fills the cache and rotates: it has evicted a shard that arrived first
        filler_waits(ld, lambda f: f.cache.stats()["evictions"] > 0, "evicted a shard")
        for _ in range(3):
            got = run_epoch()
            covered = ld.progressive_epochs[-1]
            assert sorted(got) == row_ids(local, covered["shard_ids"])  # exactly once over its own shards
            assert covered["samples"] == len(got)
            assert sum(sizes[i] for i in covered["shard_ids"]) <= limit
        epochs = ld.progressive_epochs
        assert [e["epoch"] for e in epochs] == [0, 1, 2, 3]
        assert epochs[1]["new_shards"] > 0
        assert set(epochs[1]["shard_ids"]) != set(first)
        assert cache_bytes(cache_dir) <= limit
        assert 0 < ds.cache.stats()["high_water"] <= limit  # the filler's downloads count in the loader's report
    finally:
        ld.close()
    assert chute_threads() == []


def test_a_shard_evicted_as_the_epoch_starts_is_left_out_of_the_epoch(http_server, served, tmp_path, monkeypatch):
    # The filler's eviction can fall between the epoch's look at the cache and its lock (CI: the epoch's view
    # still listed the shard, downloaded it again and read it, while progressive_epochs did not list it).
    cache_dir = str(tmp_path / "cache")
    local = chute.open(str(http_server.root / "ds"))
    first = [1, 2, 4]
    prewarm(served, cache_dir, first)
    http_server.hang(SHARDS)  # the filler gets nothing: no download but the one the race would cause
    ds = chute.open(served, progressive=True, cache_dir=cache_dir, cache_limit=2 * local.nbytes)
    real_lock = progressive.cache_lock
    evicted = []

    def lock_after_an_eviction(directory):
        if not evicted:  # as the filler evicts: the file goes under the cache's lock
            with real_lock(directory):
                os.unlink(ds.cache.path(1))
            evicted.append(1)
        return real_lock(directory)

    monkeypatch.setattr(progressive, "cache_lock", lock_after_an_eviction)
    ld = loader(ds)
    try:
        shards, view = ld._progressive.snapshot()
        try:
            assert evicted and shards == [2, 4]
            assert [s.file for s in view.manifest.shards] == [local.manifest.shards[i].file for i in shards]
            assert view.stats()["misses"] == 0  # all held from the cache, nothing to download
        finally:
            view.close()
        assert sorted(delivered(list(ld))) == row_ids(local, [2, 4])
        assert ld.progressive_epochs[0]["shard_ids"] == [2, 4]
    finally:
        ld.close()
    assert chute_threads() == []


def test_state_dict_resumes_the_epochs_shards_even_from_an_empty_cache(http_server, served, tmp_path):
    cache_dir = str(tmp_path / "cache")
    local = chute.open(str(http_server.root / "ds"))
    first = [2, 7, 8, 11, 12]
    prewarm(served, cache_dir, first)
    http_server.hang(SHARDS)
    ds = chute.open(served, progressive=True, cache_dir=cache_dir, cache_limit=local.nbytes // 2)
    ld = loader(ds)
    try:
        it = iter(ld)
        head = [next(it) for _ in range(5)]
        state = ld.state_dict()
        tail = list(it)
    finally:
        ld.close()
    assert sorted(state["progressive_shards"]) == first
    assert state["epoch"] == 0
    assert sorted(delivered(head + tail)) == row_ids(local, first)

    http_server.release()
    http_server.log.clear()
    # another machine: its cache has none of the epoch's shards, and they are downloaded again
    other = chute.open(served, progressive=True, cache_dir=str(tmp_path / "other"), cache_limit=local.nbytes // 2)
    resumed = loader(other)
    try:
        resumed.load_state_dict(state)
        assert len(resumed) == len(tail)  # the batches left in the resumed epoch
        rest = list(resumed)
        assert resumed.progressive_epochs[0]["shard_ids"] == first
    finally:
        resumed.close()
    assert torch.equal(epoch_columns(rest)["y"], epoch_columns(tail)["y"])  # the exact next batch on
    assert torch.equal(epoch_columns(rest)["x"], epoch_columns(tail)["x"])
    assert chute_threads() == []


def test_misuses_are_refused_with_what_to_do(http_server, served, tmp_path):
    with pytest.raises(ValueError, match=r"progressive=True needs a remote dataset.*open it without progressive"):
        chute.open(str(http_server.root / "ds"), progressive=True, cache_limit="1MB")
    with pytest.raises(ValueError, match=r"progressive=True needs a cache_limit \(chute.open\(.*cache_limit=\.\.\.\)"):
        chute.open(served, progressive=True, cache_dir=str(tmp_path / "cache"))
    ds = chute.open(served, progressive=True, cache_dir=str(tmp_path / "cache"), cache_limit="1MB")
    with pytest.raises(ValueError, match="workers='threads'"):
        chute.Loader(ds, BATCH, workers=chute.Workers("processes", count=2))
    plain = loader(chute.open(str(http_server.root / "ds")))
    with loader(ds) as ld:
        with pytest.raises(ChuteError, match="cannot resume a progressive loader from the state of a non-progressive one"):
            ld.load_state_dict(plain.state_dict())
    with pytest.raises(TypeError, match=r"chute.open\(url, progressive=True, cache_limit=\.\.\.\)"):
        chute.Loader(chute.open(str(http_server.root / "ds")), BATCH, progressive=True)
    assert chute_threads() == []
