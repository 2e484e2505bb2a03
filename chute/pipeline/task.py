"""The batch task: everything one step of a pass needs, run by one worker.

    indices (a row of a precomputed chunk) -> [wait for downloads] -> gather -> transform + collate

This is the unit of work the executors hand out: a batch, never a sample.
It counts its own time into the stages' counters and leaves one record per
batch in the trace ring, without a Python call per stage. It publishes what it is doing in plain lists indexed by worker number
(``building``, ``since``, ``progress``), which the hang watchdog reads to say
which worker builds which batch, since when, and on which sample.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from chute.observe.counters import nbytes_of
from chute.pipeline.gather import Gather
from chute.pipeline.indices import BatchIndices
from chute.pipeline.transform import Transform


class BatchTask:
    """Builds step ``s`` of one pass: ``task(s, start_ns, w)`` -> ``((batch, rows, skipped), end_ns)``."""

    def __init__(
        self, indices: BatchIndices, gather: Gather, transform: Transform | None, epoch: int,
        fetcher: Any = None, counters: Any = None,
    ) -> None:
        self.indices, self.gather, self.transform, self.epoch = indices, gather, transform, epoch
        self.fetcher = fetcher  # a remote dataset's downloader: the batch waits for its shards
        self.counters = counters
        self.building: list[int] = []  # per worker: the step it builds (-1: none)
        self.since: list[int] = []  # per worker: perf_counter_ns when it started that step
        self.progress: list[int] = []  # per worker: position in the batch of the sample being transformed (-1: none)
        self.threads: list[int] = []  # per worker: its thread id (0 for a worker process's proxy)
        self._cells: list[Any] = []  # per worker: its (read, transform) counter cells
        self._lock = threading.Lock()
        chunks = indices.chunks
        self._chunks, self._per_chunk = chunks, indices.per_chunk
        self._second = min(1, indices.per_chunk - 1)  # where in a chunk the next one is computed
        self._row_bytes = sum(shape_bytes(shape, dtype) for shape, dtype in zip(gather.shapes, gather.dtypes))

    def register(self, ident: int) -> int:
        """A new worker (call from its own thread): its number ``w``."""
        counters = self.counters
        cells = None if counters is None else (
            counters.order.cell(), counters.read.cell(), counters.transform.cell(), counters.trace.append
        )
        with self._lock:
            w = len(self.building)
            self.building.append(-1)
            self.since.append(0)
            self.progress.append(-1)
            self.threads.append(ident)
            self._cells.append(cells)
        return w

    def __call__(self, step: int, start: int, w: int) -> tuple[tuple[Any, int, list[int]], int]:
        self.building[w] = step
        self.since[w] = start
        try:
            chunk = self._chunks[step // self._per_chunk] if step < self.indices.full else None
            if chunk is None:
                indices = self.indices.rows(step)
            else:
                indices = chunk[step % self._per_chunk]
            if step % self._per_chunk == self._second:
                self.indices.ahead(step)  # a chunk's second step: compute the next chunk now, off the critical path
            waited = 0
            if self.fetcher is not None:
                waited = self._fetch(step, indices)
            n = len(indices)
            batch = self.gather(indices, n)
            read = time.perf_counter_ns()
            rows = n
            skipped = _NONE
            transform = self.transform
            if transform is not None:
                batch, skipped = transform(batch, indices, self.epoch, self.progress, w)
                end = time.perf_counter_ns()
                rows -= len(skipped)
            else:
                end = read
            cells = self._cells[w]
            if cells is not None:
                order_cell, read_cell, transform_cell, trace = cells
                order_cell.items += n
                read_cell.busy_ns += read - start - waited
                read_cell.wait_in_ns += waited
                read_cell.items += n
                read_cell.nbytes += self._row_bytes * n
                if transform is not None:
                    transform_cell.busy_ns += end - read
                    transform_cell.items += rows
                    parts = transform_cell.parts
                    for part, ns in zip(_PARTS, transform.times):
                        if ns:
                            parts[part] = parts.get(part, 0) + ns
                    transform_cell.nbytes += nbytes_of(batch)  # the finished batch (the autotuner's memory budget)
                else:
                    transform_cell.nbytes += self._row_bytes * rows
                trace(("task", self.threads[w], start, read, end, step, rows, waited))
            return (batch, rows, skipped), end
        finally:
            self.building[w] = -1

    def _fetch(self, step: int, indices: Any) -> int:
        """Wait until the shards of the batch are in the node cache; the nanoseconds waited."""
        began = time.perf_counter_ns()
        self.fetcher.wait(step, self.gather.dataset.shards_of(indices))
        return time.perf_counter_ns() - began


_NONE: list[int] = []
_PARTS = ("per_sample", "collate", "batch_transform")  # no sample skipped (shared, never mutated)


def shape_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n
