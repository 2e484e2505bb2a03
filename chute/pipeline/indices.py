"""The indices stage: which rows each batch of a pass holds.

A thin layer over ``chute.order.Order``: the rows of a *chunk* of steps (about
one shuffle window of rows) are computed at once with :meth:`Order.steps`
(one slice of the global order, one vectorised sort by shard), the next chunk
is computed when the second step of the current one starts being read, and a
batch's indices are then a row of the chunk: a list lookup, no Python call.
The first step of a pass is computed alone (its chunk comes with the step
after it): the first batch waits only for its own rows. The values are
exactly ``order.batch(epoch, step, rank, world_size, start)``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from chute.order import Order

#: Rows per chunk of steps (the chunk is rounded to whole steps, at least one).
CHUNK_ROWS = 1 << 17


class BatchIndices:
    """The rows of every step of one pass (``order``, ``epoch``, this rank, from position ``start``).

    ``chunks[step // per_chunk][step % per_chunk]`` holds the rows of a full
    step once its chunk is computed (``None`` before: call :meth:`rows`). Any
    thread may call :meth:`rows` and :meth:`ahead`; a chunk is computed once.
    """

    def __init__(self, order: Order, epoch: int, rank: int, world_size: int, start: int, stage: Any = None) -> None:
        self.order, self.epoch, self.rank, self.world_size, self.start = order, epoch, rank, world_size, start
        self.stage = stage  # the counters' "order" stage: the time spent computing chunks
        self.steps = order.num_batches(world_size, start)
        self.full = order.full_steps(world_size, start)
        self.per_chunk = max(1, CHUNK_ROWS // (order.batch_size * world_size))
        self.chunks: list[np.ndarray | None] = [None] * (-(-self.full // self.per_chunk) + 1)  # + the last, partial step
        self._lock = threading.Lock()

    def rows(self, step: int) -> np.ndarray:
        """The rows of ``step`` (computing its chunk if needed)."""
        if step >= self.full:
            if not 0 <= step < self.steps:
                raise IndexError(f"step {step} is outside the {self.steps} batches of this pass")
            return self.order.batch(self.epoch, step, self.rank, self.world_size, self.start)
        k = step // self.per_chunk
        chunk = self.chunks[k]
        if chunk is None:
            if step == 0 and self.per_chunk > 1:  # the first batch: its rows alone, the chunk comes later
                return self.order.steps(self.epoch, 0, 1, self.rank, self.world_size, self.start)[0]
            chunk = self._compute(k)
        return chunk[step - k * self.per_chunk]

    def ahead(self, step: int) -> None:
        """``step`` starts being read: compute the next chunk if ``step`` is the second of one, and drop one long done.

        (Not at a chunk's first step: a pass's first batch would wait for the next chunk.)
        """
        k, at = divmod(step, self.per_chunk)
        if at != min(1, self.per_chunk - 1) or step >= self.full:
            return
        if k + 1 < len(self.chunks) - 1 and self.chunks[k + 1] is None:
            self._compute(k + 1)
        if k >= 2:
            self.chunks[k - 2] = None  # every step of it was submitted long ago; rows() recomputes if ever needed

    def _compute(self, k: int) -> np.ndarray:
        with self._lock:
            chunk = self.chunks[k]
            if chunk is None:
                began = time.perf_counter_ns()
                first = k * self.per_chunk
                count = min(self.per_chunk, self.full - first)
                chunk = self.chunks[k] = self.order.steps(self.epoch, first, count, self.rank, self.world_size, self.start)
                if self.stage is not None:  # a span in the trace, at the chunk's first step
                    self.stage.record(began, time.perf_counter_ns(), 0, 0, first)
            return chunk
