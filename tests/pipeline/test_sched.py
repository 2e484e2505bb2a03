"""chute's own threads and worker processes are batch work: a woken worker never preempts the training loop.

(chute._sched: Linux's SCHED_BATCH class, same CPU share, no wake-up
preemption; the loop's own thread keeps the class it had.)
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import chute

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux's SCHED_BATCH (os.sched_getscheduler)")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("sched") / "ds"
    # (a variable-size column keeps the passes on the worker threads: native threads, tested below, run the rest)
    chute.write(({"x": np.full(4, i, np.int32), "id": i, "tag": str(i)} for i in range(96)), path, shard_size=400)
    return path


def _classes(prefix: str) -> dict[str, int]:
    return {t.name: os.sched_getscheduler(t.native_id) for t in threading.enumerate() if t.name.startswith(prefix)}


@linux_only
def test_worker_threads_are_batch_work_and_the_loop_keeps_its_class(ds):
    before = os.sched_getscheduler(0)
    with chute.Loader(chute.open(ds), 8, shuffle=True, seed=1, workers=2) as loader:
        ids = [int(i) for b in loader for i in b["id"]]
        classes = _classes("chute-loader")
    assert sorted(ids) == list(range(96))
    assert len(classes) == 2 and set(classes.values()) == {os.SCHED_BATCH}, classes
    assert os.sched_getscheduler(0) == before  # the training loop's thread is left as it was


def _wait(sample):
    time.sleep(0.001)  # a read sample by sample: the task mostly waits
    return sample


@linux_only
def test_worker_threads_whose_tasks_mostly_wait_go_back_to_the_default_class(ds):
    with chute.Loader(chute.open(ds), 8, transform=_wait, workers=1) as loader:
        passes = [[int(i) for b in loader for i in b["id"]] for _ in range(2)]  # 24 tasks: 3 looks at them
        classes = _classes("chute-loader")
    assert passes == [list(range(96))] * 2
    assert list(classes.values()) == [os.SCHED_OTHER], classes


def test_a_thread_moves_between_the_classes_as_its_tasks_change(monkeypatch):
    from chute import _sched

    cpu, waits, moves = [0], [0], []
    monkeypatch.setattr(_sched, "_ENABLED", True)
    monkeypatch.setattr(_sched, "_BATCH", 3)
    monkeypatch.setattr(_sched.time, "thread_time_ns", lambda: cpu[0])
    monkeypatch.setattr(_sched, "_waits", lambda: waits[0])
    monkeypatch.setattr(_sched, "_set", lambda policy: moves.append(policy) or True)
    adaptive = _sched.Adaptive()
    assert adaptive.active and adaptive.batch and moves == [3]
    many = _sched.WAITS * _sched.CHECK_EVERY + 1
    for share, blocked, batch in [
        (600, many, True),  # 60% of the tasks' time computing: stays
        (400, 2 * _sched.CHECK_EVERY, True),  # waiting, but twice a task: the GIL, not reads; stays
        (400, many, False),  # waiting, blocked many times a task: reads or sleeps; the default class
        (100, many, False),  # still: no call
        (900, many, True),  # computing again
    ]:
        cpu[0] += share
        waits[0] += blocked
        adaptive.check(1000)
        assert adaptive.batch is batch
    assert moves == [3, _sched._OTHER, 3]


@linux_only
def test_worker_processes_and_their_receiver_are_batch_work(ds):
    with chute.Loader(chute.open(ds), 8, workers=chute.Workers("processes", count=2)) as loader:
        ids = [int(i) for b in loader for i in b["id"]]
        workers = [p.pid for p in multiprocessing.active_children() if p.name.startswith("chute-worker")]
        assert len(workers) == 2
        assert {os.sched_getscheduler(pid) for pid in workers} == {os.SCHED_BATCH}
        assert set(_classes("chute-procs-r").values()) == {os.SCHED_BATCH}
    assert ids == list(range(96))


@linux_only
def test_chute_thread_policy_normal_keeps_the_default_class(ds):
    code = textwrap.dedent(f"""
        import os, threading, chute
        loader = chute.Loader(chute.open({str(ds)!r}), 8, workers=2)
        assert sum(int(b["id"].sum()) for b in loader) == sum(range(96))
        print(sorted(os.sched_getscheduler(t.native_id) for t in threading.enumerate() if t.name.startswith("chute-loader")))
        loader.close()
    """)
    env = dict(os.environ, CHUTE_THREAD_POLICY="normal")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [f"[{os.SCHED_OTHER},", f"{os.SCHED_OTHER}]"]


def test_a_platform_or_sandbox_that_refuses_the_class_changes_nothing(monkeypatch):
    from chute import _sched

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    calls = []
    monkeypatch.setattr(_sched, "_ENABLED", True)
    monkeypatch.setattr(_sched, "_BATCH", 3)
    monkeypatch.setattr(_sched, "_thread_class", lambda policy, slice_ns: calls.append((policy, slice_ns)) and False)
    monkeypatch.setattr(os, "sched_setscheduler", refuse, raising=False)
    assert _sched.background() is False  # chute._native's call (class and slice) refused, and the class alone too
    assert calls == [(3, _sched.SLICE_NS)]
    monkeypatch.setattr(_sched, "_thread_class", None)  # a build without the extension
    assert _sched.background() is False
    monkeypatch.setattr(os, "sched_setscheduler", lambda pid, policy, param: calls.append(policy), raising=False)
    assert _sched.background() is True  # a sandbox that filters sched_setattr only: the class without the slice
    assert calls[-1] == 3
    monkeypatch.setattr(_sched, "_ENABLED", False)
    assert _sched.background() is False


def _slice_ns(tid: int | str = "thread-self") -> int | None:
    """A thread's EEVDF time slice in ns, from /proc (Linux 6.6+), or None."""
    path = "/proc/thread-self/sched" if tid == "thread-self" else f"/proc/self/task/{tid}/sched"
    try:
        with open(path) as f:
            lines = [line for line in f if line.startswith("se.slice")]
    except OSError:
        return None
    return int(lines[0].split(":")[1]) if lines else None


def _custom_slices() -> bool:
    """Whether the kernel keeps a thread's own slice (Linux 6.12+: sched_attr.sched_runtime of the fair classes)."""
    from chute._native import thread_class

    result: list[int | None] = []

    def probe() -> None:
        thread_class(os.SCHED_BATCH, 7_000_000)
        result.append(_slice_ns())

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return result == [7_000_000]


custom_slices = pytest.mark.skipif(
    not hasattr(os, "SCHED_BATCH") or not _custom_slices(), reason="needs Linux 6.12+ (a thread's own time slice)"
)


@custom_slices
def test_worker_threads_take_long_slices_and_the_loop_keeps_its_own(ds):
    before = _slice_ns()
    with chute.Loader(chute.open(ds), 8, shuffle=True, seed=1, workers=2) as loader:
        ids = [int(i) for b in loader for i in b["id"]]
        slices = {t.name: _slice_ns(t.native_id) for t in threading.enumerate() if t.name.startswith("chute-loader")}
    from chute import _sched

    assert sorted(ids) == list(range(96))
    assert len(slices) == 2 and set(slices.values()) == {_sched.SLICE_NS}, slices
    assert _slice_ns() == before  # the training loop's thread is left as it was


@custom_slices
def test_a_worker_thread_back_in_the_default_class_takes_the_default_slice(ds):
    default = _slice_ns()
    with chute.Loader(chute.open(ds), 8, transform=_wait, workers=1) as loader:
        assert [[int(i) for b in loader for i in b["id"]] for _ in range(2)] == [list(range(96))] * 2
        slices = [_slice_ns(t.native_id) for t in threading.enumerate() if t.name.startswith("chute-loader")]
    assert slices == [default]


@linux_only
def test_the_class_call_keeps_the_threads_nice_value_and_checks_its_arguments():
    from chute._native import thread_class

    seen: list[tuple[int, int]] = []

    def run() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 7)  # Linux: this thread's nice value (a process started under nice)
        for policy, slice_ns in [(os.SCHED_BATCH, 20_000_000), (os.SCHED_OTHER, 0)]:
            assert thread_class(policy, slice_ns) is True
            seen.append((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [(os.SCHED_BATCH, 7), (os.SCHED_OTHER, 7)]
    with pytest.raises(ValueError, match="policy must be 0"):
        thread_class(1, 0)  # SCHED_FIFO: a real-time class is never asked for
    with pytest.raises(ValueError, match="slice_ns"):
        thread_class(os.SCHED_BATCH, 10**9)
