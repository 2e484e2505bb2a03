"""The threads of stages on threads of their own (a user's ``where="thread"`` stage, the device copy) are kept
across the passes of one Loader, as its worker threads are.

A pass hands each kept thread its relay loop and waits for it at its end. These
tests hold that the same threads serve every pass, that a pass left early (or
broken by a stall) leaves nothing to the next (the same batches as a fresh
Loader's), that a stuck stage's thread is left behind and replaced, and that
nothing is left once the Loader is closed or gone, or in a forked child's
passes. Events and counts only: no timing.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest

import chute
from tests.pipeline._helpers import gone_without_a_collection

N, BATCH = 240, 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    samples = ({"x": np.full(4, i, np.int32), "id": i} for i in range(N))
    return chute.write(samples, tmp_path_factory.mktemp("stage-threads") / "ds", shard_size=1500)


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("chute-stage-", "chute-device"))]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    gc.collect()
    assert [t.name for t in stage_threads()] == []


def plus_one(batch):
    return {**batch, "x": batch["x"] + 1}


def make(ds, **kwargs) -> chute.Loader:
    return chute.Loader(ds, BATCH, shuffle=True, seed=3, device="cpu", workers=2,
                        stages=[chute.BatchStage(plus_one, name="plus", where="thread")], **kwargs)


def batches(loader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


def reference(ds, epoch: int) -> list[list[int]]:
    with chute.Loader(ds, BATCH, shuffle=True, seed=3) as fresh:
        fresh.set_epoch(epoch)
        return batches(fresh)


def test_the_same_stage_and_device_threads_serve_every_pass_also_after_one_left_early(ds):
    with make(ds) as loader:
        first = [(b["id"].tolist(), b["x"][:, 0].tolist()) for b in loader]
        assert first == [(ids, [i + 1 for i in ids]) for ids in reference(ds, 0)]  # the stage ran once per batch
        threads = stage_threads()
        assert sorted(t.name for t in threads) == ["chute-device:cpu", "chute-stage-plus-r0"]
        idents = {t.ident for t in threads}
        for e in range(1, 5):
            loader.set_epoch(e)
            if e % 2:  # left early, after a few batches: the next pass of the same epoch is whole and exact
                it = iter(loader)
                for _ in range(3):
                    next(it)
                del it
            assert batches(loader) == reference(ds, e)
            assert {t.ident for t in stage_threads()} == idents  # no thread started, none stopped


def test_a_stuck_stage_is_left_behind_and_the_next_pass_gets_a_thread_of_its_own(ds):
    """The watchdog breaks a pass whose stage thread is stuck: that thread is left behind (it exits once its
    batch returns), a fresh one runs the next pass, which is exact."""
    release, stuck_once = threading.Event(), threading.Event()

    def stuck_on_batch_1(batch):
        if int(batch["id"][0]) == BATCH and not stuck_once.is_set():
            stuck_once.set()
            release.wait(60)
        return batch

    loader = chute.Loader(ds, BATCH, workers=1, watchdog=chute.Watchdog(1.0, on_stall="raise"),
                          stages=[chute.BatchStage(stuck_on_batch_1, name="stuck", where="thread")])
    try:
        got = []
        with pytest.raises(chute.StallError):
            for b in loader:
                got.append(b["id"].tolist())
        assert got == [list(range(0, BATCH))]
        (left_behind,) = stage_threads()
        it = iter(loader)
        first = next(it)["id"].tolist()  # through a fresh thread while the old one is still stuck
        fresh = [t for t in stage_threads() if t is not left_behind]
        assert len(fresh) == 1 and left_behind.is_alive()
        release.set()
        left_behind.join(10)
        assert not left_behind.is_alive()
        rest = [b["id"].tolist() for b in it]
        assert [first, *rest] == [list(range(i, i + BATCH)) for i in range(0, N, BATCH)]
        assert stage_threads() == fresh
    finally:
        release.set()
        loader.close()


def test_close_stops_the_kept_stage_threads(ds):
    loader = make(ds)
    batches(loader)
    it = iter(loader)
    next(it)  # a pass in progress
    assert len(stage_threads()) == 2
    loader.close()
    assert stage_threads() == []
    del it


@pytest.mark.parametrize("how", ["whole", "left"])
def test_an_unclosed_loader_out_of_scope_stops_its_stage_threads_without_a_garbage_collection(ds, how):
    def use() -> weakref.ref:
        loader = make(ds)
        for i, _ in enumerate(loader):
            if how == "left" and i == 2:
                break
        assert len(stage_threads()) == 2
        return weakref.ref(loader)

    gone_without_a_collection(use, stage_threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_stage_threads_of_its_own_for_its_passes(ds):
    with make(ds) as loader:
        assert batches(loader) == reference(ds, 0)
        it = iter(loader)
        next(it)  # the parent's pass in progress at the fork
        pid = os.fork()
        if pid == 0:  # the child: one whole pass on threads of its own, then out without the parent's cleanup
            ok = False
            signal.alarm(60)  # a child that hangs is killed (and the test fails) instead of hanging the run
            try:
                ok = batches(loader) == reference(ds, 1)  # (epoch 1: the one after the whole pass)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        rest = [b["id"].tolist() for b in it]  # the parent's pass goes on, on its threads
        assert rest == reference(ds, 1)[1:]


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux's SCHED_BATCH (os.sched_getscheduler)")
def test_kept_stage_threads_are_batch_work_as_the_workers_are(ds):
    with make(ds) as loader:
        batches(loader)
        classes = {t.name: os.sched_getscheduler(t.native_id) for t in stage_threads()}
    assert len(classes) == 2 and set(classes.values()) == {os.SCHED_BATCH}, classes


def reads_sample_by_sample(batch):
    for _ in range(BATCH):
        time.sleep(0.0002)  # a read per sample: the stage mostly waits, blocking many times a batch
    return batch


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="needs Linux's SCHED_BATCH (os.sched_getscheduler)")
def test_a_thread_stage_that_mostly_waits_goes_back_to_the_default_class(ds):
    stage = chute.BatchStage(reads_sample_by_sample, name="reads", where="thread")
    with chute.Loader(ds, BATCH, shuffle=True, seed=3, stages=[stage]) as loader:
        assert batches(loader) == reference(ds, 0)  # 30 batches: 3 looks at what the stage does
        classes = [os.sched_getscheduler(t.native_id) for t in stage_threads()]
    assert classes == [os.SCHED_OTHER]
