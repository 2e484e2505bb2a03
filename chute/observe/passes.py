"""A Loader's measurement glue: its counters per pass, its report.

The runtime of a pass writes every stage's time into the :class:`Counters`
(the fused task on the workers, the relays of the stages on threads of their
own, the loop's stages and the loop itself: ``chute.pipeline.task``,
``chute.pipeline.relay``, ``chute.pipeline.run``); a :class:`LoaderMeter`
keeps what outlives a pass: the report windows (``start_pass``, ``end_pass``),
the autotuner, and the node cache's statistics.

The report covers the last pass: from ``iter()`` to its end (or to now while
it runs); ``report(since="start")`` covers the loader's whole life.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from chute.observe.autotune import Autotuner
from chute.observe.counters import Counters, Snapshot
from chute.observe.hooks import Hook

if TYPE_CHECKING:
    from chute.observe.report import Report

#: A decision that moved the thread count (others: prefetch, or a note such as "threads stay at 2").
_MOVE = re.compile(r"threads (\d+) -> (\d+)")


class LoaderMeter(Hook):
    """Counters, report windows and the autotuner of one Loader.

    Subscribed to the Loader's hooks: a pass's ``start`` event opens its report
    window, its stream's ``end`` or ``fail`` closes it.
    """

    def __init__(self, counters: Counters, tuner: Autotuner | None = None, cache: Any = None) -> None:
        self.counters = counters
        self.tuner = tuner
        self.cache = cache  # the dataset's node cache (stats()), or None
        self.skipped = 0  # samples skipped by on_error="skip", as the workers reported them
        self._zero = counters.snapshot()
        self._start: Snapshot | None = None
        self._end: Snapshot | None = None
        self._window_pass: Any = None  # the pass whose events end the window (None: before any pass)
        self._cpu: tuple[float, float | None] = (0.0, None)
        self._skipped_mark = 0
        self._cache_start: dict[str, Any] | None = None
        self.pass_began = 0  # perf_counter_ns at the start of the pass
        self.first_batch_ns: int | None = None  # time from the start of the pass to its first batch
        self.ready: int | None = None  # fewest finished batches seen waiting (sampled by the loop)

    # ------------------------------------------------------------------ events and the Loader's calls

    def pass_event(self, run: Any, event: str, before: str, after: str) -> None:
        if event == "start" and before == "new":
            self.start_pass(run)
        elif event in ("end", "fail", "close") and run is self._window_pass and self._end is None:
            # The window of a pass ends once: at its stream's end, or when it is closed from outside
            # (Loader.close(), a newer pass); an event of that pass after it is late (its END may come
            # when an abandoned iterator is collected, after a newer pass has opened its window).
            self.end_pass(run)

    def start_pass(self, run: Any = None) -> None:
        """A pass begins (its first ``next()``): its report window starts now."""
        self._start, self._end = self.counters.snapshot(), None
        self._window_pass = run
        self._cpu = (time.process_time(), None)
        self._skipped_mark = self.skipped
        self._cache_start = self._cache_stats()
        self.pass_began = time.perf_counter_ns()
        self.first_batch_ns = None
        self.ready = None
        if self.tuner is not None:
            self.tuner.start_pass()

    def end_pass(self, run: Any = None) -> None:
        """The pass's stream ended: close its report window."""
        self._end = self.counters.snapshot()
        self._cpu = (self._cpu[0], time.process_time())
        if run is not None:
            self.skipped += len(run.skipped)
        if self.tuner is not None:
            self.tuner.end_pass()

    def take_ready(self) -> int | None:
        """The fewest finished batches seen waiting in the channel since the last call (for the autotuner)."""
        value, self.ready = self.ready, None
        return value

    # ------------------------------------------------------------------ the report

    def report(self, settings: dict[str, Any], cpu_budget: int, workers_kind: str, since: str = "pass") -> Report:
        """The report of the last pass (``since="pass"``) or of the loader's life (``"start"``)."""
        from chute.observe.report import Context, build, cache_window  # only when a report is asked for

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
            first = self.first_batch_ns
            skipped = self.skipped - self._skipped_mark
            cache_start = self._cache_start
        decisions = tuple(self.tuner.decisions) if self.tuner is not None else ()
        begin_s = (window_start - self.counters.created_ns) / 1e9
        moves = [m for d in decisions if d.time_s >= begin_s and (m := _MOVE.fullmatch(d.change))]
        context = Context(
            source="chute.Loader", window=label, settings=settings, decisions=decisions,
            cache=cache_window(cache, cache_start), skipped=skipped, cpu_s=cpu_s, cpu_budget=cpu_budget,
            first_batch_s=None if first is None else first / 1e9, workers_kind=workers_kind,
            threads_changed=(int(moves[0][1]), int(moves[-1][2])) if moves else None,
            steps=tuple(self.tuner.policy.steps) if self.tuner is not None else (),
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

