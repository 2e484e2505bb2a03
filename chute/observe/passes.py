"""A Loader's measurement glue: its counters per pass, the device stage's timing, its report.

The Loader calls a :class:`LoaderMeter` at a few points: when a pass starts
(``start_pass``), when its worker pool exists (``attach``), for every batch a
worker finished (``produced``), and around what the training loop receives
(``timed``). The device stage is timed from the outside of
``DevicePrefetcher`` (``DeviceTiming``): the copying thread's wait for the
next host batch (``wait_in``), the copy itself (busy, until ``on_copied``), and
the time from there to asking for the next batch (``wait_out``: handing the
batch over and waiting for room in the queue to the loop).

The report covers the last pass: from ``iter()`` to its end (or to now while
it runs); ``report(since="start")`` covers the loader's whole life.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from chute.observe.autotune import Autotuner
from chute.observe.counters import Counters, Snapshot
from chute.observe.report import Context, Report, build, cache_window
from chute.observe.trace import WORKER_PROCESSES_TID


def record_batch(
    counters: Counters, step: int, indices: int, loaded: Any, order_span: tuple[int, int] | None = None,
    fetch_wait_ns: int = 0, waited_in_read_ns: int = 0, thread: int | None = None,
) -> None:
    """Count one finished batch task (``loaded.times``, from ``load_batch``) into the stages.

    ``order_span`` is when its indices were computed; ``fetch_wait_ns`` the time
    it waited for downloads before the gather (counted as the read stage's
    ``wait_in``); ``waited_in_read_ns`` the part of the gather already counted as
    ``read.wait_in`` by the storage layer (not busy time). ``thread`` names the
    trace track for spans measured in another process. Runs once per batch in
    the worker: the cell updates are written out rather than calling
    ``Stage.record`` three times.
    """
    trace = counters.trace.append
    cell = counters.order.cell()
    tid = cell.tid if thread is None else thread
    if order_span is not None:
        start, end = order_span
        cell.busy_ns += end - start
        cell.items += indices
        trace(("order", tid, start, end - start, step, indices))
    times = loaded.times
    if times is None:
        return
    cell = counters.read.cell()
    cell.wait_in_ns += fetch_wait_ns
    cell.busy_ns += times.read_ns - waited_in_read_ns
    cell.items += indices
    cell.nbytes += times.nbytes
    start = times.start_ns
    trace(("read", tid, start, times.read_ns, step, indices))
    cell = counters.transform.cell()
    cell.items += loaded.rows
    cell.nbytes += times.out_nbytes  # the finished batch's size
    spent = times.per_sample_ns + times.collate_ns + times.batch_transform_ns
    if spent:
        cell.busy_ns += spent
        parts = cell.parts
        for part, ns in (("per_sample", times.per_sample_ns), ("collate", times.collate_ns), ("batch_transform", times.batch_transform_ns)):
            if ns:
                parts[part] = parts.get(part, 0) + ns
        trace(("transform", tid, start + times.read_ns, spent, step, loaded.rows))


class DeviceTiming:
    """Times the device stage of one pass from outside ``DevicePrefetcher``.

    ``source(host)`` wraps the host batches (it runs in the copying thread);
    ``copied`` is the prefetcher's ``on_copied`` callback.
    """

    def __init__(self, counters: Counters, rows: dict[int, int]) -> None:
        self.stage = counters.stage("device")
        self.stage.workers = 1
        self.rows = rows
        self._got_ns = 0
        self._copied_ns = 0

    def source(self, host: Iterator[Any]) -> Iterator[Any]:
        clock = time.perf_counter_ns
        try:
            cell = self.stage.cell()
            while True:
                asked = clock()
                if self._copied_ns:
                    cell.wait_out_ns += asked - self._copied_ns
                try:
                    item = next(host)
                except StopIteration:
                    return
                self._got_ns = clock()
                cell.wait_in_ns += self._got_ns - asked
                yield item
                del item
        finally:
            close = getattr(host, "close", None)
            if close is not None:
                close()

    def copied(self, host_item: Any, event: Any) -> None:
        from chute.pipeline.batch import nbytes_of

        now = time.perf_counter_ns()
        step, batch = host_item[0], host_item[1]
        self.stage.record(self._got_ns, now, self.rows.get(step, 0), nbytes_of(batch) if batch is not None else 0, step)
        self._copied_ns = now


class LoaderMeter:
    """Counters, report windows and the autotuner of one Loader."""

    def __init__(self, counters: Counters, tuner: Autotuner | None = None, cache: Any = None) -> None:
        self.counters = counters
        self.tuner = tuner
        self.cache = cache  # the dataset's node cache (stats()), or None
        self.rows: dict[int, int] = {}  # step -> samples, from the workers to the loop
        self.skipped = 0  # samples skipped by on_error="skip", as the workers reported them
        self._zero = counters.snapshot()
        self._start: Snapshot | None = None
        self._end: Snapshot | None = None
        self._cpu = (0.0, None)
        self._skipped_mark = 0
        self._cache_start: dict[str, Any] | None = None
        self._pass_began = 0
        self._first_batch_ns: int | None = None

    # ------------------------------------------------------------------ the Loader's calls

    def start_pass(self) -> None:
        """A pass begins (``iter()``): its report window starts now."""
        self.rows = {}
        self._start, self._end = self.counters.snapshot(), None
        self._cpu = (time.process_time(), None)
        self._skipped_mark = self.skipped
        self._cache_start = self._cache_stats()
        self._pass_began = time.perf_counter_ns()
        self._first_batch_ns = None

    def attach(self, pool: Any) -> None:
        """The pass's worker pool (threads mode), for the autotuner."""
        if self.tuner is not None:
            self.tuner.start_pass(pool)

    def produced(self, step: int, loaded: Any, processes: bool = False, workers: int = 1) -> None:
        """A worker finished batch ``step``; from worker processes, count their timings here."""
        self.rows[step] = loaded.rows
        if loaded.skipped:
            self.skipped += len(loaded.skipped)
        if processes:
            for name in ("read", "transform"):
                self.counters.stage(name).workers = workers
            record_batch(self.counters, step, loaded.rows + len(loaded.skipped), loaded, thread=WORKER_PROCESSES_TID)

    def device(self) -> DeviceTiming:
        return DeviceTiming(self.counters, self.rows)

    def timed(self, batches: Iterator[tuple[int, Any]], total: int) -> Iterator[tuple[int, Any]]:
        """``batches`` as they are, timing the loop around them (and ticking the autotuner)."""
        counters = self.counters
        consumer = counters.consumer
        tuner = self.tuner
        rows = self.rows
        clock = time.perf_counter_ns
        counters.name_thread()
        trace = counters.trace.append
        tid = threading.get_ident()
        called = clock()
        try:
            while True:
                try:
                    item = next(batches)
                except StopIteration:
                    consumer.wait_ns += clock() - called
                    return
                got = clock()
                consumer.wait_ns += got - called
                step = item[0]
                if item[1] is not None:
                    consumer.batches += 1
                    consumer.samples += rows.pop(step, 0)
                    if self._first_batch_ns is None:
                        self._first_batch_ns = got - self._pass_began
                        if consumer.first_wait_ns is None:
                            consumer.first_wait_ns = self._first_batch_ns
                trace(("wait", tid, called, got - called, step, 0))
                yield item
                del item
                called = clock()
                consumer.compute_ns += called - got
                trace(("compute", tid, got, called - got, step, 0))
                if tuner is not None and called >= tuner.next_ns:
                    tuner.tick(called, total - step - 1)
        finally:
            self._end = counters.snapshot()
            self._cpu = (self._cpu[0], time.process_time())
            if tuner is not None:
                tuner.end_pass()
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    # ------------------------------------------------------------------ the report

    def report(self, settings: dict[str, Any], cpu_budget: int, workers_kind: str, since: str = "pass") -> Report:
        """The report of the last pass (``since="pass"``) or of the loader's life (``"start"``)."""
        if since not in ("pass", "start"):
            raise ValueError(f"since must be 'pass' or 'start', got {since!r}")
        now = self.counters.snapshot()
        cache = self._cache_stats()
        if since == "start" or self._start is None:
            window = now - self._zero
            window_start = self._zero.time_ns
            label = "loader life"
            cpu_s = None
            first = self.counters.consumer.first_wait_ns
            skipped = self.skipped
            cache_start = None
        else:
            end = self._end if self._end is not None else now
            window = end - self._start
            window_start = self._start.time_ns
            label = "last pass" if self._end is not None else "this pass so far"
            cpu_end = self._cpu[1] if self._cpu[1] is not None else time.process_time()
            cpu_s = cpu_end - self._cpu[0]
            first = self._first_batch_ns
            skipped = self.skipped - self._skipped_mark
            cache_start = self._cache_start
        decisions = tuple(self.tuner.decisions) if self.tuner is not None else ()
        begin_s = (window_start - self.counters.created_ns) / 1e9
        moves = [d.change.split() for d in decisions if d.time_s >= begin_s and d.change.startswith("threads ") and "->" in d.change]
        context = Context(
            source="chute.Loader", window=label, settings=settings, decisions=decisions,
            cache=cache_window(cache, cache_start), skipped=skipped, cpu_s=cpu_s, cpu_budget=cpu_budget,
            first_batch_s=None if first is None else first / 1e9, workers_kind=workers_kind,
            threads_changed=(int(moves[0][1]), int(moves[-1][-1])) if moves else None,
        )
        return build(window, context)

    def _cache_stats(self) -> dict[str, Any] | None:
        if self.cache is None:
            return None
        try:
            return dict(self.cache.stats())
        except Exception as exc:  # the report must not fail because the cache's stats did
            return {"error": f"{type(exc).__name__}: {exc}"}


def cpu_budget() -> int:
    """CPUs this process may run on (its affinity mask), else the CPU count."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

