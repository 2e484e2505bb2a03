"""The node cache, seen from the outside: the server's request log and the cache directory.

- processes sharing one cache directory download each shard once between them;
- a byte limit smaller than the dataset is never exceeded, and each shard is
  still downloaded at most once per epoch (eviction by next use);
- a limit too small fails at construction and says the minimum, which works;
- shards cached by an earlier run are reused: the next run downloads nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import chute
from tests.servers import REPO_ROOT
from tests.storage._helpers import (
    BATCH,
    ROWS,
    assert_same_epoch,
    cache_bytes,
    chute_threads,
    epoch_columns,
    journal_files,
    loader,
    local_epochs,
    part_files,
    shard_gets,
    write_dataset,
)

CHILD_TIMEOUT = 120  # seconds; each child imports torch and runs one small epoch


@pytest.fixture
def served(http_server) -> str:
    write_dataset(str(http_server.root / "ds"))
    return http_server.url + "ds"


def test_a_scan_counts_this_process_downloads_unprobed_and_removes_a_dead_download(http_server, served, tmp_path, monkeypatch):
    from chute.storage.node import ledger as ledger_module

    ds = chute.open(served, cache_dir=tmp_path / "cache", cache_limit=10 << 20)
    cache = ds.cache
    cache._make_dir()
    sizes = [s.bytes for s in ds.shards]
    mine = cache._reserve(0, sizes[0])  # this process's download in flight (its download lock is not even taken)
    dead = os.path.join(cache.dir, f"{cache._file(1)}.{sizes[1]}.0badf00d.part")  # a killed process's leftover
    with open(dead, "wb") as f:
        f.truncate(sizes[1])
    probed = []
    real = ledger_module.try_exclusive
    monkeypatch.setattr(ledger_module, "try_exclusive", lambda d, file, *a: probed.append(file) or real(d, file, *a))
    try:
        assert ledger_module.scan(cache.cache_dir) == {f"{os.path.basename(cache.dir)}/{os.path.basename(mine)}": sizes[0]}
        assert os.path.exists(mine) and not os.path.exists(dead)
        assert probed == [cache._file(1)]  # the dead one's lock only: one open and flock per download saved
        pid = os.fork()
        if pid == 0:  # a forked child does not count its parent's downloads as its own
            os._exit(0 if mine not in ledger_module.DOWNLOADS else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        ledger_module.DOWNLOADS.discard(mine)
        os.unlink(mine)


def test_two_processes_sharing_a_cache_download_each_shard_once(http_server, served, tmp_path):
    import torch

    want = local_epochs(str(http_server.root / "ds"), 1)[0]
    cache_dir = str(tmp_path / "shared-cache")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.storage._helpers", served, cache_dir, str(tmp_path / f"epoch{k}.pt")],
            cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for k in range(2)
    ]
    try:
        for child in children:  # both have opened the dataset; then both start their epoch at once
            line = child.stdout.readline()
            assert line == "ready\n", (line, child.stderr.read() if child.poll() is not None else "")
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=CHILD_TIMEOUT) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err
    stats = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    for k in range(2):
        assert_same_epoch(torch.load(tmp_path / f"epoch{k}.pt"), want)
    ds = chute.open(served, cache_dir=cache_dir)
    gets = shard_gets(http_server)
    assert sorted(gets) == sorted(s.file for s in ds.manifest.shards)
    assert set(gets.values()) == {1}  # each shard fetched once between the two processes
    assert sum(s["shards_downloaded"] for s in stats) == len(ds.shards)
    assert sum(s["misses"] for s in stats) == len(ds.shards)
    assert all(s["hits"] + s["misses"] >= len(ds.shards) for s in stats)  # each process read every shard
    assert part_files(cache_dir) == []


@pytest.mark.parametrize("batch_size", [32, 30])  # 30: a partial last batch
def test_limit_below_dataset_is_never_exceeded(http_server, served, tmp_path, batch_size):
    want = local_epochs(str(http_server.root / "ds"), 2, batch_size=batch_size)
    cache_dir = str(tmp_path / "cache")
    total = chute.open(str(http_server.root / "ds")).nbytes
    limit = total // 4
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    ld = loader(ds, batch_size)
    for epoch in range(2):
        http_server.log.clear()
        batches, peak = [], 0
        for batch in ld:
            batches.append(batch)
            used = cache_bytes(cache_dir)  # complete shards and reserved .part downloads
            peak = max(peak, used)
            assert used <= limit, f"cache holds {used:,} bytes > limit {limit:,} in epoch {epoch}"
        assert_same_epoch(epoch_columns(batches), want[epoch])
        gets = shard_gets(http_server)
        assert max(gets.values()) == 1, f"shards downloaded twice in epoch {epoch}: {[n for n, c in gets.items() if c > 1]}"
        if epoch == 0:
            assert len(gets) == len(ds.shards)  # a cold cache: every shard once
        assert peak > limit // 2  # the limit was what held the cache back
    assert ds.cache.stats()["evictions"] > 0
    assert cache_bytes(cache_dir) <= limit
    ld.close()  # (its worker threads are kept across passes until then)
    assert chute_threads() == []


def test_an_evicted_shard_s_file_is_recycled_for_the_next_download(http_server, served, tmp_path, monkeypatch):
    """A download that has to evict takes the evicted shard's file (its blocks and cached pages) and
    overwrites it, instead of the kernel freeing one file's pages and allocating another's; the epoch is exact."""
    from chute.storage.node import steps

    completed: set[int] = set()  # inodes of complete shard files seen
    reused: list[int] = []

    def hook(step: str, **facts) -> None:
        if step == "held":
            completed.add(os.stat(facts["path"]).st_ino)
        elif step == "reserved" and os.stat(facts["path"]).st_ino in completed:
            reused.append(os.stat(facts["path"]).st_ino)
            assert os.path.getsize(facts["path"]) == facts["size"]  # resized to the new shard's size

    monkeypatch.setattr(steps, "HOOK", hook)
    want = local_epochs(str(http_server.root / "ds"), 1, shuffle=False)
    cache_dir = str(tmp_path / "cache")
    limit = chute.open(str(http_server.root / "ds")).nbytes // 4
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    assert_same_epoch(epoch_columns(loader(ds, shuffle=False)), want[0])
    stats = ds.cache.stats()
    assert 0 < stats["recycled"] <= stats["evictions"] and len(reused) == stats["recycled"]
    assert stats["checksum_failures"] == 0 and cache_bytes(cache_dir) <= limit and part_files(cache_dir) == []


def test_a_recycled_file_is_never_a_part_larger_than_its_reservation(http_server, tmp_path, monkeypatch):
    """An evicted shard larger than the download that takes its file is cut to the new reservation before
    it is named a ``.part``: a process killed between the rename and the resize leaves no ``.part`` larger
    than its name reserves (the stress test's checker saw one, 0.1 ms wide, before this)."""
    ds_path = str(http_server.root / "ds")
    write_dataset(ds_path, n=BATCH * 7 + 3)  # the last shard is much smaller than the others
    local = chute.open(ds_path)
    sizes = {s.file: s.bytes for s in local.manifest.shards}
    assert min(sizes.values()) < max(sizes.values()) // 2
    named: list[tuple[int, int, int]] = []  # (size of the evicted file when named .part, its reservation, its shard's size)
    rename = os.rename

    def watched(src, dst, *args, **kwargs):
        if str(dst).endswith(".part"):
            evicted = os.path.basename(str(src))
            named.append((os.path.getsize(src), int(str(dst)[: -len(".part")].rsplit(".", 2)[1]), sizes[evicted]))
        return rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", watched)
    want = local_epochs(ds_path, 1, shuffle=False)
    limit = max(sizes.values()) * 2
    ds = chute.open(http_server.url + "ds", cache_dir=str(tmp_path / "cache"), cache_limit=limit)
    assert_same_epoch(epoch_columns(loader(ds, shuffle=False)), want[0])
    assert ds.cache.stats()["recycled"] == len(named) > 0
    assert all(now <= reserved for now, reserved, _ in named), named
    assert any(was > reserved for _, reserved, was in named), named  # a larger shard was recycled for a smaller one
    assert ds.cache.stats()["checksum_failures"] == 0 and part_files(str(tmp_path / "cache")) == []


def test_the_journal_counts_every_part_from_before_it_exists(http_server, served, tmp_path, monkeypatch):
    """At every instant a ``.part`` exists (created, or an evicted shard's file renamed to it), the journal
    already counts it at its reservation: a process killed at any point of a reservation leaves the journal
    counting too much (until a scan), never too little, so the next process cannot pass the limit."""
    cache_dir = str(tmp_path / "cache")
    appeared: list[tuple[str, int | None, int]] = []  # (.part, what the journal counts for it, its reservation)
    real_open, real_rename = os.open, os.rename

    def check(path) -> None:
        path = str(path)
        if path.endswith(".part"):
            key = os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path)
            appeared.append((key, (journal_files(cache_dir) or {}).get(key), int(path[: -len(".part")].rsplit(".", 2)[1])))

    def watched_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT:
            check(path)
        return fd

    def watched_rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        check(dst)

    monkeypatch.setattr(os, "open", watched_open)
    monkeypatch.setattr(os, "rename", watched_rename)
    limit = chute.open(str(http_server.root / "ds")).nbytes // 4
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    n = sum(1 for _ in loader(ds, shuffle=False))
    assert n == ROWS // BATCH
    stats = ds.cache.stats()
    assert len(appeared) == stats["shards_downloaded"] == len(ds.shards) and stats["recycled"] > 0
    assert all(counted == reserved for _, counted, reserved in appeared), [a for a in appeared if a[1] != a[2]]
    assert stats["bytes_cached"] <= limit and part_files(cache_dir) == []


def test_limit_smaller_than_one_shard_fails_at_open(http_server, served, tmp_path):
    largest = max(s.bytes for s in chute.open(str(http_server.root / "ds")).manifest.shards)
    with pytest.raises(chute.CacheFullError) as info:
        chute.open(served, cache_dir=tmp_path / "cache", cache_limit=largest - 1)
    message = str(info.value)
    assert served in message and f"at least {largest:,} bytes" in message
    assert shard_gets(http_server) == {}


def _minimum(message: str) -> int:
    match = re.search(r"at least ([\d,]+) bytes", message)
    assert match, message
    return int(match.group(1).replace(",", ""))


def test_limit_below_the_loaders_minimum_fails_at_construction_and_the_minimum_works(http_server, served, tmp_path):
    want = local_epochs(str(http_server.root / "ds"), 1)[0]
    largest = max(s.bytes for s in chute.open(str(http_server.root / "ds")).manifest.shards)
    small = chute.open(served, cache_dir=tmp_path / "a", cache_limit=largest + 1)  # holds one shard: open is fine
    with pytest.raises(chute.CacheFullError) as info:
        loader(small)
    minimum = _minimum(str(info.value))
    assert minimum > largest and served in str(info.value)
    assert shard_gets(http_server) == {}  # it failed before downloading anything
    with pytest.raises(chute.CacheFullError) as info:  # one byte less than the minimum is refused too
        loader(chute.open(served, cache_dir=tmp_path / "b", cache_limit=minimum - 1))
    assert _minimum(str(info.value)) == minimum
    cache_dir = str(tmp_path / "c")
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=minimum)
    batches = []
    for batch in loader(ds):
        batches.append(batch)
        assert cache_bytes(cache_dir) <= minimum
    assert_same_epoch(epoch_columns(batches), want)
    assert chute_threads() == []


def test_the_stated_minimum_works_for_later_epochs_too(http_server, served, tmp_path):
    small = chute.open(served, cache_dir=tmp_path / "a", cache_limit=30_000)
    with pytest.raises(chute.CacheFullError) as info:
        loader(small)
    minimum = _minimum(str(info.value))
    ds = chute.open(served, cache_dir=tmp_path / "b", cache_limit=minimum)
    ld = loader(ds)
    ld.set_epoch(14)
    assert len(epoch_columns(ld)["y"]) == 4000


def test_a_second_run_reuses_the_cache_and_downloads_nothing(http_server, served, tmp_path):
    want = local_epochs(str(http_server.root / "ds"), 2)
    cache_dir = str(tmp_path / "cache")
    first = chute.open(served, cache_dir=cache_dir)
    assert_same_epoch(epoch_columns(loader(first)), want[0])
    assert len(shard_gets(http_server)) == len(first.shards)
    del first
    http_server.log.clear()
    again = chute.open(served, cache_dir=cache_dir)  # a new run: the manifest is read again
    ld = loader(again)
    ld.set_epoch(1)
    assert_same_epoch(epoch_columns(ld), want[1])
    assert shard_gets(http_server) == {}
    assert http_server.count(method=None) == 1  # the manifest, nothing else
    stats = again.cache.stats()
    assert stats["misses"] == 0 and stats["shards_downloaded"] == 0 and stats["bytes_downloaded"] == 0
    assert stats["hits"] >= len(again.shards) and stats["hit_rate"] == 1.0


def _hold_read_lock(ds: chute.Dataset, i: int) -> int:
    """Act as another process that reads (or waits for) shard ``i``: its read lock, shared (see cache.py)."""
    import fcntl

    os.makedirs(os.path.join(ds.cache.dir, "locks"), exist_ok=True)  # as the other process's first hold would
    fd = os.open(os.path.join(ds.cache.dir, "locks", ds.manifest.shards[i].file + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def test_another_reader_does_not_block_a_download(http_server, served, tmp_path):
    """Regression: a downloader used to convert its shared lock to an exclusive one, so it waited for
    every other process reading or waiting for the shard; two processes each holding a shard the
    other was about to download deadlocked (seen with the two-process test)."""
    import threading

    ds = chute.open(served, cache_dir=tmp_path / "cache")
    other = _hold_read_lock(ds, 0)  # another process is waiting for shard 0 too
    got: list = []
    reader = threading.Thread(target=lambda: got.append(ds[0]), name="test-reader", daemon=True)
    try:
        reader.start()
        reader.join(20)
        assert not reader.is_alive(), "the download of shard 0 waited for another process's shared lock"
    finally:
        os.close(other)  # lets a blocked reader finish either way
        reader.join(20)
    local = chute.open(str(http_server.root / "ds"))
    assert got and got[0]["y"] == local[0]["y"] and got[0]["tag"] == local[0]["tag"]
    assert ds.cache.stats()["shards_downloaded"] == 1


def test_a_shard_another_process_reads_is_never_evicted(http_server, served, tmp_path):
    cache_dir = str(tmp_path / "cache")
    total = chute.open(str(http_server.root / "ds")).nbytes
    limit = total // 4
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    ds[0]  # shard 0 in the cache
    ds.close()
    path = ds.cache.path(0)
    assert os.path.exists(path)
    other = _hold_read_lock(ds, 0)  # another process has it mapped
    try:
        for _ in loader(ds):
            assert os.path.exists(path)
            assert cache_bytes(cache_dir) <= limit
    finally:
        os.close(other)
    assert ds.cache.stats()["evictions"] > 0
    assert shard_gets(http_server)[ds.manifest.shards[0].file] == 1  # never evicted, so never fetched again


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 500])
def test_the_stated_minimum_bounds_every_epoch(batch_size, world_size):
    from chute.order import Order
    from chute.storage.node.fetcher import resident_bytes, worst_resident_bytes

    rng = np.random.default_rng(batch_size * 10 + world_size)
    rows = [int(r) for r in rng.integers(0, 90, 37)]
    sizes = [100 + 7 * r + int(rng.integers(0, 50)) for r in rows]
    order = Order(tuple(rows), batch_size, shuffle=True, seed=5, window=3)
    bound = worst_resident_bytes(order, sizes, world_size)
    needs = [resident_bytes(order.shard_uses(epoch, world_size, 0), sizes) for epoch in range(60)]
    assert max(needs) <= bound
    assert bound <= sum(sizes)


def test_a_cached_copy_damaged_after_its_download(http_server, tmp_path):
    write_dataset(str(http_server.root / "ds"), n=400)
    url = http_server.url + "ds"
    cache_dir = tmp_path / "cache"
    first = chute.open(url, cache_dir=cache_dir)
    want = first[5]["x"].clone()
    path = first.cache.path(0)
    first.close()
    with open(path, "r+b") as f:
        f.seek(first.shards[0].bytes // 2)
        byte = f.read(1)[0]
        f.seek(first.shards[0].bytes // 2)
        f.write(bytes([byte ^ 0x5A]))  # the disk, or a user, changed the cached copy
    again = chute.open(url, cache_dir=cache_dir)  # another run: the copy looks complete
    with pytest.raises(chute.ShardError, match=f"{first.shards[0].file} .*has checksum"):
        again[5]
    with pytest.raises(chute.ShardError, match="checksum"):
        again.verify()
    os.unlink(path)  # what the message says to do: the next read downloads it again
    assert np.array_equal(chute.open(url, cache_dir=cache_dir)[5]["x"], want)


def test_a_step_waits_for_its_own_use_of_a_shard_not_an_earlier_one(http_server, served, tmp_path):
    """A shard read at steps 0 and 2 is held twice, once per use. The batch of step 2 must wait
    for the second hold: the first goes when the consumer passes step 0, maybe while step 2
    reads, and a read left without a loader's hold keeps the shard (and its share of the
    cache) after the pass."""
    import threading

    from chute.storage.node.fetcher import Fetcher

    ds = chute.open(served, cache_dir=str(tmp_path / "cache"))
    a, b = 0, 1
    uses = [(0, 0, a), (1, 1, b), (2, 2, a)]
    fetcher = Fetcher(ds.cache, uses, threads=1, ahead=ds.shards[a].bytes + ds.shards[b].bytes)  # room for 2 uses
    try:
        fetcher.wait(0, [a])
        fetcher.wait(1, [b])
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (fetcher.wait(2, [a]), done.set()))
        waiter.start()
        assert not done.wait(0.5), "step 2 went ahead on the hold of step 0"
        assert ds.cache.held(a) == 1
        fetcher.received(0)  # the first use of a goes: now the second can start
        assert done.wait(30)
        waiter.join(10)
        assert ds.cache.held(a) == 1  # the hold of step 2's use
        fetcher.received(1)
        fetcher.received(2)
        assert ds.cache.held(a) == 0 and ds.cache.held(b) == 0
    finally:
        fetcher.close()
    assert chute_threads() == []


@pytest.mark.parametrize("outside", [1, 3])
def test_a_fetcher_with_holds_outside_its_lease_finishes_its_epoch(http_server, served, tmp_path, outside):
    """Another holder keeps ``outside`` shards in the cache outside any lease (as the progressive
    mode's snapshots or a loader's worker processes do), and the limit leaves the loader exactly
    its minimum beside them. Alone, its lease is the whole limit, so its read-ahead can fill the
    room its next shard needs: the download that finds the cache full must get the room back from
    the read-ahead (later uses wait, shards no task asked for go back) instead of waiting for it
    forever (two hangs of this kind were seen, each in a multi-process run only)."""
    from chute.storage.node.cache import ShardCache

    cache_dir = str(tmp_path / "cache")
    probe = chute.open(served, cache_dir=str(tmp_path / "probe"), cache_limit=30_000)
    with pytest.raises(chute.CacheFullError) as info:
        loader(probe)
    minimum = _minimum(str(info.value))
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=1 << 40)
    held = list(range(len(ds.shards) - outside, len(ds.shards)))  # read late in the epoch's order or early: any
    other = ShardCache(ds.cache.remote, ds.manifest, cache_dir, 1 << 40, share=False)
    for i in held:
        other.acquire(i)
    limit = minimum + sum(ds.shards[i].bytes for i in held)
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    try:
        got = epoch_columns(loader(ds, watchdog=chute.Watchdog(60, on_stall="raise")))
        assert all(os.path.exists(other.path(i)) for i in held)  # never evicted while held
    finally:
        other.close()
    assert_same_epoch(got, local_epochs(str(http_server.root / "ds"), 1)[0])
    assert ds.cache.stats()["high_water"] <= limit
    assert part_files(cache_dir) == []
    assert chute_threads() == []
