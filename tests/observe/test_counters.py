"""Counters: exact counts from many threads, per-stage figures of a real Loader, the trace, the pool's resizing."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch

import chute
from chute._channel import Channel
from chute.errors import ChuteError
from chute.observe.counters import Counters
from chute.pipeline.threads import ThreadExecutor

N = 600
BATCH = 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("counters") / "ds"
    samples = ({"x": np.full(16, i, np.float32), "id": i} for i in range(N))
    return chute.write(samples, path, shard_size=20_000)  # a few shards


def chute_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("chute-loader", "chute-device", "test-pool"))]


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    assert chute_threads() == []


def test_adds_from_many_threads_are_all_counted_and_ended_threads_fold():
    counters = Counters()
    stage = counters.stage("read")

    def work():
        for _ in range(20_000):
            stage.add(0.000001, items=1, nbytes=3)
            stage.wait_in(0.000002)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = stage.totals()
    assert totals.items == 160_000
    assert totals.nbytes == 480_000
    assert totals.busy_ns == 160_000 * 1000
    assert totals.wait_in_ns == 160_000 * 2000
    assert stage._cells == []  # the 8 ended threads' cells were folded into one
    assert stage.totals().items == 160_000  # and still counted


def test_snapshots_subtract_to_a_window():
    counters = Counters()
    counters.stage("fetch", unit="shards").add(0.5, items=2, nbytes=100)
    first = counters.snapshot()
    counters.stage("fetch").add(0.25, items=1, nbytes=50)
    counters.consumer.batches += 3
    window = counters.snapshot() - first
    fetch = window.stages["fetch"]
    assert (fetch.items, fetch.nbytes, fetch.busy_ns, fetch.unit) == (1, 50, 250_000_000, "shards")
    assert window.consumer.batches == 3
    assert window.time_ns > 0


def test_a_loader_counts_every_stage_exactly(ds):
    def tag(sample):
        sample["x"] = sample["x"] * 2
        return sample

    loader = chute.Loader(ds, BATCH, shuffle=True, seed=1, transform=tag, workers=2)
    seen = sum(len(b["id"]) for b in loader)
    assert seen == N
    report = loader.report()
    assert report.batches == N // BATCH and report.samples == N
    assert report.window == "last pass"
    stages = report.stages
    assert set(stages) == {"order", "read", "transform"}  # no device, no downloads
    assert stages["read"].items == stages["order"].items == stages["transform"].items == N
    assert stages["read"].bytes == N * (16 * 4 + 8)  # float32[16] + int64 id, gathered
    assert stages["transform"].bytes == N * (16 * 4 + 8)  # and collated back into tensors of the same size
    assert stages["read"].workers == 2
    assert all(stages[s].busy_s > 0 for s in ("order", "read", "transform"))
    assert stages["transform"].parts["per_sample"] > 0 and stages["transform"].parts["collate"] > 0
    assert 0 < stages["read"].utilisation <= 1
    snap = loader.counters.snapshot()
    assert snap.stages["workers"].items == N // BATCH  # one task per batch
    assert report.elapsed_s == pytest.approx(report.wait_s + report.compute_s)


def test_a_second_pass_reports_only_itself_and_since_start_covers_both(ds):
    loader = chute.Loader(ds, BATCH, workers=1)
    list(loader)
    for i, _ in enumerate(loader):
        if i == 9:
            assert loader.report().window == "this pass so far"
            assert loader.report().batches == 10
    assert loader.report().batches == N // BATCH
    life = loader.report(since="start")
    assert life.batches == 2 * N // BATCH and life.samples == 2 * N
    assert life.window == "loader life"
    with pytest.raises(ValueError, match="since"):
        loader.report(since="yesterday")


def test_device_stage_is_counted(ds):
    loader = chute.Loader(ds, BATCH, workers=1, device="cpu")
    assert sum(len(b["id"]) for b in loader) == N
    device = loader.report().stages["device"]
    assert device.items == N
    assert device.workers == 1
    assert device.busy_s > 0
    assert device.bytes == N * (16 * 4 + 8)


def _double(sample):
    sample["x"] = sample["x"] * 2
    return sample


def test_worker_processes_report_their_busy_time(ds):
    with chute.Loader(ds, BATCH, transform=_double, workers=chute.Workers("processes", count=2)) as loader:
        assert sum(len(b["id"]) for b in loader) == N
        report = loader.report()
    assert report.samples == N
    assert report.stages["read"].items == N and report.stages["read"].busy_s > 0
    assert report.stages["transform"].parts["per_sample"] > 0
    assert report.stages["read"].workers == 2
    assert report.settings["workers"] == "processes" and report.settings["autotune"] is False


def test_counters_off_gives_the_same_batches_and_no_report(ds):
    on = chute.Loader(ds, BATCH, shuffle=True, seed=4, workers=2)
    off = chute.Loader(ds, BATCH, shuffle=True, seed=4, workers=2, _counters=False)
    assert [b["id"].tolist() for b in on] == [b["id"].tolist() for b in off]
    assert off.counters is None
    with pytest.raises(ChuteError, match="_counters=False"):
        off.report()


@pytest.mark.parametrize("native", [True, False])
def test_trace_is_a_chrome_trace_of_the_last_batches(ds, tmp_path, monkeypatch, native):
    from chute.pipeline import native_gather

    monkeypatch.setattr(native_gather, "_ENABLED", native)  # gather-only: on native threads, or the worker threads
    monkeypatch.setattr(chute.Loader, "_native", lambda self: True)  # (not left to the autotuner's reading)
    loader = chute.Loader(ds, BATCH, workers=2, device="cpu")
    list(loader)
    path = loader.trace(tmp_path / "trace.json")
    doc = json.loads(open(path).read())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid"}
        assert e["dur"] >= 0
    names = {e["name"] for e in spans}
    assert names >= {"order", "read", "device", "wait", "compute"}
    read_steps = sorted(e["args"]["step"] for e in spans if e["name"] == "read")
    assert read_steps == list(range(N // BATCH))  # the ring holds this whole short pass
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(t.startswith("chute-device") for t in threads)
    if native:  # the reads on the native gather threads' track
        assert "native gather threads" in threads and {e["tid"] for e in spans if e["name"] == "read"} == {2}
    else:
        assert any(t.startswith("chute-loader") for t in threads)
    last = loader.trace(tmp_path / "last.json", batches=5)
    steps = {e["args"]["step"] for e in json.loads(open(last).read())["traceEvents"] if e["ph"] == "X"}
    assert steps == set(range(N // BATCH - 5, N // BATCH))
    assert not list(tmp_path.glob("*.tmp-*"))


def test_chute_observe_is_the_function_even_after_importing_submodules():
    import chute.observe.counters  # noqa: F401
    from chute.observe.report import Report

    assert callable(chute.observe)
    observed = chute.observe([torch.zeros(4, 2), torch.zeros(3, 2)])
    assert [b.shape[0] for b in observed] == [4, 3]
    report = observed.report()
    assert isinstance(report, Report)
    assert (report.batches, report.samples) == (2, 7)


class _Task:
    """A batch task stand-in for the executor: ``fn(step)`` on a worker thread."""

    def __init__(self, fn):
        self.fn, self.workers = fn, 0

    def register(self, ident):
        self.workers += 1
        return self.workers - 1

    def __call__(self, step, start, w):
        return self.fn(step), time.perf_counter_ns()


def _results(executor, channel, steps):
    """Take ``steps`` results in order, submitting ahead as the Loader's stream does."""
    submitted = 0
    for step in range(steps):
        while submitted < min(steps, step + executor.depth):
            executor.submit(submitted)
            submitted += 1
        yield channel.take(step, 10)


def test_executor_grows_and_shrinks_while_results_stay_in_order():
    release = threading.Event()

    def slow(i):
        if i == 3:
            release.wait(5)
        return i * 10

    channel = Channel(16)
    executor = ThreadExecutor(1, 8, name="test-pool")
    try:
        work = executor.bind(_Task(slow), channel)
        results = _results(work, channel, 40)
        assert [next(results) for _ in range(3)] == [0, 10, 20]
        work.resize(4)  # task 3 blocks one thread; the others keep going
        assert work.threads == 4
        assert len([t for t in threading.enumerate() if t.name.startswith("test-pool")]) == 4
        release.set()
        assert next(results) == 30
        before = [t for t in threading.enumerate() if t.name.startswith("test-pool")]
        work.resize(2)
        assert work.threads == 2
        work.set_depth(2)
        assert list(results) == [i * 10 for i in range(4, 40)]
        assert work.close() == []
        for thread in before:
            if thread.ident not in executor.idents:
                thread.join(5)  # a retired thread exits once it has finished its task
        assert len([t for t in threading.enumerate() if t.name.startswith("test-pool")]) == 2
    finally:
        assert executor.shutdown() == []
    assert [t for t in threading.enumerate() if t.name.startswith("test-pool")] == []


def test_executor_counts_the_hand_over_as_busy_not_idle(monkeypatch):
    """A worker's put (which lets go of the batches the loop dropped) is its work: counted idle, the autotuner read
    busy workers as starved of steps and deepened the prefetch for nothing. The clock moves only inside the put."""
    import chute.pipeline.threads as threads

    now = [0]
    monkeypatch.setattr(threads, "_clock", lambda: now[0])

    class SlowPut(Channel):
        def put(self, step, item):
            now[0] += 1_000_000  # 1 ms of the fake clock per hand-over, nothing elsewhere
            super().put(step, item)

    class Task(_Task):
        def __call__(self, step, start, w):
            return self.fn(step), now[0]

    totals = _counted(Task(lambda i: i), SlowPut(4), threads=1)  # one thread: only its own puts move the clock
    assert totals.items == 10
    assert totals.busy_ns == 10 * 1_000_000
    assert totals.wait_out_ns == 0


def _counted(task, channel, threads):
    """Ten steps of ``task`` on ``threads`` counted worker threads, results into ``channel``: the workers' totals."""
    counters = Counters()
    stage = counters.stage("workers")
    executor = ThreadExecutor(threads, 2, name="test-pool", stage=stage)
    try:
        work = executor.bind(task, channel)
        assert list(_results(work, channel, 10)) == list(range(10))
        work.close()
    finally:
        executor.shutdown()
    return stage.totals()


def test_executor_counts_busy_and_idle_time_per_thread():
    totals = _counted(_Task(lambda i: time.sleep(0.01) or i), Channel(4), threads=2)
    assert totals.items == 10
    assert totals.busy_ns >= 10 * 10_000_000  # each task slept 10 ms
    assert totals.workers == 2
