"""The fused task: every stage of a pass that runs on the workers, for one step, run and measured by one worker.

    order (a row of a precomputed table) ─► stage 1 ─► stage 2 ─► ...    e.g. [read wait] ─► read ─► [transform] ─► user stages

This is the unit of work the executors hand out: a batch, never a sample.
Consecutive worker stages are fused into it (one hand-off between threads per
batch), each called as ``stage.map(batch, ctx)`` with the worker's
:class:`~chute.pipeline.transform.BatchContext`. The task measures, not the
stages: the clock is read between stages into a list of marks, and each
stage's span is added to its counter cell (a ``read wait`` stage's as its
``wait_in``) with attribute updates, plus one record per batch in the trace
ring: no Python call per stage beyond the stage itself and one clock read.
The root's (``order``) work per batch is a row of a precomputed table; the
chunks of rows it computes ahead are timed when they are.
It publishes what it is doing in plain lists indexed by worker number
(``building``, ``since``, ``at``, ``progress``), which the hang watchdog reads
to say which worker builds which batch, since when, in which stage and on
which sample.

The same task runs in the worker processes (``chute.pipeline.worker``, without
counters: the marks go back with the batch and the main process adds them) and
in a torch DataLoader's workers (``chute.TorchIterable``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.observe.counters import nbytes_of
from chute.pipeline.indices import BatchIndices
from chute.pipeline.stage import BatchStage
from chute.pipeline.transform import BatchContext, StageError, describe_row


class Task:
    """Builds step ``s`` of one pass: ``task(s, start_ns, w)`` -> ``((batch, rows, skipped), end_ns)``.

    ``stages`` run in order on the rows of the step; ``pool`` is the arena
    output blocks come from; ``counters`` (None: not measured here) get a cell
    per stage per worker.
    """

    def __init__(
        self, indices: BatchIndices, stages: Sequence[BatchStage], epoch: int, seed: int, pool: Any, *,
        dataset: Any = None, on_error: str = "raise", counters: Any = None,
    ) -> None:
        self.indices, self.epoch, self.seed, self.pool = indices, epoch, seed, pool
        self.stages = tuple(stages)
        self.names = tuple(s.name for s in self.stages)  # the trace's span names
        self.dataset, self.on_error = dataset, on_error
        self.counters = counters
        self._maps = tuple(s.map for s in self.stages)
        self._waits = tuple(bool(getattr(s, "waits", False)) for s in self.stages)
        self._user = tuple(not getattr(s, "_builtin", False) for s in self.stages)
        # bytes: the gather's rows, and the finished batch when a stage after the gather changed it
        self._gather = next(i for i, s in enumerate(self.stages) if getattr(s, "gathers", False))
        self._row_bytes = getattr(self.stages[self._gather], "row_bytes", 0)
        self._finish = len(self.stages) - 1 if len(self.stages) - 1 > self._gather else -1
        self._parted = next((i for i, s in enumerate(self.stages) if s.name == "transform"), 0)  # the stage with parts
        self._size = len(self.stages) + 1
        self._first = self._gather + 1  # stages up to the gather run on None (the batch is made there)
        self.building: list[int] = []  # per worker: the step it builds (-1: none)
        self.progress: list[int] = []  # per worker: position in the batch of the sample being transformed (-1: none)
        self.threads: list[int] = []  # per worker: its thread id (0 for a worker process's proxy)
        self.marks: list[list[int]] = []  # per worker: the clock before, between and after its stages in its last batch
        # (the row lookup is a list index: no span of its own; the root's work, a chunk of rows computed ahead, is timed)
        self._contexts: list[BatchContext] = []
        self._cells: list[Any] = []  # per worker: a counter cell per stage, and the trace's append
        self._lock = threading.Lock()
        chunks = indices.chunks
        self._chunks, self._per_chunk = chunks, indices.per_chunk
        self._second = min(1, indices.per_chunk - 1)  # where in a chunk the next one is computed
        if counters is not None:  # the root's counter (the row lookup is its work), and each stage's
            counters.stage("order", where="workers", gil=False)
            for stage in self.stages:
                counters.stage(stage.name, where="workers", gil=stage.gil)

    def register(self, ident: int) -> int:
        """A new worker (call from its own thread): its number ``w``."""
        counters = self.counters
        cells = None
        if counters is not None:
            stage = counters.stage
            cells = (stage("order").cell(), tuple(stage(s.name).cell() for s in self.stages), counters.trace.append)
        ctx = BatchContext(None, self.epoch, self.seed, self.pool, self.on_error, self._describe)
        with self._lock:
            w = len(self.building)
            self.building.append(-1)
            self.progress.append(-1)
            self.threads.append(ident)
            self.marks.append([0])
            ctx.worker, ctx.progress = w, self.progress
            self._contexts.append(ctx)
            self._cells.append(cells)
        return w

    def __call__(self, step: int, start: int, w: int) -> tuple[tuple[Any, int, list[int]], int]:
        self.building[w] = step
        k = 0
        try:
            chunk = self._chunks[step // self._per_chunk] if step < self.indices.full else None
            rows = self.indices.rows(step) if chunk is None else chunk[step % self._per_chunk]
            n = rows.size
            ctx = self._contexts[w]
            ctx.indices, ctx.step = rows, step
            clock = time.perf_counter_ns
            marks = self.marks[w] = [start] * self._size  # a new list per batch: the trace keeps it (and see :meth:`doing`)
            batch: Any = None
            first = self._first
            skipped = _NONE
            for apply in self._maps:
                k += 1
                if batch is not None or k <= first:  # (None before the gather; after it: every sample skipped)
                    batch = apply(batch, ctx)
                    if ctx.skipped:  # samples the stage gave up on: the later stages see the rows kept
                        skipped, rows = self._skip(skipped, rows, ctx)
                marks[k] = clock()
            end = marks[k]
            kept = n - len(skipped) if skipped else n
            cells = self._cells[w]
            if cells is not None:  # the spans of the batch into the worker's cells: attribute updates, no call
                order, stage_cells, trace = cells
                order.items += n
                waits = self._waits
                i = 0
                for cell in stage_cells:
                    if waits[i]:
                        cell.wait_in_ns += marks[i + 1] - marks[i]
                    else:
                        cell.busy_ns += marks[i + 1] - marks[i]
                        cell.items += n
                    i += 1
                stage_cells[self._gather].nbytes += self._row_bytes * n
                if self._finish >= 0 and batch is not None:
                    stage_cells[self._finish].nbytes += nbytes_of(batch)  # the finished batch (the autotuner's memory budget)
                if ctx.parts:
                    parts = stage_cells[self._parted].parts
                    for part, ns in zip(_PARTS, ctx.parts):
                        parts[part] = parts.get(part, 0) + ns
                    ctx.parts = _NO_PARTS
                trace(("task", self.threads[w], step, kept, self.names, marks))
            if step % self._per_chunk == self._second:
                end = self._ahead(step, end, w)
            return (batch, kept, skipped), end
        except BaseException as exc:
            if k and self._user[k - 1] and isinstance(exc, Exception):
                raise self._failed(k - 1, rows, exc) from exc
            raise
        finally:
            self.building[w] = -1

    def doing(self, w: int) -> tuple[int, str]:
        """For the hang watchdog: since when worker ``w`` builds its batch (perf_counter_ns), and the stage it is in.

        Read from the batch's marks: the clock is written after each stage, so
        the first mark still at the start is the stage running now.
        """
        marks = self.marks[w]
        start = marks[0]
        for i in range(1, len(marks)):
            if marks[i] == start:
                return start, self.names[i - 1]
        return start, ""

    def _ahead(self, step: int, began: int, w: int) -> int:
        """A chunk's second step: the root computes the next chunk of rows now, long before it is needed
        (not at a chunk's first step: a pass's first batch would wait for it). Its time is the root's work."""
        self.indices.ahead(step)
        end = time.perf_counter_ns()
        cells = self._cells[w]
        if cells is not None:
            order, _, trace = cells
            order.busy_ns += end - began
            trace(("task", self.threads[w], step, 0, ("order",), [began, end]))
        return end

    def _skip(self, skipped: list[int], rows: np.ndarray, ctx: BatchContext) -> tuple[list[int], np.ndarray]:
        gone = ctx.skipped
        skipped = skipped + [int(rows[j]) for j in gone]
        rows = np.delete(rows, gone)
        ctx.indices, ctx.skipped = rows, []
        return skipped, rows

    def _failed(self, i: int, rows: np.ndarray, exc: Exception) -> ChuteError:
        stage = self.stages[i]
        first = f" of {len(rows)} samples starting with {self._describe(int(rows[0]))}" if len(rows) else ""
        what = f"batch_transform {_fn_name(stage)}" if stage.name == "batch_transform" else f"stage {stage.name!r}"
        return StageError(f"{what} failed on a batch{first}: {type(exc).__name__}: {exc}")

    def _describe(self, index: int) -> str:
        return describe_row(self.dataset, index) if self.dataset is not None else f"sample {index}"


def _fn_name(stage: BatchStage) -> str:
    fn = stage.fn if stage.fn is not None else stage
    return getattr(fn, "__qualname__", None) or repr(fn)


_NONE: list[int] = []  # no sample skipped (shared, never mutated)
_NO_PARTS: tuple[int, ...] = ()
_PARTS = ("per_sample", "collate")  # the transform stage's breakdown (ctx.parts)
