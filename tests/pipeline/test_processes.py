"""workers="processes": the same batches as threads, through a reused shared-memory ring, and nothing left behind.

Real worker processes, started with spawn (each imports torch: a few seconds),
so the tests that only read batches share one module-scoped Loader.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from multiprocessing import resource_tracker

import numpy as np
import pytest
import torch

import chute
from chute.pipeline.transform import TransformError
from chute.pipeline.wire import RemoteTraceback

N = 240
BATCH = 24


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("processes") / "ds"
    samples = (
        {
            "x": np.full((3, 4), i % 251, np.uint8),
            "id": i,
            "name": f"s{i}",
            "blob": bytes([i % 256]) * (i % 5),
            "tags": {f"k{j}": str(i * j) for j in range(i % 4)},  # a map column: keys vary per sample
        }
        for i in range(N)
    )
    return chute.write(samples, path, shard_size=2000)  # 8 shards


# ---------------------------------------------------------------- module-level functions (picklable)


def _transform(sample):
    """Per-sample Python work that changes every value (and makes the tensors bigger than the first ring size)."""
    x = (sample["x"].float() * 0.5 + sample["id"]).repeat(1, 256)
    return {"x": x, "id": sample["id"], "name": sample["name"].upper(), "blob": sample["blob"][::-1], "tags": dict(sample["tags"], seen="yes")}


def _collate(samples):
    """A nested batch: tensors of several dtypes in dicts, tuples and lists, next to str, bytes, dicts and ints."""
    x = torch.stack([s["x"] for s in samples])
    ids = torch.tensor([s["id"] for s in samples])
    return {
        "x": x,
        "id": ids,
        "name": [s["name"] for s in samples],
        "blob": [s["blob"] for s in samples],
        "tags": [s["tags"] for s in samples],
        "nested": {
            "pair": (ids * 3, [torch.arange(s["id"] % 4) for s in samples]),  # arange(0): an empty tensor
            "flags": x[:, 0, :8] > 100,
            "half": x[:, :, 0].to(torch.bfloat16),
            "total": x.sum(),  # 0-dim
            "count": len(samples),
        },
    }


def _explode_on_17(sample):
    if sample["id"] == 17:
        raise ValueError("bad pixel")
    return {"id": sample["id"]}


def _slow(sample):
    time.sleep(0.01)
    return {"id": sample["id"]}


# ---------------------------------------------------------------- helpers


def _loader(ds, workers="threads", **kwargs):
    options = dict(shuffle=True, seed=7, transform=_transform, collate=_collate, workers=chute.Workers(workers, count=2, prefetch=4))
    options.update(kwargs)
    return chute.Loader(ds, BATCH, **options)


def assert_same(a, b, where="batch"):
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert_same(x, y, f"batch {i}")


def ids(batches):
    return [i for b in batches for i in b["id"].tolist()]


def within(seconds, fn):
    """``fn()``, failing (instead of hanging the suite) if it takes longer than ``seconds``."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no result after {seconds} s: hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def ring_entries(pid=None):
    prefix = f"chute_{pid or os.getpid()}_"
    return sorted(name for name in os.listdir("/dev/shm") if name.startswith(prefix))


def snapshot():
    """Child processes, open files and shared memory segments of this process."""
    resource_tracker.ensure_running()  # started by the first pool; not a leak
    gc.collect()  # what earlier tests left for the collector (mapped shards of their datasets) goes first
    gc.collect()
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("pipe:", "/dev/shm/")) or target.endswith(".arrow"):  # what a pool could leave open
            fds.append(target)
    shm = ring_entries()  # this process's segments: others may be running the suite at the same time
    return {p.pid for p in multiprocessing.active_children()}, sorted(fds), shm


def assert_nothing_left(before):
    children, fds, shm = snapshot()
    assert children == before[0], "worker processes left running"
    assert shm == before[2], "shared memory segments left in /dev/shm"
    assert fds == before[1], "file descriptors left open"


def worker_pids():
    return sorted(p.pid for p in multiprocessing.active_children() if p.name.startswith("chute-worker"))


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)  # a zombie is dead
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- refused and failing transforms


def test_lambda_transform_is_refused_with_what_to_do(ds):
    before = snapshot()
    with pytest.raises(chute.ChuteError, match="module-level function") as error:
        chute.Loader(ds, 8, transform=lambda sample: sample, workers="processes")  # refused at construction
    message = str(error.value)
    assert "lambda" in message and 'if __name__ == "__main__":' in message and "spawn" in message
    assert_nothing_left(before)


def test_transform_error_names_sample_and_shard_with_worker_traceback(ds):
    before = snapshot()
    loader = chute.Loader(ds, 10, transform=_explode_on_17, workers=chute.Workers("processes", count=1, prefetch=3))
    received = []
    with pytest.raises(TransformError) as error:
        for batch in loader:
            received.append(batch)
    assert len(received) == 1  # batch 0 arrived, batch 1 (rows 10-19) failed
    shard, row = ds.locate(17)
    message = str(error.value)
    assert "sample 17" in message and ds.shards[shard].file in message and f"row {row}" in message
    assert "bad pixel" in message and "on_error='skip'" in message
    chain, link = [], error.value
    while link is not None:
        chain.append(link)
        link = link.__cause__
    assert isinstance(chain[1], ValueError) and str(chain[1]) == "bad pixel"  # as with threads
    remote = chain[-1]
    assert isinstance(remote, RemoteTraceback)
    assert "Traceback" in remote.text and "_explode_on_17" in remote.text and "TransformError" in remote.text
    del loader, error, chain, link, remote, received
    gc.collect()  # the Loader's finalizer stops the workers
    assert_nothing_left(before)


def test_killed_worker_is_reported_then_new_workers_start(ds):
    before = snapshot()
    loader = chute.Loader(ds, 8, transform=_slow, workers=chute.Workers("processes", count=2, prefetch=4))
    iterator = iter(loader)
    within(60, lambda: next(iterator))
    victim = worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(chute.ChuteError) as error:
        within(60, lambda: list(iterator))
    message = str(error.value)
    assert f"process {victim} died" in message and "SIGKILL" in message and "while building step" in message
    assert worker_pids() == []  # the other worker was stopped too
    assert ring_entries() == []
    del iterator
    assert within(120, lambda: ids(loader)) == list(range(N))  # a new pass starts new workers
    loader.close()
    assert_nothing_left(before)


@pytest.mark.parametrize("how", ["exit", "sigint"])
def test_process_exiting_mid_epoch_leaves_nothing(ds, tmp_path, how):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys, time
            import chute

            def slow(sample):  # module level: spawn imports this script again in each worker
                time.sleep(0.002)
                return {"id": sample["id"]}

            if __name__ == "__main__":
                import faulthandler, signal
                faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test asks for the stacks if it hangs
                signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
                loader = chute.Loader(sys.argv[1], 8, transform=slow, workers=chute.Workers("processes", count=2))
                iterator = iter(loader)
                next(iterator), next(iterator)
                print(os.getpid(), *[p.pid for p in multiprocessing.active_children()], flush=True)
                if sys.argv[2] == "sigint":
                    while True:  # until the test interrupts it
                        for batch in loader:
                            pass
            """
        )
    )
    child = subprocess.Popen([sys.executable, str(script), ds.root, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in within(60, child.stdout.readline).split()]
        assert len(pids) == 3, child.stderr.read()
        started = time.monotonic()
        if how == "sigint":
            child.send_signal(signal.SIGINT)
        try:
            _, stderr = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGUSR2)  # every thread's stack on its stderr, then the failure shows them
            time.sleep(2)
            child.kill()
            pytest.fail(f"the process did not exit within 30 s ({how}); its threads:\n{child.communicate()[1]}")
        assert time.monotonic() - started < 30
    finally:
        child.kill()
        child.wait()
    if how == "exit":
        assert child.returncode == 0, stderr
    else:
        assert "KeyboardInterrupt" in stderr
    assert "leaked" not in stderr and "resource_tracker" not in stderr, stderr
    assert ring_entries(pids[0]) == []
    assert all(gone(pid) for pid in pids[1:])


def test_fork_start_method_works_without_tracker_warnings(ds, tmp_path):
    """Forked workers share the main process's resource tracker: no segment is reported as leaked."""
    script = tmp_path / "fork.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import chute

            def scale(sample):
                return {"id": sample["id"], "x": sample["x"].float() * 2}

            if __name__ == "__main__":
                loader = chute.Loader(sys.argv[1], 16, shuffle=True, transform=scale)
                expected = list(loader)
                forked = chute.Loader(sys.argv[1], 16, shuffle=True, transform=scale, workers=chute.Workers("processes", count=2, prefetch=3))
                forked._start_method = "fork"
                got = list(forked)
                forked.close()
                same = all(a["id"].equal(b["id"]) and a["x"].equal(b["x"]) for a, b in zip(got, expected))
                print(len(got) == len(expected) and same)
            """
        )
    )
    result = subprocess.run([sys.executable, str(script), ds.root], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
    assert "resource_tracker" not in result.stderr and "leaked" not in result.stderr, result.stderr


# ---------------------------------------------------------------- batches (one shared pool)


@pytest.fixture(scope="module")
def processes(ds):
    loader = _loader(ds, workers="processes")
    yield loader
    loader.close()


def test_same_batches_as_threads_over_shuffled_epochs(ds, processes):
    threads = _loader(ds)
    for epoch in range(3):
        processes.set_epoch(epoch)
        threads.set_epoch(epoch)
        got = list(processes)
        assert len(got) == N // BATCH
        assert_same_batches(got, list(threads))
    assert sorted(ids(got)) == list(range(N))
    first = got[0]
    assert first["x"].dtype == torch.float32 and first["nested"]["half"].dtype == torch.bfloat16
    assert first["nested"]["flags"].dtype == torch.bool and first["nested"]["total"].dim() == 0
    assert first["tags"][0]["seen"] == "yes" and isinstance(first["blob"][0], bytes)


def test_ring_is_created_once_and_reused(ds, processes):
    processes.set_epoch(0)
    list(processes)  # the first batches size the ring
    seen, counts = set(), []
    for epoch in (1, 2):
        processes.set_epoch(epoch)
        for batch in processes:
            entries = ring_entries()
            counts.append(len(entries))
            seen.update(entries)
    assert 0 < counts[0] <= processes.prefetch
    assert counts == [counts[0]] * len(counts) and len(seen) == counts[0]  # no segment per batch
    tensor_bytes = batch["x"].numel() * batch["x"].element_size()
    assert all(os.path.getsize(f"/dev/shm/{name}") > tensor_bytes for name in seen)  # grown to fit a batch


def test_break_then_new_pass_equals_a_fresh_loader(ds, processes):
    processes.set_epoch(4)
    for i, _ in enumerate(processes):
        if i == 2:
            break
    held = iter(processes)  # a pass left suspended, not closed
    next(held)
    again = list(processes)  # a new pass ends it; its stale results are dropped
    fresh = _loader(ds)
    fresh.set_epoch(4)
    assert_same_batches(again, list(fresh))
    with pytest.raises(chute.ChuteError, match="ended by a newer pass over the same loader; a Loader runs one pass at a time"):
        next(held)


def test_resume_with_processes_continues_exactly(ds, processes):
    reference = _loader(ds)
    reference.set_epoch(2)
    expected = list(reference)
    processes.set_epoch(2)
    iterator = iter(processes)
    head = [next(iterator) for _ in range(4)]
    state = processes.state_dict()
    iterator.close()
    processes.load_state_dict(state)
    assert_same_batches(head + list(processes), expected)

    resumed = _loader(ds)  # threads restored from the same state agree
    resumed.load_state_dict(state)
    assert_same_batches(list(resumed), expected[4:])


def test_worker_memory_stays_flat(processes):
    list(processes)
    pids = worker_pids()
    assert len(pids) == 2
    before = {pid: rss_bytes(pid) for pid in pids}
    for _ in range(3):
        list(processes)
    assert worker_pids() == pids  # the same workers across epochs
    growth = {pid: rss_bytes(pid) - before[pid] for pid in pids}
    assert all(g < 50 << 20 for g in growth.values()), growth


# ---------------------------------------------------------------- passes: the pool's threads kept across them


def procs_threads(other=()):
    """The worker-process pools' threads, but ``other`` (those of the module's shared Loader)."""
    return [t for t in threading.enumerate() if t.name.startswith("chute-procs") and t not in other]


def test_the_same_receiver_thread_and_workers_serve_every_pass_then_close_leaves_nothing(ds):
    with _loader(ds) as threads:  # the reference: epochs 0-3 on threads (this process maps the shards: before the snapshot)
        expected = []
        for epoch in range(4):
            threads.set_epoch(epoch)
            expected.append(list(threads))
    before, other, others = snapshot(), procs_threads(), set(worker_pids())
    loader = _loader(ds, workers="processes")
    try:
        assert_same_batches(list(loader), expected[0])
        (receiver,) = procs_threads(other)  # a local dataset: no gate thread
        pids = set(worker_pids()) - others
        for epoch in (1, 2):
            it = iter(loader)  # passes left early, with steps in flight on the workers
            next(it)
            it.close()
            assert procs_threads(other) == [receiver]
            assert_same_batches(list(loader), expected[epoch])  # the pass after them is exact
            assert procs_threads(other) == [receiver] and set(worker_pids()) - others == pids  # nothing started or stopped
        iterator = iter(loader)
        head = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
        iterator.close()
        loader.load_state_dict(state)
        assert_same_batches(head + list(loader), expected[3])  # a resume on the same threads
        assert procs_threads(other) == [receiver]
    finally:
        loader.close()
    assert procs_threads(other) == [] and not receiver.is_alive()
    assert_nothing_left(before)


def test_an_unclosed_loader_collected_stops_its_pool_threads_and_workers(ds):
    before, other, others = snapshot(), procs_threads(), set(worker_pids())

    def use():
        loader = _loader(ds, workers="processes")
        for _ in range(2):
            assert len(list(loader)) == N // BATCH
        it = iter(loader)
        next(it)  # left in the middle of a pass
        assert len(procs_threads(other)) == 1 and len(set(worker_pids()) - others) == 2
        return weakref.ref(loader)

    gone_loader = use()
    gc.collect()
    assert gone_loader() is None
    assert procs_threads(other) == []
    assert_nothing_left(before)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_workers_of_its_own_and_leaves_its_parents_alone(ds):
    """A fork copies the pool but none of its threads, and its workers are the parent's: the child's pass starts
    its own workers and threads (sending to the parent's would take the parent's replies), and the child's exit
    stops only its own. The parent's pool goes on with the same workers."""
    with _loader(ds) as threads:
        expected = [list(threads), list(threads)]
    with _loader(ds, workers="processes") as loader:
        assert_same_batches(list(loader), expected[0])
        pids = set(worker_pids())
        it = iter(loader)
        next(it)  # the parent's pass in progress at the fork
        pid = os.fork()
        if pid == 0:  # the child: one whole pass (epoch 1 from its start: the parent's pass had not ended), then out
            ok = False
            signal.alarm(120)  # a child that hangs is killed (and the test fails) instead of hanging the run
            try:
                got = list(loader)
                mine = {w.pid for w in loader._processes._running.workers}
                ok = ids(got) == ids(expected[1]) and len(mine) == 2 and not mine & pids
                loader.close()  # its own workers and threads
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        rest = list(it)  # the parent's pass goes on where it was, on its own workers
        assert len(rest) == N // BATCH - 1 and set(worker_pids()) == pids


def test_a_kept_thread_waits_for_its_last_job_even_after_a_wait_gave_up():
    """A wait that gave up on a slow job is not answered, at the next job's wait, by that job's return."""
    from chute.pipeline.processes import _Kept

    kept = _Kept("chute-test-kept")
    slow, release, second = threading.Event(), threading.Event(), threading.Event()
    kept.run(lambda: (slow.set(), release.wait(10)))
    assert slow.wait(10)
    assert not kept.wait(0.01)  # gave up: the slow job still runs
    release.set()
    assert kept.returns.reach(1, 10)  # the slow job has returned
    kept.run(lambda: second.wait(10))
    assert not kept.wait(0.05)  # the second has not
    second.set()
    assert kept.wait(10)
    assert kept.wake is None  # only a receiver gets a wake-up pipe
    assert kept.stop(10)
