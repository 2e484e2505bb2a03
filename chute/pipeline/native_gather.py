"""Gather-only passes on native threads: no Python, and no GIL, on the workers.

A pass whose only worker stage is the gather of fixed-size columns from a
local dataset (no transform, no variable-size column, no download, worker
threads, not ``columnar``) spends most of a worker thread's time with the GIL
around the copy, not in it: the batch task, the hand-over, the counters. On a
2-core machine the worker threads and the training loop then take turns on
the GIL for every batch (docs/benchmarks.md, "What bounds W2"). For such a
pass the Loader builds the batches with ``chute._native.GatherRing``
(chute/_csrc/ring.c) instead: native threads, kept by the Loader across its
passes, copy the rows; the loop's thread, in :meth:`NativePass.submit`, looks
up the step's rows (the order's precomputed table, as the batch task does),
takes the batch's blocks from the Loader's arena and hands both to the ring;
in :meth:`NativePass.take` it waits for the step (the GIL released) and wraps
the blocks. The batches, their order and their memory are those of the worker
threads' pass: the same rows into the same arena blocks.

A :class:`NativePass` is the pass's executor and its channel at once
(``chute.pipeline.run.Feed`` uses both). The counters get what the batch task
and the worker threads record (``order``, ``read`` and ``workers``: the
copy's span as busy time, a worker's wait for a job as idle time), added by
the loop when it takes the batch, and one trace span per batch on the track
"native gather threads". ``CHUTE_NATIVE_GATHER=0`` in the environment keeps
such passes on the worker threads (to compare).

The loop pays for it: it looks up and queues every step itself, more of its
own time per step than the worker threads' hand-over takes (docs/benchmarks.md,
"Training step", has what an emulated training step measured), which only pays
off while it waits for data. So the Loader runs such a pass natively
once the autotuner's last reading says the loop waited for data (or when no
autotuner runs: settings fixed by hand), and on the worker threads before
that and while the loop computes (``Loader._native``, ``Policy.data_bound``);
the choice is made pass by pass.
"""

from __future__ import annotations

import os
import time
from typing import Any

from chute._channel import Closed

#: The trace's pseudo thread id of the native threads' spans (``chute.observe.trace``'s worker processes use 1).
NATIVE_TID = 2
#: The trace's name of that track.
NATIVE_TRACK = "native gather threads"

_ENABLED = os.environ.get("CHUTE_NATIVE_GATHER", "1") != "0"


def eligible(run: Any, stages: list[Any]) -> bool:
    """Whether the pass ``run`` with worker ``stages`` can run on a GatherRing (see the module docstring)."""
    if not _ENABLED or run.fetcher is not None or len(stages) != 1:
        return False
    from chute.format.reader import Dataset
    from chute.pipeline.gather import Gather

    gather = stages[0]
    dataset = run.dataset
    return (
        type(gather) is Gather and not gather.columnar and not gather.variable_names and gather.reorder is None
        and gather.count > 0 and type(dataset) is Dataset and dataset.cache is None and _ring_type() is not None
    )


def _ring_type() -> Any:
    try:
        from chute._native import GatherRing
    except ImportError:  # a build without the extension, or one older than the ring
        return None
    return GatherRing


def make_ring(dataset: Any, threads: int, slots: int) -> Any:
    """A GatherRing over ``dataset``'s fixed-size columns with ``threads`` threads and ``slots`` places."""
    from chute import _sched

    reader = dataset._batches
    policy = _sched._BATCH if _sched._ENABLED and _sched._BATCH is not None else -1
    return _ring_type()(dataset.offsets, reader._fixed_sources, reader._row_bytes, slots, threads,
                        policy, _sched.SLICE_NS if policy >= 0 else 0)


class NativePass:
    """One pass on a GatherRing: its executor (``submit``, ``depth``, ``threads``, ``resize``, ``set_depth``,
    ``inline``, ``close``) and its channel (``take``, ``count_ready``, ``let_go``, ``slots``, ``close``)."""

    can_inline = False  # the loop building its batches itself would run the Python batch task: not worth it here

    def __init__(self, ring: Any, task: Any, dataset: Any, gather: Any, pool: Any, depth: int, counters: Any) -> None:
        self.ring, self.task, self.pool = ring, task, pool
        self.slots = ring.slots
        self.depth = max(1, min(depth, self.slots))
        self.inline = False
        self.closed = False
        self._placed: list[Any] = [None] * self.slots  # per place: (step, batch, rows), or (step, exception)
        indices = task.indices
        self._rows, self._ahead = indices.rows, indices.ahead
        self._per_chunk, self._second = indices.per_chunk, min(1, indices.per_chunk - 1)
        self._map = dataset._batches._map_shard
        self._corrupt = dataset._batches._corrupt
        self._names, self._views, self._count = gather.fixed_names, gather.views, gather.count
        self._shapes = tuple(zip(gather.shapes, gather.dtypes))
        self._row_bytes = gather.row_bytes
        self._keys: tuple[int, tuple] = (-1, ())
        self._cells: Any = None
        if counters is not None:
            counters.thread_names.setdefault(NATIVE_TID, NATIVE_TRACK)
            order = counters.stage("order", where="workers", gil=False)
            read = counters.stage(gather.name, where="workers", gil=False)
            workers = counters.stage("workers")
            self._stages = (order, read, workers)
            self._cells = (order.cell(), read.cell(), workers.cell(), counters.trace.append, (gather.name,))
            for s in self._stages:
                s.workers = ring.threads

    # ------------------------------------------------------------------ the executor's side

    @property
    def threads(self) -> int:
        return self.ring.threads

    def resize(self, threads: int) -> None:
        if not self.closed:
            self.ring.resize(threads)
            if self._cells is not None:
                for s in self._stages:
                    s.workers = threads

    def set_depth(self, depth: int) -> None:
        self.depth = max(1, min(depth, self.slots))

    def submit(self, step: int) -> None:
        """Queue ``step`` (the loop's thread): its rows and its blocks to the ring; an error is raised by its take."""
        if self.closed:  # ended meanwhile (Loader.close() from another thread): nothing more goes to the ring
            return
        i = step % self.slots
        try:
            rows = self._rows(step)
            if step % self._per_chunk == self._second:
                self._next_chunk(step)
            n = rows.size
            count, keys = self._keys
            if n != count:  # a new batch size (the first batch, the last one of an epoch)
                keys = tuple(((n, *shape), dtype) for shape, dtype in self._shapes)
                self._keys = (n, keys)
            arrays, tensors = self.pool.take_all(keys, self._count)
            while True:
                try:
                    self.ring.submit(step, rows, arrays)
                    break
                except _Unmapped as missing:
                    self._map(missing.shard)
                except _CorruptShard as exc:
                    raise self._corrupt(exc) from None
        except Exception as exc:  # delivered at its step, as a worker's failure is
            self._placed[i] = (step, exc)
            return
        for j, dtype in self._views:
            tensors[j] = tensors[j].view(dtype)
        self._placed[i] = (step, dict(zip(self._names, tensors)), n)

    def _next_chunk(self, step: int) -> None:
        began = time.perf_counter_ns()
        self._ahead(step)
        if self._cells is not None:
            end = time.perf_counter_ns()
            self._cells[0].busy_ns += end - began
            self._cells[3](("task", NATIVE_TID, step, 0, ("order",), [began, end]))

    # ------------------------------------------------------------------ the channel's side

    def take(self, step: int, timeout: float = -1) -> tuple[Any, int, Any]:
        """The batch of ``step``, waiting up to ``timeout`` seconds (-1: for ever): ``(batch, rows, skipped)``."""
        i = step % self.slots
        placed = self._placed[i]
        if self.closed or placed is None or placed[0] != step:
            raise Closed(step)
        if len(placed) == 2:  # submit failed
            self._placed[i] = None
            raise placed[1]
        got = self.ring.wait(step, float(timeout))  # (TimeoutError: still pending)
        if got is None or self.closed:
            raise Closed(step)
        self._placed[i] = None
        n = placed[2]
        cells = self._cells
        if cells is not None:
            start, end, idle = got
            order, read, workers, trace, names = cells
            order.items += n
            read.busy_ns += end - start
            read.items += n
            read.nbytes += self._row_bytes * n
            workers.busy_ns += end - start
            workers.wait_out_ns += idle
            workers.items += 1
            trace(("task", NATIVE_TID, step, n, names, [start, end]))
        return placed[1], n, ()

    def count_ready(self, first: int, limit: int) -> int:
        return self.ring.count_done(first, limit)  # type: ignore[no-any-return]

    def let_go(self) -> None:
        """(The Channel's: nothing taken is kept here.)"""

    def close(self, timeout: float = 5.0, broken: bool = False) -> list[Any]:
        """End the pass: steps not started are dropped, those being copied finish; the blocks go back to the
        arena with the batches nobody holds. Closing again does nothing. No thread can be stuck in a copy."""
        if not self.closed:
            self.closed = True
            self.ring.drop()
            self._placed = [None] * self.slots
        return []


try:
    from chute._native import CorruptShard as _CorruptShard, Unmapped as _Unmapped
except ImportError:  # a build without the extension: eligible() says no
    _CorruptShard = _Unmapped = type("_Never", (Exception,), {})  # type: ignore[assignment,misc]
