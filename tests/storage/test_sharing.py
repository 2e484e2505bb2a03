"""Several processes sharing one limited node cache, each following its own order.

Four reader processes with different seeds read two epochs each through one
cache directory whose limit is either 40% of the dataset (room for all four at
once) or exactly the minimum one loader states (room for one at a time). Every
epoch must be exactly the local epoch of that seed, the cache must never hold
more than its limit (the cache's own high-water mark, and a monitor sampling the
directory from outside), and the whole run must end within a bound: a deadlock
fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

import chute
from tests.servers import REPO_ROOT
from tests.storage._helpers import (
    assert_same_epoch,
    cache_bytes,
    chute_threads,
    loader,
    local_epochs,
    part_files,
    stated_minimum,
    write_dataset,
)

PROCESSES = 4
EPOCHS = 2
SEEDS = [11, 12, 13, 14]
#: Seconds for the whole run; on a loaded 2-core machine it takes well under a minute.
BOUND_S = 420


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("share") / "ds"
    write_dataset(str(root))
    return str(root)


class _Monitor:
    """Samples the bytes under a cache directory (holding its lock) until stopped; keeps the largest."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-cache-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, cache_bytes(self.cache_dir))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _run_children(url: str, cache_dir: str, limit: int, tmp_path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.storage._share_child", url, cache_dir, str(limit), str(seed), str(EPOCHS),
             str(tmp_path / f"epochs-{seed}.pt")],
            cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in SEEDS
    ]
    try:
        for child in children:
            line = child.stdout.readline()
            assert line == "ready\n", (line, child.stderr.read() if child.poll() is not None else "")
        for child in children:  # all start their first epoch together
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = []
        for child in children:
            try:
                outputs.append(child.communicate(timeout=BOUND_S))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{PROCESSES} processes sharing a cache of {limit:,} bytes did not finish in {BOUND_S} s (deadlock)")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    for child, (_, err) in zip(children, outputs):
        assert child.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("limit_kind", ["40% of the dataset", "the stated minimum"])
def test_four_processes_with_different_orders_share_a_limited_cache(http_server, dataset, tmp_path, limit_kind):
    import shutil

    import torch

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    total = chute.open(dataset).nbytes
    limit = int(total * 0.4) if limit_kind.startswith("40%") else stated_minimum(url, str(tmp_path / "probe"))
    cache_dir = str(tmp_path / "shared-cache")
    monitor = _Monitor(cache_dir)
    try:
        stats = _run_children(url, cache_dir, limit, tmp_path)
    finally:
        monitor.stop()
    for seed in SEEDS:
        want = local_epochs(dataset, EPOCHS, seed=seed)
        got = torch.load(tmp_path / f"epochs-{seed}.pt")
        for epoch in range(EPOCHS):
            assert_same_epoch(got[epoch], want[epoch])
    assert max(s["high_water"] for s in stats) <= limit
    assert monitor.samples > 0 and monitor.peak <= limit, f"the cache held {monitor.peak:,} bytes > limit {limit:,}"
    assert cache_bytes(cache_dir) <= limit
    assert part_files(cache_dir) == []
    assert chute_threads() == []


def test_a_process_killed_holding_its_lease_frees_it_for_a_waiting_one(http_server, dataset, tmp_path):
    """The holder dies without ringing anyone: the kernel drops its member lock and the
    waiter finds the lease free at its next check."""
    import shutil

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    limit = stated_minimum(url, str(tmp_path / "probe"))
    cache_dir = str(tmp_path / "shared-cache")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.storage._share_child", url, cache_dir, str(limit), "11", "hold", str(tmp_path / "x.pt")],
        cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "holding\n", holder.stderr.read() if holder.poll() is not None else ""
        ds = chute.open(url, cache_dir=cache_dir, cache_limit=limit)
        ld = loader(ds, seed=12)
        batches = iter(ld)
        waiter = threading.Thread(target=lambda: got.append(next(batches)), name="test-waiter", daemon=True)
        got: list = []
        waiter.start()
        waiter.join(3)  # the holder's lease fills the cache: no batch while it lives
        assert not got and waiter.is_alive()
        holder.kill()
        holder.wait(30)
        waiter.join(60)
        assert got, "the waiting process never got the dead process's lease"
        rest = [got[0], *batches]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    from tests.storage._helpers import epoch_columns

    assert_same_epoch(epoch_columns(rest), local_epochs(dataset, 1, seed=12)[0])
    assert ds.cache.stats()["high_water"] <= limit
    assert part_files(cache_dir) == []
    assert os.listdir(os.path.join(cache_dir, ".chute-members")) == []
    ld.close()  # (its worker threads are kept across passes until then)
    assert chute_threads() == []


# A member that leaves removes two files. This one ends between the two (as a daemon thread does that interpreter
# exit stops there), which must leave nothing that the next look at the members does not remove.
_END_WHILE_LEAVING = """
import os, sys
from chute.storage.node.share import Sharing

sharing = Sharing(sys.argv[1], 100)
sharing.reserve(10)
unlink = os.unlink

def unlink_then_end(path):
    unlink(path)
    os._exit(0)

os.unlink = unlink_then_end
sharing.close()
"""


def test_a_process_that_ends_while_it_leaves_leaves_nothing_behind(tmp_path):
    from chute.storage.node.share import Sharing

    cache_dir = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", _END_WHILE_LEAVING, cache_dir], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(os.listdir(os.path.join(cache_dir, ".chute-members"))) == 1  # (it did end between the two)
    other = Sharing(cache_dir, 100)
    other.reserve(10)  # looks at the members, as every reservation does
    other.close()
    assert os.listdir(os.path.join(cache_dir, ".chute-members")) == []


@pytest.mark.parametrize(
    ("limit", "claims", "want"),
    [
        (100, [(10, 100)], [100]),  # alone: all it wants
        (100, [(10, 100), (10, 100)], [50, 50]),  # two alike: halves
        (100, [(60, 100), (10, 100)], [60, 40]),  # a larger minimum is kept
        (100, [(10, 20), (10, 100)], [20, 80]),  # one wants little: the other gets the rest
        (100, [(70, 70), (50, 90)], [70, 50]),  # minima over the limit: minima (the later one waits)
        (100, [], []),
    ],
)
def test_fair_leases(limit, claims, want):
    from chute.storage.node.share import fair_leases

    got = fair_leases(limit, claims)
    assert got == want
    if claims and sum(m for m, _ in claims) <= limit:
        assert sum(got) <= limit


def test_a_forked_worker_does_not_take_over_its_parents_membership(http_server, dataset, tmp_path):
    """A DataLoader worker forked after the parent read through a limited cache starts its own
    membership; the parent's stays intact (its lease, its held shards)."""
    import multiprocessing
    import shutil

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    total = chute.open(dataset).nbytes
    ds = chute.open(url, cache_dir=tmp_path / "cache", cache_limit=total // 2)
    parent_first = ds[0]  # the parent holds shard 0 and is a member
    members = os.path.join(ds.cache.cache_dir, ".chute-members")
    before = sorted(os.listdir(members))
    assert len(before) == 2  # its state and its doorbell

    def child(queue) -> None:
        row = ds[len(ds) - 1]  # another shard, through the inherited dataset
        ds.close()
        queue.put((int(row["y"]), sorted(os.listdir(members))))

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    worker = context.Process(target=child, args=(queue,))
    worker.start()
    last, seen = queue.get(timeout=120)
    worker.join(60)
    assert worker.exitcode == 0
    assert last == len(ds) - 1
    assert set(before) <= set(seen)  # the child did not remove the parent's membership...
    assert sorted(os.listdir(members)) == before  # ...and left its own when done
    assert ds.cache.held(0) and int(ds[0]["y"]) == int(parent_first["y"])
    ds.close()
    assert os.listdir(members) == []


@pytest.mark.parametrize("prefetch", [None, 48])
def test_worker_processes_read_under_their_loaders_lease(http_server, dataset, tmp_path, prefetch):
    """``workers="processes"`` at the stated minimum: the worker processes read the shards their
    loader's downloader holds, under its lease; a lease of their own would leave them waiting for
    a turn their own loader holds. A batch goes to a worker only once the downloader holds its
    shards, however many are in flight (``prefetch=48``: most of the epoch), and a worker keeps
    no shard held between batches; else a worker reads a shard beyond the downloader's window,
    waits for room the lease fills, and the pass stalls (it did, at 16 in flight)."""
    import shutil

    from tests.storage._helpers import epoch_columns

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    limit = stated_minimum(url, str(tmp_path / "probe"))
    ds = chute.open(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    workers = chute.Workers("processes", count=3, prefetch=prefetch)
    ld = loader(ds, seed=12, workers=workers, watchdog=chute.Watchdog(120, on_stall="raise"))
    assert_same_epoch(epoch_columns(ld), local_epochs(dataset, 1, seed=12)[0])
    assert ds.cache.stats()["high_water"] <= limit
    assert part_files(str(tmp_path / "cache")) == []


def test_worker_processes_keep_no_shard_held_between_batches(http_server, dataset, tmp_path):
    """In order, at the stated minimum (the two shards a batch spans at a shard boundary): a
    worker process that kept the shard of its last batch held after the downloader let it go
    would leave no room for the next shard, and wait idle for a batch that needs that room."""
    import shutil

    from tests.storage._helpers import epoch_columns

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    limit = stated_minimum(url, str(tmp_path / "probe"), shuffle=False)
    ds = chute.open(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    workers = chute.Workers("processes", count=2)
    ld = loader(ds, shuffle=False, workers=workers, watchdog=chute.Watchdog(120, on_stall="raise"))
    assert_same_epoch(epoch_columns(ld), local_epochs(dataset, 1, shuffle=False)[0])
    assert ds.cache.stats()["high_water"] <= limit
    assert part_files(str(tmp_path / "cache")) == []


def _mapped_under(pid: int, root: str) -> set[str]:
    """Files under ``root`` that process ``pid`` maps (Linux: /proc/<pid>/maps), deleted ones too."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6 and root in line}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/<pid>/maps (Linux)")
def test_worker_processes_map_only_what_their_loader_holds(http_server, dataset, tmp_path):
    """A worker process reads a batch's shards as a guest of its loader's holds and keeps them
    mapped across batches (no remapping within a shuffle window), until its loader lets them go:
    then it unmaps them, idle or not, so no worker keeps an evicted file's bytes on disk."""
    import shutil

    from tests.storage._helpers import epoch_columns

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    cache_dir = str(tmp_path / "cache")
    limit = stated_minimum(url, str(tmp_path / "probe"))
    ds = chute.open(url, cache_dir=cache_dir, cache_limit=limit)
    ld = loader(ds, seed=12, workers=chute.Workers("processes", count=2), watchdog=chute.Watchdog(120, on_stall="raise"))
    batches = iter(ld)
    first = next(batches)
    pids = ld._processes.pids
    # Mid-pass: the workers keep the shards of the first window mapped (their loader holds them until
    # the window's last batch).
    assert any(_mapped_under(pid, cache_dir) for pid in pids)
    rest = list(batches)
    assert_same_epoch(epoch_columns([first, *rest]), local_epochs(dataset, 1, seed=12)[0])
    # The pass is over: its downloader let go of every shard, and the idle workers were told.
    deadline = time.monotonic() + 60
    while any(_mapped_under(pid, cache_dir) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [_mapped_under(pid, cache_dir) for pid in pids] == [set(), set()]
    assert ld._processes.pids == pids  # the same workers, still running
    ld.close()
    ds.close()


def test_turns_first_come_first_served_and_ranks_of_one_job_fail_instead_of_waiting(tmp_path):
    """Three members of one cache directory (as three processes would be), limit 100 bytes."""
    from chute.storage.node.share import Sharing

    cache_dir = str(tmp_path / "cache")
    asked = {job: threading.Event() for job in "AB"}  # set when that member is asked to give back read-ahead
    made: list[Sharing] = []

    def member(job: str) -> Sharing:
        sharing = Sharing(cache_dir, 100)
        sharing.process = f"simulated{len(made)}"  # each member stands for a process of its own
        made.append(sharing)
        sharing.attach(sharing, 60, 90, on_demand=asked[job].set, on_change=lambda: None, soon=lambda: [], job=job)
        return sharing

    first = member("A")
    first.reserve(0, at_least=60)
    assert first.lease == 90  # alone: all it wants
    rank = member("A")  # the same pass on another rank: it cannot wait for a turn the first holds
    with pytest.raises(chute.CacheFullError, match="the ranks of one job.*at least 120 bytes"):
        rank.reserve(0, at_least=60)
    rank.close()
    other = member("B")  # another job: it waits its turn, and the first gives back its read-ahead
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (other.reserve(0, at_least=60), done.set()), name="test-turn", daemon=True)
    waiter.start()
    assert asked["A"].wait(30)  # the waiter rang: the first was asked for its read-ahead...
    assert not done.is_set()  # it keeps its minimum: 60 + 60 > 100, no room yet
    first.detach(first)  # its pass ends: it leaves, and rings the waiter
    assert done.wait(30), "the waiter was not woken when the lease came free"
    assert other.lease >= 60
    other.detach(other)
    assert os.listdir(os.path.join(cache_dir, ".chute-members")) == []
    assert chute_threads() == []


def test_two_datasets_of_one_process_read_together_fail_instead_of_waiting_for_each_other(http_server, dataset, tmp_path):
    """``zip(loader_a, loader_b)`` over one cache that holds one loader's minimum: b's turn would
    come only when a's pass ends, and a's pass waits for b in the same loop. The second loader
    says the limit both need instead of hanging."""
    import shutil

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    minima = []
    for batch in (32, 40):  # unshuffled, a pass needs exactly the minimum it states; two passes (jobs)
        with pytest.raises(chute.CacheFullError) as info:
            loader(chute.open(url, cache_dir=str(tmp_path / "probe"), cache_limit=30_000), batch, shuffle=False)
        minima.append(int(re.search(r"at least ([\d,]+) bytes", str(info.value)).group(1).replace(",", "")))
    limit = max(minima)  # either fits alone, not both
    cache_dir = str(tmp_path / "shared-cache")
    a = loader(chute.open(url, cache_dir=cache_dir, cache_limit=limit), 32, shuffle=False)
    b = loader(chute.open(url, cache_dir=cache_dir, cache_limit=limit), 40, shuffle=False)
    first = iter(a)
    next(first)  # a's pass holds its lease
    outcome: list = []

    def second() -> None:
        try:
            next(iter(b))
            outcome.append("a batch")
        except chute.CacheFullError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=second, name="test-second-loader", daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the second loader waited for a turn its own process holds"
    assert isinstance(outcome[0], chute.CacheFullError), outcome
    assert "datasets this process reads" in str(outcome[0]) and f"at least {sum(minima):,} bytes" in str(outcome[0])
    a.close()
    b.close()
    assert chute_threads() == []


def test_a_member_with_descriptors_past_1024_open_still_hears_its_doorbell(tmp_path):
    """A training process may hold many files open: the doorbell's listener waits with poll, which has no
    FD_SETSIZE limit (select() raised for a descriptor past 1024, and the member never heard a ring)."""
    from chute.storage.node.share import Sharing

    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the doorbell's descriptor comes after these
    try:
        cache_dir = str(tmp_path / "cache")
        asked = threading.Event()
        first, other = Sharing(cache_dir, 100), Sharing(cache_dir, 100)
        first.process, other.process = "simulated0", "simulated1"
        first.attach(first, 60, 90, on_demand=asked.set, on_change=lambda: None, soon=lambda: [], job="A")
        first.reserve(0, at_least=60)
        other.attach(other, 60, 60, on_demand=lambda: None, on_change=lambda: None, soon=lambda: [], job="B")
        waiter = threading.Thread(target=lambda: other.reserve(0, at_least=60), name="test-turn", daemon=True)
        waiter.start()
        assert asked.wait(30)  # the ring reached the first member's listener
        first.detach(first)
        waiter.join(30)
        assert not waiter.is_alive()
        other.detach(other)
        assert chute_threads() == []
    finally:
        for fd in held:
            os.close(fd)
