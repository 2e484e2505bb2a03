"""The autotuner: worker threads and prefetch depth chosen from the counters, within budgets.

:class:`Policy` is the decision logic, a small class fed one :class:`Window`
of measurements at a time (no threads, no clock: testable with numbers).
:class:`Autotuner` runs it during a Loader's pass: every ``window_s`` seconds
(and at least ``window_batches`` batches) it takes the counters' deltas, asks
the policy, applies its settings to the worker pool and logs the decisions
(logger ``"chute"``, level INFO; ``loader.report()`` lists them).

The rules (thresholds are the constants below):

* The loop is *data-bound* in a window when it waited for data at least
  ``WAIT`` of its time. Otherwise nothing is added (and the depth may shrink).
* Data-bound and the worker threads busy at least ``BUSY`` of their time: add
  one thread (and keep the depth at 2 per thread), unless the CPU budget
  (``max_threads``, default the CPUs this process may run on) or the memory
  budget (at most ``max_bytes // batch bytes`` batches in flight, and a thread
  needs a batch in flight to work on) is reached. A thread is only added after
  ``SETTLE`` windows at the current settings (the first window of a pass, its
  start-up, does not give a rate), and the best of them is the rate it is
  judged against; it is judged on the best of the ``SETTLE`` windows after it
  (the first of which the change itself disturbs): if the loop still waits and
  samples/s did not rise by ``GAIN``, the thread is removed again and the count
  it reached becomes a ceiling for the rest of the loader's life (e.g. work
  that holds the GIL). Best-of-two makes one disturbed window (another process
  taking the CPU for a moment) neither start nor end a trial.
* Data-bound while the workers were idle (they had no batch to build because
  the depth was full of batches the loop had not reached): deepen the prefetch
  by half, within the memory budget. The depth reached becomes a floor.
* Not data-bound and at least 3 finished batches always waiting when the loop
  took one, for ``CALM`` windows in a row: the depth shrinks by one, not below
  the floor nor below threads + 1 (it never drains, so it is more than needed).
* A depth given by hand (``prefetch=``) and a thread count given by hand
  (``num_threads=``) are never changed.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chute.observe.counters import Counters

#: The loop is data-bound when it waits at least this share of its time.
WAIT = 0.05
#: The worker pool is saturated when its threads are busy at least this share of their time.
BUSY = 0.80
#: A thread added while data-bound must raise samples/s by this factor (or end the waiting) to stay.
GAIN = 1.05
#: Calm windows (no waiting, >= 3 batches always ready) before the depth shrinks by one.
CALM = 2
#: Windows at the same settings (the first one of a pass not counted) before a thread is added:
#: the rate a new thread is judged against is the best of these, not a window disturbed by a change.
SETTLE = 2
#: Default memory budget: bytes of finished or building batches in flight.
DEFAULT_MAX_BYTES = 512 << 20

log = logging.getLogger("chute")


@dataclasses.dataclass(frozen=True)
class Window:
    """What happened during one tuning window (differences of the counters)."""

    seconds: float  # wall time of the window
    wait_s: float  # the loop blocked in next()
    compute_s: float  # the loop between next() calls
    batches: int  # delivered to the loop
    samples: int
    busy_s: float  # worker threads in batch tasks (summed over threads)
    idle_s: float  # worker threads waiting for a task
    min_ready: int | None = None  # fewest finished batches waiting when the loop took one
    batch_bytes: float = 0.0  # mean bytes of a batch

    @property
    def wait_fraction(self) -> float:
        loop = self.wait_s + self.compute_s
        return self.wait_s / loop if loop > 0 else 0.0

    @property
    def utilisation(self) -> float:
        """Share of the worker threads' time spent building batches."""
        total = self.busy_s + self.idle_s
        return self.busy_s / total if total > 0 else 0.0

    @property
    def rate(self) -> float:
        """Samples per second delivered to the loop."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Decision:
    """One change of the settings, with why."""

    time_s: float  # seconds since the loader was created
    change: str  # e.g. "threads 2 -> 3"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"time_s": round(self.time_s, 3), "change": self.change, "reason": self.reason}


class Policy:
    """Decides threads and prefetch depth from one window of measurements at a time.

    ``threads`` and ``depth`` are the current settings (read them after
    :meth:`step`). ``max_threads`` is the CPU budget, ``max_bytes`` the memory
    budget for batches in flight; ``tune_threads``/``tune_depth`` say which
    of the two settings the policy may change.
    """

    def __init__(
        self, threads: int, depth: int, *, max_threads: int, max_bytes: int = DEFAULT_MAX_BYTES,
        tune_threads: bool = True, tune_depth: bool = True,
    ) -> None:
        if threads < 1 or depth < 1 or max_threads < 1:
            raise ValueError(f"threads, depth and max_threads must be at least 1, got {threads}, {depth}, {max_threads}")
        self.threads = threads
        self.depth = depth
        self.max_threads = max_threads
        self.max_bytes = max_bytes
        self.tune_threads = tune_threads
        self.tune_depth = tune_depth
        self.ceiling = max_threads  # lowered when a thread did not help
        self.floor = 1  # the depth the policy deepened to because the loop waited
        self.batch_bytes = 0.0  # the largest mean batch size seen
        self._trial: tuple[float, int, int] | None = None  # (samples/s, threads, depth) before a thread was added
        self._steady: list[float] = []  # samples/s of the windows since the last change (or pass start)
        self._first_of_pass = False
        self._calm = 0
        self._said: set[str] = set()  # one-time notes already made

    def depth_limit(self) -> int:
        """The most batches the memory budget allows in flight (at least 1)."""
        if self.batch_bytes <= 0:
            return 1 << 30
        return max(1, int(self.max_bytes // self.batch_bytes))

    def new_pass(self) -> None:
        """A pass starts (new worker threads): its first window's rate is not used as a baseline."""
        self._steady = []
        self._first_of_pass = True

    def step(self, window: Window) -> list[tuple[str, str]]:
        """Take one window into account; return the changes made, as ``(change, reason)``."""
        if window.batches <= 0:
            return []
        changes: list[tuple[str, str]] = []
        self.batch_bytes = max(self.batch_bytes, window.batch_bytes)
        limit = self.depth_limit()
        if self.tune_depth and self.depth > limit:
            changes.append(self._set_depth(limit, f"{limit} batches of {_mb(self.batch_bytes)} fill the memory budget of {_mb(self.max_bytes)}"))
            self.floor = min(self.floor, limit)
        if self.tune_threads and self.threads > self._thread_limit():
            # the memory budget allows fewer batches in flight than threads: the extra ones would idle
            changes.append(self._set_threads(self._thread_limit(), f"only {limit} batch(es) fit in the memory budget"))
        if not changes:  # the first window of a pass counts as a window, but its rate is start-up's: NaN
            self._steady.append(float("nan") if self._first_of_pass else window.rate)
        self._first_of_pass = False
        settled = len(self._steady) >= SETTLE
        best = max((r for r in self._steady[-SETTLE:] if r == r), default=None)  # r == r: not the NaN placeholder
        if self._trial is not None:
            if not settled:
                return changes  # judge the new thread on SETTLE windows, not on the one disturbed by the change
            rate, threads, depth = self._trial
            self._trial = None
            if window.wait_fraction >= WAIT and (best is None or best < rate * GAIN) and self.threads > threads:
                self.ceiling = threads
                changes.append(self._set_threads(
                    threads,
                    f"thread {threads + 1} did not help: {rate:,.0f} -> {best or 0:,.0f} samples/s; "
                    f"staying at {threads} (the work may hold the GIL)",
                ))
                if self.tune_depth and self.depth != depth:
                    changes.append(self._set_depth(min(depth, limit), "back with the thread count"))
                return changes
        wait, busy = window.wait_fraction, window.utilisation
        if wait >= WAIT:
            self._calm = 0
            if busy >= BUSY and self.tune_threads:
                if self.threads < min(self.ceiling, self._thread_limit()):
                    if not settled or best is None:
                        return changes  # one more window at these settings first
                    self._trial = (best, self.threads, self.depth)
                    changes.append(self._set_threads(
                        self.threads + 1,
                        f"the loop waited {wait:.0%} of its time and the {self.threads} worker thread(s) were {busy:.0%} busy",
                    ))
                    if self.tune_depth and self.depth < 2 * self.threads:
                        changes.append(self._set_depth(min(limit, 2 * self.threads), "2 batches in flight per thread"))
                else:
                    changes.extend(self._note_cap(wait, busy, limit))
            elif busy < BUSY and self.tune_depth and window.min_ready in (None, 0) and self.depth < limit:
                new = min(limit, self.depth + max(1, self.depth // 2))
                self.floor = new
                changes.append(self._set_depth(
                    new,
                    f"the loop waited {wait:.0%} of its time while the workers were idle {1 - busy:.0%} of theirs: "
                    "batches were not started early enough",
                ))
        elif self.tune_depth and window.min_ready is not None and window.min_ready >= 3:
            self._calm += 1
            lowest = max(self.floor, self.threads + 1)
            if self._calm >= CALM and self.depth > lowest:
                self._calm = 0
                changes.append(self._set_depth(
                    self.depth - 1,
                    f"at least {window.min_ready} finished batches were always waiting and the loop did not wait",
                ))
        else:
            self._calm = 0
        return changes

    # ---------------------------------------------------------------- helpers

    def _thread_limit(self) -> int:
        """Threads the budgets allow: the CPU budget, and one batch in flight per thread."""
        return max(1, min(self.max_threads, self.depth_limit()))

    def _set_threads(self, threads: int, reason: str) -> tuple[str, str]:
        change = f"threads {self.threads} -> {threads}"
        self.threads = threads
        self._steady = []
        return change, reason

    def _set_depth(self, depth: int, reason: str) -> tuple[str, str]:
        change = f"prefetch {self.depth} -> {depth}"
        self.depth = depth
        self._steady = []
        return change, reason

    def _note_cap(self, wait: float, busy: float, limit: int) -> list[tuple[str, str]]:
        """Say once why no thread is added although the loop waits."""
        if self.threads >= self.max_threads:
            key, why = "cpu", f"the CPU budget of {self.max_threads} thread(s) is reached"
        elif self.threads >= limit:
            key, why = "memory", f"the memory budget ({_mb(self.max_bytes)}) allows {limit} batch(es) in flight"
        else:
            key, why = "ceiling", f"a thread beyond {self.ceiling} did not help before"
        if key in self._said:
            return []
        self._said.add(key)
        return [(f"threads stay at {self.threads}", f"the loop waits {wait:.0%} of its time but {why}")]


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


class Autotuner:
    """Runs a :class:`Policy` during a Loader's passes and applies what it decides.

    The training loop calls ``tick`` when ``next_ns`` has passed. New settings
    go to the pass's executor (``resize``, ``set_depth``) and to
    ``on_change(threads, depth)`` if set.
    """

    def __init__(
        self, policy: Policy, counters: Counters, *, window_s: float = 0.03, window_batches: int = 8, history: int = 100
    ) -> None:
        self.policy = policy
        self.counters = counters
        self.window_ns = int(window_s * 1e9)
        self.window_batches = window_batches
        self.decisions: collections.deque[Decision] = collections.deque(maxlen=history)
        self.next_ns = 0
        self._last = None
        self.on_change: Callable[[int, int], None] | None = None  # called with (threads, depth) after a change

    def start_pass(self) -> None:
        """A new pass: the first window starts at its first batch."""
        self._last = None
        self.next_ns = 0
        self.policy.new_pass()

    def end_pass(self) -> None:
        self._last = None
        self.next_ns = 1 << 62  # no ticks between passes

    def tick(self, now_ns: int, batches_left: int, executor: Any, meter: Any) -> None:
        """Called by the training loop when ``now_ns >= next_ns``: close a window if it is complete.

        ``executor`` is the pass's (``resize``, ``set_depth``); ``meter.take_ready()``
        gives the fewest finished batches seen waiting since the last window.
        """
        counters = self.counters
        if self._last is None:  # the first batch: the window starts now, after the start-up latency
            self._last = counters.snapshot()
            self.next_ns = now_ns + self.window_ns
            meter.take_ready()
            return
        if counters.consumer.batches - self._last.consumer.batches < self.window_batches:
            self.next_ns = now_ns + self.window_ns // 4
            return
        policy = self.policy
        if batches_left <= 2 * policy.depth + policy.threads:
            self.next_ns = 1 << 62  # the tail of the pass: workers run out of work, nothing to learn
            return
        snap = counters.snapshot()
        delta = snap - self._last
        self._last = snap
        self.next_ns = now_ns + self.window_ns
        workers = delta.stages["workers"]
        out_bytes = max(delta.stages["read"].nbytes, delta.stages["transform"].nbytes)  # gathered vs finished
        consumer = delta.consumer
        window = Window(
            seconds=delta.time_ns / 1e9,
            wait_s=consumer.wait_ns / 1e9,
            compute_s=consumer.compute_ns / 1e9,
            batches=consumer.batches,
            samples=consumer.samples,
            busy_s=workers.busy_ns / 1e9,
            idle_s=workers.wait_out_ns / 1e9,
            min_ready=meter.take_ready(),
            batch_bytes=out_bytes / workers.items if workers.items else 0.0,
        )
        before = (policy.threads, policy.depth)
        changes = policy.step(window)
        if not changes:
            return
        at = (time.perf_counter_ns() - counters.created_ns) / 1e9
        for change, reason in changes:
            self.decisions.append(Decision(at, change, reason))
            log.info("chute: autotune: %s: %s", change, reason)
        if (policy.threads, policy.depth) != before:
            if hasattr(executor, "resize"):
                executor.resize(policy.threads)
                executor.set_depth(policy.depth)
            if self.on_change is not None:
                self.on_change(policy.threads, policy.depth)
