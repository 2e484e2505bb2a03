"""The rows of a pass's chunks computed ahead, on the Loader's order thread (chute/pipeline/indices.py).

A chunk's rows are computed on that thread, not by whoever reads the chunk
before it, and the next epoch's first chunk once the last chunk of a pass
starts being read: the pass after it takes that instead of computing it at its
start. Counted, not timed: which jobs went to the thread, which chunks were
there before anyone asked, and that every step's rows are still
``order.batch(epoch, step, ...)``.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import chute
from chute.order import Order
from chute.pipeline import indices as indices_module
from chute.pipeline.indices import BatchIndices


class Later:
    """A stand-in for the order thread: keeps the jobs until the test runs them (False: a stopped thread)."""

    def __init__(self, accept: bool = True) -> None:
        self.jobs: list = []
        self.accept = accept

    def __call__(self, job) -> bool:
        if self.accept:
            self.jobs.append(job)
        return self.accept

    def run(self) -> int:
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()
        return len(jobs)


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(indices_module, "CHUNK_ROWS", 64)  # 8 steps of 8 rows a chunk


def _order(seed: int = 3) -> Order:
    return Order((300, 200, 250, 250), 8, shuffle=True, seed=seed, window=2)


def test_the_next_chunk_is_computed_on_the_order_thread(small_chunks) -> None:
    order, later = _order(), Later()
    indices = BatchIndices(order, 1, 0, 1, 0, later)
    for step in (0, 1):
        assert np.array_equal(indices.rows(step), order.batch(1, step))
        indices.ahead(step)
    assert indices.chunks[1] is None and len(later.jobs) == 1  # handed over, not computed by the reader
    assert later.run() == 1
    assert indices.chunks[1] is not None
    for step in range(8, 16):
        assert np.array_equal(indices.rows(step), order.batch(1, step))


def test_the_last_chunk_prepares_the_next_epochs_first_for_the_next_pass(small_chunks) -> None:
    order, later = _order(), Later()
    indices = BatchIndices(order, 4, 0, 1, 0, later)
    last = indices.full - 1
    for step in range(indices.steps):
        indices.ahead(step)
        later.run()
    assert last // indices.per_chunk == len(indices.chunks) - 2  # the steps above reached the last full chunk
    # the next epoch's first chunk is there before the pass after this one reads anything
    after = BatchIndices(order, 5, 0, 1, 0, later)
    assert after.chunks[0] is not None
    fresh = _order()  # nothing prepared in it
    assert np.array_equal(after.chunks[0], fresh.steps(5, 0, after.per_chunk))
    for step in range(after.steps):
        assert np.array_equal(after.rows(step), fresh.batch(5, step))
    # taken, not kept: a pass of the same epoch again (set_epoch back) computes it again, the same
    again = BatchIndices(order, 5, 0, 1, 0, later)
    assert again.chunks[0] is None
    # a pass that starts elsewhere in the epoch, or another epoch, is not given it
    order.prepare(6, 0, indices.per_chunk)
    assert BatchIndices(order, 6, 0, 1, 8, later).chunks[0] is None
    assert BatchIndices(order, 7, 0, 1, 0, later).chunks[0] is None


def test_without_the_order_thread_the_reader_computes_the_next_chunk(small_chunks) -> None:
    order, stopped = _order(), Later(accept=False)  # a Loader closed meanwhile
    indices = BatchIndices(order, 1, 0, 1, 0, stopped)
    indices.rows(0)
    indices.ahead(1)
    assert indices.chunks[1] is not None and not stopped.jobs


def test_a_ranks_prepared_chunk_is_its_own(small_chunks) -> None:
    order = _order()
    for rank in range(2):
        later = Later()
        indices = BatchIndices(order, 2, rank, 2, 0, later)
        for step in range(indices.steps):
            indices.ahead(step)
            later.run()
    fresh = _order()
    for rank in range(2):
        after = BatchIndices(order, 3, rank, 2, 0, None)
        assert np.array_equal(after.chunks[0], fresh.steps(3, 0, after.per_chunk, rank, 2))


def _ids(batch) -> np.ndarray:
    return batch["id"].numpy()


@pytest.mark.usefixtures("no_loader_threads_left")
def test_a_loaders_passes_deliver_the_order_with_the_order_thread(tmp_path, small_chunks, monkeypatch) -> None:
    chute.write(({"id": np.int64(i)} for i in range(1000)), str(tmp_path / "ds"), shard_size=2000)
    ds = chute.open(str(tmp_path / "ds"))
    prepared_on: list[str] = []
    prepare = Order.prepare

    def spy(self, *args, **kwargs):
        prepared_on.append(threading.current_thread().name)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(Order, "prepare", spy)
    with chute.Loader(ds, 8, shuffle=True, seed=5, workers=2) as loader:
        order = Order(tuple(s.rows for s in ds.shards), 8, shuffle=True, seed=5, window=loader.order.window)
        for epoch in range(3):
            got = [_ids(b) for b in loader]
            assert len(got) == order.num_batches()
            for step, ids in enumerate(got):
                assert np.array_equal(ids, order.batch(epoch, step)), (epoch, step)
        # Nobody waits for the thread's jobs: on a busy machine three short passes may end before it first
        # runs (their steps computed the chunks themselves). Wait for the jobs given to it so far.
        assert loader._kept_threads()._threads["order"].wait(60)
        assert prepared_on and set(prepared_on) == {"chute-order-r0"}
    assert not [t for t in threading.enumerate() if t.name.startswith("chute-order")]
