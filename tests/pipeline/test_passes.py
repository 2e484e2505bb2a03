"""Short passes over one Loader: its worker threads are kept across passes, and every pass is exact.

A pass binds the Loader's threads to its own task, queue and channel; a pass
that ends (exhausted, left early, failed, stalled) hands them back. These
tests hold that the threads are the same ones from pass to pass, that nothing
of an ended pass reaches the next one (the same batches, in the same order, as
a fresh Loader's), and that nothing is left once the Loader is closed or gone.
Events and counts only: no timing.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import weakref

import numpy as np
import pytest

import chute
from tests.pipeline._helpers import gone_without_a_collection, loader_threads

N, BATCH = 240, 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    # (a variable-size column keeps the passes on the worker threads: gather-only ones of fixed-size columns run
    # on native threads, tests/pipeline/test_native_gather.py)
    samples = ({"x": np.full(4, i, np.int32), "id": i, "tag": f"t{i}"} for i in range(N))
    return chute.write(samples, tmp_path_factory.mktemp("passes") / "ds", shard_size=1500)  # a few shards


pytestmark = pytest.mark.usefixtures("no_loader_threads_left")


def batches(loader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


def epoch(ds, epoch: int, **kwargs) -> list[list[int]]:
    """The batches of ``epoch`` from a fresh Loader (the reference)."""
    with chute.Loader(ds, BATCH, shuffle=True, seed=3, **kwargs) as fresh:
        fresh.set_epoch(epoch)
        return batches(fresh)


def test_the_same_threads_serve_every_pass(ds):
    with chute.Loader(ds, BATCH, shuffle=True, seed=3, workers=chute.Workers(count=3, prefetch=6)) as loader:
        first = batches(loader)
        threads = set(loader_threads())
        idents = {t.ident for t in threads}
        assert len(threads) == 3 and set(loader._pass.task.threads) <= idents  # the threads that joined the pass
        for e in range(1, 4):
            assert batches(loader) == epoch(ds, e, workers=chute.Workers(count=3, prefetch=6))
            assert set(loader_threads()) == threads  # no thread started, none stopped
            assert set(loader._pass.task.threads) <= idents  # (a thread not woken before a short pass ended joins none)
    assert first == epoch(ds, 0)


def test_the_autotuned_count_carries_over_to_the_next_pass(ds):
    with chute.Loader(ds, BATCH) as loader:
        batches(loader)
        loader._meter.tuner.policy.threads = 2  # as if the tuner had got there
        it = iter(loader)
        next(it)
        assert loader._pass.executor.threads == 2 and len(loader_threads()) == 2
        it.close()


@pytest.mark.parametrize("left_after", [0, 1, 5, 28])  # (29: the last batch, which ends the epoch)
def test_passes_left_early_then_a_whole_pass_gives_exactly_the_epoch(ds, left_after):
    """Left with batches in flight on every thread (deep prefetch, a transform that waits a little):
    the next pass restarts the epoch and delivers exactly its batches, none of the old pass's."""
    gate = threading.Event()

    def held(sample):
        gate.wait(0.001)  # (releases the GIL: the threads overlap)
        return sample

    kwargs = {"transform": held, "workers": chute.Workers(count=3, prefetch=12)}
    with chute.Loader(ds, BATCH, shuffle=True, seed=3, **kwargs) as loader:
        for _ in range(3):  # three passes left early in a row
            it = iter(loader)
            for _ in range(left_after + 1):
                next(it)
            it.close()
        assert batches(loader) == epoch(ds, 0)
        assert batches(loader) == epoch(ds, 1)


def test_a_pass_dropped_mid_epoch_then_a_whole_pass(ds):
    with chute.Loader(ds, BATCH, shuffle=True, seed=3, workers=chute.Workers(count=2, prefetch=8)) as loader:
        it = iter(loader)
        next(it)
        del it  # the iterator dropped without closing it (its pass ends when collected)
        gc.collect()
        assert batches(loader) == epoch(ds, 0)


def test_a_failed_pass_then_a_good_pass(ds):
    failing = {"on": True}

    def explode_on_17(sample):
        if failing["on"] and int(sample["id"]) == 17:
            raise ValueError("bad pixel")
        return sample

    with chute.Loader(ds, BATCH, transform=explode_on_17, workers=chute.Workers(count=2, prefetch=8)) as loader:
        got = []
        with pytest.raises(chute.ChuteError, match="sample 17"):
            for b in loader:
                got.append(b["id"].tolist())
        assert got == [list(range(i, i + BATCH)) for i in range(0, 16, BATCH)]  # batches 0 and 1; batch 2 failed
        threads = set(loader_threads())
        failing["on"] = False
        assert batches(loader) == [list(range(i, i + BATCH)) for i in range(0, N, BATCH)]  # the epoch again, whole
        assert set(loader_threads()) == threads


def test_a_stalled_pass_leaves_its_stuck_thread_behind_and_the_next_pass_is_exact(ds):
    """The watchdog breaks a pass whose thread is stuck: that thread is left behind, a fresh one builds the
    next pass, and the stuck step's result, once it comes, is dropped (its pass's channel is closed)."""
    release, stuck_once = threading.Event(), threading.Event()

    def stuck_on_13(sample):
        if int(sample["id"]) == 13 and not stuck_once.is_set():
            stuck_once.set()
            release.wait(60)
        return sample

    watchdog = chute.Watchdog(1.0, on_stall="raise")
    loader = chute.Loader(ds, BATCH, transform=stuck_on_13, workers=chute.Workers(count=1, prefetch=2), watchdog=watchdog)
    try:
        got = []
        with pytest.raises(chute.StallError):
            for b in loader:
                got.append(b["id"].tolist())
        assert got == [list(range(0, BATCH))]  # batch 1 (samples 8..15) is stuck
        (left_behind,) = loader_threads()
        it = iter(loader)
        first = next(it)["id"].tolist()  # built by a fresh thread while the old one is still stuck
        fresh = [t for t in loader_threads() if t is not left_behind]
        assert len(fresh) == 1 and left_behind.is_alive()
        release.set()  # the old step finishes now, into its ended pass
        left_behind.join(10)
        assert not left_behind.is_alive()
        rest = [b["id"].tolist() for b in it]
        assert [first, *rest] == [list(range(i, i + BATCH)) for i in range(0, N, BATCH)]
        assert loader_threads() == fresh
    finally:
        release.set()
        loader.close()


def test_close_and_collection_stop_the_threads(ds):
    loader = chute.Loader(ds, BATCH, workers=2)
    batches(loader)
    assert len(loader_threads()) == 2
    loader.close()
    assert loader_threads() == []
    loader = chute.Loader(ds, BATCH, workers=2)
    batches(loader)
    it = iter(loader)
    next(it)  # a pass in progress, held
    del loader
    gc.collect()
    assert len(loader_threads()) == 2  # the held pass keeps its Loader
    del it
    gc.collect()
    assert loader_threads() == []


def _explode_on_5(sample):
    if int(sample["id"]) == 5:
        raise ValueError("bad pixel")
    return sample


@pytest.mark.parametrize("how", ["whole", "left", "failed"])
def test_a_loader_out_of_scope_is_freed_without_a_garbage_collection(ds, how):
    """No reference cycle holds a Loader (its root, its ended passes, a failed step's exception): once out of
    scope it is freed at once, and its finalizer stops its threads, with the cyclic collector off."""

    def use() -> weakref.ref:
        loader = chute.Loader(ds, BATCH, workers=2, transform=_explode_on_5 if how == "failed" else None)
        try:
            for i, _ in enumerate(loader):
                if how == "left" and i == 2:
                    break
        except chute.ChuteError:
            pass
        assert len(loader_threads()) == 2
        return weakref.ref(loader)

    gone_without_a_collection(use, loader_threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_threads_of_its_own_for_its_passes(ds):
    """A fork copies none of the parent's threads: the child's next pass starts its own (it would wait for
    ever on threads that are not there)."""
    with chute.Loader(ds, BATCH, workers=2) as loader:
        assert len(batches(loader)) == N // BATCH
        pid = os.fork()
        if pid == 0:  # the child: one whole pass, then out without running the parent's cleanup
            ok = False
            signal.alarm(60)  # a child that hangs is killed (and the test fails) instead of hanging the run
            try:
                ok = batches(loader) == [list(range(i, i + BATCH)) for i in range(0, N, BATCH)]
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert len(batches(loader)) == N // BATCH  # the parent's threads go on
