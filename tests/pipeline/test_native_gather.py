"""Gather-only passes on native threads (chute.pipeline.native_gather): the worker threads' batches, exactly.

A pass whose only worker stage is the gather of fixed-size columns from a
local dataset runs on the Loader's ``GatherRing``. These tests hold that its
batches are the ones the worker threads build (values, dtypes, order, the last
short batch, across epochs, passes left early, a resumed state), that only such
passes take it, that its threads are kept across passes and gone once the
Loader is closed or collected (a forked child makes its own), and that the
counters see its work. Events and counts only: no timing.
"""

from __future__ import annotations

import gc
import os
import signal
import time
import weakref

import numpy as np
import pytest
import torch

import chute
from chute.pipeline import native_gather
from chute.pipeline.native_gather import NativePass
from tests.pipeline._helpers import gone_without_a_collection, loader_threads, native_threads

N, BATCH = 250, 16  # a last, short batch of 10


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rng = np.random.default_rng(0)

    def samples():
        for i in range(N):
            yield {
                "image": rng.integers(0, 256, (3, 5, 7), dtype=np.uint8),
                "weight": np.float32(i) / 7,
                "half": torch.full((2,), i / 3, dtype=torch.bfloat16),
                "id": i,
            }

    return chute.write(samples(), tmp_path_factory.mktemp("native") / "ds", shard_size=3000)  # many shards


pytestmark = pytest.mark.usefixtures("no_loader_threads_left")


#: The tests that set the autotuner's reading of the loop's wait by hand (the others pin every pass native).
READING_BY_HAND = {
    "test_native_threads_while_the_loop_waits_for_data_the_worker_threads_while_it_computes",
    "test_a_long_pass_moves_to_the_native_threads_once_the_loop_waits_for_data",
}


@pytest.fixture(autouse=True)
def native_every_pass(request, monkeypatch):
    """Every pass of these tests may run natively: which one does is the autotuner's reading of the loop's
    wait (timing), held by its own test below with the reading set by hand."""
    if request.function.__name__ not in READING_BY_HAND:
        monkeypatch.setattr(chute.Loader, "_native", lambda self: True)


def _epochs(ds, native: bool, monkeypatch, epochs: int = 2, **kwargs) -> list[list[dict]]:
    monkeypatch.setattr(native_gather, "_ENABLED", native)
    with chute.Loader(ds, BATCH, shuffle=True, seed=11, workers=chute.Workers(count=2), **kwargs) as loader:
        out = []
        for _ in range(epochs):
            out.append([{k: v.clone() for k, v in b.items()} for b in loader])
            assert isinstance(loader._pass.executor, NativePass) == native
        return out


def _same(got: list[list[dict]], want: list[list[dict]]) -> None:
    assert len(got) == len(want)
    for g_epoch, w_epoch in zip(got, want):
        assert [len(b["id"]) for b in g_epoch] == [len(b["id"]) for b in w_epoch]
        for g, w in zip(g_epoch, w_epoch):
            assert list(g) == list(w)
            for name in g:
                assert g[name].dtype == w[name].dtype and g[name].shape == w[name].shape, name
                assert torch.equal(g[name], w[name]), name


def test_the_batches_are_the_worker_threads_batches(ds, monkeypatch):
    want = _epochs(ds, False, monkeypatch)
    got = _epochs(ds, True, monkeypatch)
    _same(got, want)
    assert sorted(int(i) for b in got[0] for i in b["id"]) == list(range(N))
    assert got[0][-1]["id"].shape == (N % BATCH,) and got[0][0]["half"].dtype == torch.bfloat16
    first = ds[int(got[0][0]["id"][0])]
    assert torch.equal(got[0][0]["image"][0], torch.as_tensor(first["image"]))


def test_only_a_local_gather_of_fixed_size_columns_runs_natively(ds, tmp_path, monkeypatch):
    """A transform, a variable-size column or ``columnar`` keeps the worker threads."""
    assert _epochs(ds, True, monkeypatch, epochs=1)  # (native: asserted inside)
    with chute.Loader(ds, BATCH, transform=lambda s: s, workers=2) as loader:
        next(iter(loader))
        assert not isinstance(loader._pass.executor, NativePass)
    tagged = chute.write(({"id": i, "tag": str(i)} for i in range(40)), tmp_path / "tagged")
    with chute.Loader(tagged, BATCH, workers=2) as loader:
        assert [int(i) for b in loader for i in b["id"]] == list(range(40))
        assert not isinstance(loader._pass.executor, NativePass)
    with chute.Loader(ds, BATCH, workers=2, columnar=True) as loader:
        next(iter(loader))
        assert not isinstance(loader._pass.executor, NativePass)


@pytest.mark.parametrize("left_after", [0, 1, 7])
def test_a_pass_left_early_then_a_whole_pass_gives_exactly_the_epoch(ds, monkeypatch, left_after):
    want = _epochs(ds, False, monkeypatch, epochs=1)[0]
    monkeypatch.setattr(native_gather, "_ENABLED", True)
    with chute.Loader(ds, BATCH, shuffle=True, seed=11, workers=chute.Workers(count=2, prefetch=8)) as loader:
        for i, _ in enumerate(loader):  # 8 steps in flight when it is left
            if i == left_after:
                break
        got = [{k: v.clone() for k, v in b.items()} for b in loader]
    _same([got], [want])


def test_a_state_saved_mid_epoch_resumes_with_the_next_batch(ds, monkeypatch):
    want = _epochs(ds, True, monkeypatch, epochs=1)[0]
    with chute.Loader(ds, BATCH, shuffle=True, seed=11, workers=2) as loader:
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
        it.close()
    with chute.Loader(ds, BATCH, shuffle=True, seed=11, workers=2) as resumed:
        resumed.load_state_dict(state)
        rest = [b["id"].tolist() for b in resumed]
    assert rest == [b["id"].tolist() for b in want[5:]]


def test_the_same_native_threads_serve_every_pass_and_close_stops_them(ds):
    before = len(native_threads())
    loader = chute.Loader(ds, BATCH, workers=chute.Workers(count=3, prefetch=6))
    first = [b["id"].tolist() for b in loader]
    threads = set(native_threads())
    assert len(threads) == before + 3 and loader_threads() == []  # no Python worker thread at all
    for _ in range(3):
        assert [b["id"].tolist() for b in loader] == first  # unshuffled: every epoch alike
        assert set(native_threads()) == threads
    loader.close()
    assert len(native_threads()) == before


def test_the_autotuned_count_carries_over_to_the_next_pass(ds):
    with chute.Loader(ds, BATCH) as loader:
        list(loader)
        loader._meter.tuner.policy.threads = 2  # as if the tuner had got there
        it = iter(loader)
        next(it)
        assert loader._pass.executor.threads == 2 and loader._ring.threads == 2
        loader._pass.executor.resize(3)  # as the tuner does during a pass
        assert loader._ring.threads == 3 and len(native_threads()) >= 3
        it.close()


@pytest.mark.parametrize("how", ["whole", "left"])
def test_a_loader_out_of_scope_is_freed_without_a_garbage_collection(ds, how):
    def use() -> weakref.ref:
        loader = chute.Loader(ds, BATCH, workers=2)
        for i, _ in enumerate(loader):
            if how == "left" and i == 2:
                break
        assert len(native_threads()) == 2
        return weakref.ref(loader)

    gone_without_a_collection(use, native_threads)


def test_a_held_pass_keeps_its_loader_and_its_threads(ds):
    loader = chute.Loader(ds, BATCH, workers=2)
    it = iter(loader)
    next(it)
    del loader
    gc.collect()
    assert len(native_threads()) == 2
    assert len(list(it)) == -(-N // BATCH) - 1
    del it
    gc.collect()
    assert native_threads() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_makes_native_threads_of_its_own(ds):
    with chute.Loader(ds, BATCH, workers=2) as loader:
        want = [b["id"].tolist() for b in loader]
        pid = os.fork()
        if pid == 0:  # the child: one whole pass, then out without running the parent's cleanup
            ok = False
            signal.alarm(60)  # a child that hangs is killed (and the test fails) instead of hanging the run
            try:
                ok = [b["id"].tolist() for b in loader] == want and len(native_threads()) == 2
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert [b["id"].tolist() for b in loader] == want  # the parent's threads go on


def test_the_counters_see_the_native_work(ds):
    with chute.Loader(ds, BATCH, workers=2) as loader:
        list(loader)
        snap = loader.counters.snapshot()
        report = loader.report()
    read, order, workers = snap.stages["read"], snap.stages["order"], snap.stages["workers"]
    batches = -(-N // BATCH)
    assert read.items == order.items == N and workers.items == batches
    assert read.nbytes == N * (3 * 5 * 7 + 4 + 2 * 2 + 8)
    assert read.busy_ns > 0 and workers.busy_ns == read.busy_ns
    assert read.workers == 2 and report.samples == N


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux's SCHED_BATCH")
def test_native_threads_are_batch_work(ds):
    from chute import _sched

    with chute.Loader(ds, BATCH, workers=2) as loader:
        list(loader)
        classes = {tid: os.sched_getscheduler(tid) for tid in native_threads()}
    want = os.SCHED_BATCH if _sched._ENABLED else os.SCHED_OTHER
    assert len(classes) == 2 and set(classes.values()) == {want}, classes


def _kind(loader) -> type:
    """The executor of a new pass (started, then left)."""
    it = iter(loader)
    next(it)
    kind = type(loader._pass.executor)
    it.close()
    return kind


def test_native_threads_while_the_loop_waits_for_data_the_worker_threads_while_it_computes(ds):
    """A native pass costs the loop more of its own time per batch (it queues each step itself) and builds more
    batches per second; the worker threads' hand-over costs the loop less. Before any measured window the
    pass runs on the worker threads; then the autotuner's reading of the loop's last windows decides, pass by
    pass. With no autotuner (the count and prefetch fixed) every pass is native."""
    with chute.Loader(ds, BATCH, workers=chute.Workers(count=2, prefetch=4)) as fixed:
        assert fixed._meter.tuner is None and _kind(fixed) is NativePass
    with chute.Loader(ds, BATCH) as loader:
        policy = loader._meter.tuner.policy
        assert policy.data_bound is None and _kind(loader) is not NativePass
        for waits, native in [(0.01, False), (0.5, True), (0.0, False)]:
            policy._waits.clear()
            policy._waits.extend([waits] * 5)  # as if the loop had waited that share of its last windows
            assert (_kind(loader) is NativePass) == native
            assert [b["id"].tolist() for b in loader] == [list(range(i, min(i + BATCH, N))) for i in range(0, N, BATCH)]


def test_a_long_pass_moves_to_the_native_threads_once_the_loop_waits_for_data(ds):
    """A pass that began on the worker threads (no reading yet) goes on on the native threads from the batch
    after the autotuner's reading says the loop waits for data: every sample once, in the epoch's order, and
    a state saved after the move resumes with the next batch."""
    events: list[str] = []
    with chute.Loader(ds, 1, shuffle=True, seed=4) as loader:  # 250 steps of one sample
        loader.hooks.pass_event = lambda run, event, before, after: events.append(event)
        tuner = loader._meter.tuner
        want = [int(r) for r in loader.order.global_order(0)]
        it = iter(loader)
        got = [next(it)["id"].item() for _ in range(5)]
        assert not isinstance(loader._pass.executor, NativePass)
        tuner.policy._waits.clear()
        tuner.policy._waits.extend([0.5] * 5)  # as if the loop had waited half of its last windows
        time.sleep(tuner.window_ns / 1e9 + 0.01)  # the next batch closes a window: the reading is looked at
        got.append(next(it)["id"].item())
        got.append(next(it)["id"].item())  # the pass's stages were rebuilt before this one
        assert isinstance(loader._pass.executor, NativePass)
        assert events.count("native") == 1 and events.count("restarted") == 1
        state = loader.state_dict()
        got += [b["id"].item() for b in it]
        assert got == want
        assert events.count("native") == 1  # once per pass
    with chute.Loader(ds, 1, shuffle=True, seed=4) as resumed:
        resumed.load_state_dict(state)
        assert [b["id"].item() for b in resumed] == want[7:]
