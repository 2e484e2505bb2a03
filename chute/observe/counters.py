"""Always-on, cheap counters: where each stage of a loader spends its time.

Every stage of a pass has a :class:`StageCounter` (named as the stage: its row
in the report) that counts its busy time, the items and bytes it handled, and
the time it spent waiting on its input (nothing to do yet) and on its output
(no room downstream). The runtime that runs the stages writes them (a timing
record per stage per batch, ``chute.pipeline.task`` and ``chute.pipeline.run``):
a stage measures nothing itself. Each counter also says where its stage runs
(``where``: ``"workers"``, ``"thread"``, ``"loop"``; ``"storage"`` for
downloads), which is how the report and the autotuner read any stage, a
user's included. The training loop's side is a :class:`Consumer`: time
blocked in ``next()`` (waiting for data) versus time between ``next()`` calls
(its compute).

chute's own stages of a ``chute.Loader`` are ``order`` (the batch's rows,
the root), ``read`` (the gather from the shards, and its waits for
downloads as ``wait_in``), ``transform`` (a per-sample transform and the
collate, or a batch-level transform object), ``batch_transform`` and
``device`` (the copy, on a thread of its own), plus ``fetch`` (downloads into
the node cache, fed by the storage layer) and ``workers``, the worker pool
itself: busy = time in batch tasks, ``wait_out`` = idle time waiting for a
task (the consumer has not taken results yet, so no new task was submitted).
Its busy + idle is the pool's thread time, which the report uses to compute
the worker stages' utilisation.

Recording from other code (the storage layer)::

    stage = loader.counters.stage("fetch")
    stage.workers = 4                       # its concurrency, for utilisation
    stage.add(busy_s, items=1, nbytes=n)    # one download done
    stage.wait_out(seconds)                 # blocked: the cache had no room

``stage.record(start_ns, end_ns, items, nbytes, step)`` does what ``add`` does
and also puts the span into the trace ring (``loader.trace(path)``); times are
``time.perf_counter_ns()`` values. A ``read.wait_in`` recorded by the thread that
runs ``get_batch``, during that call, is taken out of the read's busy time, so
a cache miss shows up as waiting on ``fetch``, not as slow reading.

Cost: each thread writes its own cell (a ``threading.local``), so writers never
take a lock and never contend; a snapshot sums the cells under a lock that only
snapshots and first writes of a new thread take. Cells of threads that have
ended are folded into one, so their number stays bounded by the live threads.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

#: Pseudo-stage of the worker pool: busy = batch tasks, wait_out = idle.
WORKERS = "workers"
#: Where a stage runs (the runtime's places, and "storage" for downloads, "pool" for the pool itself).
WHERE = ("workers", "thread", "loop", "storage", "pool")
#: Where the counters of a name run when nobody said (chute's own names, and numbers fed by hand).
DEFAULT_WHERE = {"fetch": "storage", "device": "thread", WORKERS: "pool"}
#: Parts of the "transform" stage, kept apart so the report can name the slow one.
TRANSFORM_PARTS = ("per_sample", "collate")

_NS = 1_000_000_000


class _Cell:
    """One thread's counts for one stage; only that thread writes it."""

    __slots__ = ("busy_ns", "items", "nbytes", "wait_in_ns", "wait_out_ns", "parts", "thread", "tid")

    def __init__(self, thread: threading.Thread | None) -> None:
        self.busy_ns = 0
        self.items = 0
        self.nbytes = 0
        self.wait_in_ns = 0
        self.wait_out_ns = 0
        self.parts: dict[str, int] = {}
        self.thread = thread
        self.tid = thread.ident if thread is not None else 0  # the trace's thread id

    def merge(self, other: _Cell) -> None:
        self.busy_ns += other.busy_ns
        self.items += other.items
        self.nbytes += other.nbytes
        self.wait_in_ns += other.wait_in_ns
        self.wait_out_ns += other.wait_out_ns
        for key, value in other.parts.items():
            self.parts[key] = self.parts.get(key, 0) + value


@dataclasses.dataclass(frozen=True)
class StageTotals:
    """A stage's counts at one moment (or the difference of two moments).

    ``where`` is where the stage runs (:data:`WHERE`; empty: :data:`DEFAULT_WHERE`
    for the name, else the workers); ``gil`` whether its work holds the GIL.
    """

    name: str
    unit: str
    workers: int
    busy_ns: int = 0
    items: int = 0
    nbytes: int = 0
    wait_in_ns: int = 0
    wait_out_ns: int = 0
    parts: dict[str, int] = dataclasses.field(default_factory=dict)
    where: str = ""
    gil: bool = True

    def __post_init__(self) -> None:
        if not self.where:
            object.__setattr__(self, "where", DEFAULT_WHERE.get(self.name, "workers"))

    def __sub__(self, other: StageTotals) -> StageTotals:
        return StageTotals(
            self.name, self.unit, self.workers,
            self.busy_ns - other.busy_ns, self.items - other.items, self.nbytes - other.nbytes,
            self.wait_in_ns - other.wait_in_ns, self.wait_out_ns - other.wait_out_ns,
            {k: v - other.parts.get(k, 0) for k, v in self.parts.items()}, self.where, self.gil,
        )

    @property
    def busy_s(self) -> float:
        return self.busy_ns / _NS

    @property
    def wait_in_s(self) -> float:
        return self.wait_in_ns / _NS

    @property
    def wait_out_s(self) -> float:
        return self.wait_out_ns / _NS

    @property
    def active(self) -> bool:
        """Whether anything was recorded."""
        return bool(self.busy_ns or self.items or self.wait_in_ns or self.wait_out_ns)


class StageCounter:
    """Counters of one stage, written by any number of threads without locks.

    ``workers`` is the stage's current concurrency (threads, processes or
    downloads at once), ``where`` where it runs and ``gil`` whether its work
    holds the GIL; the runtime that runs the stage keeps them up to date.
    """

    def __init__(self, name: str, trace: collections.deque, thread_names: dict[int, str], unit: str = "samples") -> None:
        self.name = name
        self.unit = unit
        self.workers = 1
        self.where = DEFAULT_WHERE.get(name, "workers")
        self.gil = True
        self._trace = trace
        self._thread_names = thread_names
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cells: list[_Cell] = []
        self._ended = _Cell(None)  # folded cells of threads that have ended

    def cell(self) -> _Cell:
        """The calling thread's cell (created on its first use). Hot loops may keep it."""
        try:
            return self._local.cell
        except AttributeError:
            thread = threading.current_thread()
            cell = self._local.cell = _Cell(thread)
            with self._lock:
                self._cells.append(cell)
            self._thread_names[threading.get_ident()] = thread.name
            return cell

    def add(self, busy_s: float, items: int = 0, nbytes: int = 0) -> None:
        """Count ``busy_s`` seconds of work on ``items`` items of ``nbytes`` bytes."""
        cell = self.cell()
        cell.busy_ns += int(busy_s * _NS)
        cell.items += items
        cell.nbytes += nbytes

    def record(
        self, start_ns: int, end_ns: int, items: int = 0, nbytes: int = 0, step: int | None = None,
        *, waited_ns: int = 0, thread: int | None = None,
    ) -> None:
        """``add`` for the span ``[start_ns, end_ns)`` (perf_counter_ns values), also kept for the trace.

        ``waited_ns`` of the span were spent waiting (already counted as a
        wait) and are not busy time; ``thread`` is the trace's thread id for
        spans measured elsewhere (default: the calling thread).
        """
        cell = self.cell()
        cell.busy_ns += end_ns - start_ns - waited_ns
        cell.items += items
        cell.nbytes += nbytes
        self._trace.append((self.name, cell.tid if thread is None else thread, start_ns, end_ns - start_ns, step, items))

    def add_part(self, part: str, busy_ns: int) -> None:
        """Count ``busy_ns`` of this stage's busy time as spent in ``part`` (e.g. transform's "collate")."""
        parts = self.cell().parts
        parts[part] = parts.get(part, 0) + busy_ns

    def wait_in(self, seconds: float) -> None:
        """Count time this stage waited for its input (its upstream was late)."""
        self.cell().wait_in_ns += int(seconds * _NS)

    def wait_out(self, seconds: float) -> None:
        """Count time this stage waited for room downstream (its consumer was late)."""
        self.cell().wait_out_ns += int(seconds * _NS)

    def totals(self) -> StageTotals:
        """The sum over all threads, now; cells of ended threads are folded into one."""
        total = _Cell(None)
        with self._lock:
            live = []
            for cell in self._cells:
                if cell.thread is not None and not cell.thread.is_alive():
                    self._ended.merge(cell)  # it will never be written again
                else:
                    live.append(cell)
                    total.merge(cell)
            self._cells = live
            total.merge(self._ended)
        return StageTotals(
            self.name, self.unit, self.workers, total.busy_ns, total.items, total.nbytes,
            total.wait_in_ns, total.wait_out_ns, total.parts, self.where, self.gil,
        )


class Consumer:
    """The training loop's side: time blocked in ``next()`` vs time between calls.

    Written by the one thread that iterates (the loop); read by anyone.
    """

    __slots__ = ("wait_ns", "compute_ns", "batches", "samples", "first_wait_ns")

    def __init__(self) -> None:
        self.wait_ns = 0
        self.compute_ns = 0
        self.batches = 0
        self.samples = 0
        self.first_wait_ns: int | None = None  # time to the first batch of the loader's life

    def totals(self) -> ConsumerTotals:
        return ConsumerTotals(self.wait_ns, self.compute_ns, self.batches, self.samples)


@dataclasses.dataclass(frozen=True)
class ConsumerTotals:
    wait_ns: int = 0
    compute_ns: int = 0
    batches: int = 0
    samples: int = 0

    def __sub__(self, other: ConsumerTotals) -> ConsumerTotals:
        return ConsumerTotals(
            self.wait_ns - other.wait_ns, self.compute_ns - other.compute_ns,
            self.batches - other.batches, self.samples - other.samples,
        )


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Every counter of a :class:`Counters` at one moment; subtract two for a window."""

    time_ns: int
    stages: dict[str, StageTotals]
    consumer: ConsumerTotals

    def __sub__(self, other: Snapshot) -> Snapshot:
        stages = {
            name: totals - other.stages[name] if name in other.stages else totals
            for name, totals in self.stages.items()
        }
        return Snapshot(self.time_ns - other.time_ns, stages, self.consumer - other.consumer)


class Counters:
    """The counters of one loader: named stages, the consumer, and a trace ring.

    ``trace_events`` bounds the ring of records kept for ``loader.trace(path)``
    (the last few hundred batches: each batch leaves two records, more with a device or downloads).
    """

    def __init__(self, trace_events: int = 2048) -> None:
        self.trace: collections.deque = collections.deque(maxlen=trace_events)
        self.thread_names: dict[int, str] = {}
        self.consumer = Consumer()
        self.created_ns = time.perf_counter_ns()
        self._stages: dict[str, StageCounter] = {}
        self._lock = threading.Lock()
        self.stage("fetch", "shards")
        self.stage(WORKERS, "batches")

    def stage(self, name: str, unit: str | None = None, *, where: str | None = None, gil: bool | None = None) -> StageCounter:
        """The stage called ``name`` (created on first use); ``unit`` names what its items count, ``where``
        where it runs (:data:`WHERE`), ``gil`` whether its work holds the GIL."""
        stage = self._stages.get(name)
        if stage is None:
            with self._lock:
                stage = self._stages.get(name)
                if stage is None:
                    stage = self._stages[name] = StageCounter(name, self.trace, self.thread_names, unit or "samples")
        if unit is not None:
            stage.unit = unit
        if where is not None:
            if where not in WHERE:
                raise ValueError(f"where must be one of {WHERE}, got {where!r}")
            stage.where = where
        if gil is not None:
            stage.gil = gil
        return stage

    @property
    def stages(self) -> dict[str, StageCounter]:
        return dict(self._stages)

    def snapshot(self) -> Snapshot:
        """All counters now."""
        return Snapshot(
            time.perf_counter_ns(),
            {name: stage.totals() for name, stage in list(self._stages.items())},
            self.consumer.totals(),
        )

    def name_thread(self) -> None:
        """Remember the calling thread's name for the trace."""
        self.thread_names[threading.get_ident()] = threading.current_thread().name

    def trace_events(self) -> list[tuple[str, int, int, int, int | None, int]]:
        """The spans in the ring: ``(name, thread id, start_ns, duration_ns, step, items)``.

        The hot paths leave one compact record per batch, expanded here: a batch
        task's ``("task", tid, step, rows, names, marks)`` into a span per
        stage (stage ``names[i]`` ran from ``marks[i]`` to ``marks[i + 1]``), the
        loop's ``("loop", tid, called, got, done, step)`` into ``wait`` and
        ``compute``.
        """
        spans = []
        for record in list(self.trace):
            kind = record[0]
            if kind == "task":
                _, tid, step, rows, names, marks = record
                for i, name in enumerate(names):
                    spans.append((name, tid, marks[i], marks[i + 1] - marks[i], step, rows))
            elif kind == "loop":
                _, tid, called, got, done, step = record
                spans.append(("wait", tid, called, got - called, step, 0))
                spans.append(("compute", tid, got, done - got, step, 0))
            else:
                spans.append(record)
        return spans


def nbytes_of(batch: Any) -> int:
    """Bytes of the tensors and byte strings at the top level of a batch (dict, list or tensor)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.nbytes
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.nbytes
        elif isinstance(value, list) and value and isinstance(value[0], (bytes, bytearray)):
            total += sum(len(v) for v in value)
    return total
