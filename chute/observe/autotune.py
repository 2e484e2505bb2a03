"""The autotuner: worker threads and prefetch depth chosen from the counters, within budgets.

:class:`Policy` is the decision logic, a small class fed one :class:`Window`
of measurements at a time (no threads, no clock: testable with numbers).
:class:`Autotuner` runs it during a Loader's pass: every ``window_s`` seconds
(and at least ``window_batches`` batches, or 2 over half a second) it takes the counters' deltas and
the CPU time used, asks the policy, applies its settings to the worker pool
and logs the decisions (logger ``"chute"``, level INFO; ``loader.report()``
lists them, and its what-if line quotes the last measured step).

The rules (thresholds are the constants below):

* The loop is *data-bound* in a window when it waited for data at least
  ``WAIT`` of its time. Otherwise nothing is added (and the depth may shrink).
* Every change that is meant to end the waiting is a **trial**: it is made
  after ``JUDGE`` windows at the current settings (the first window of a pass,
  its start-up, does not give a rate) and their median rate is what it is
  judged against; a *starved* window (the loop only waited, the workers were
  busy and about a core idle: ``STARVED``) is enough on its own, even a pass's
  first, to start a thread's trial. A trial is judged on the median of the
  ``JUDGE`` windows after it (the first of which the change itself disturbs).
  If the loop still waits and samples/s did not rise by ``GAIN``, the change
  is undone and the setting it came from becomes a ceiling for the rest of the
  loader's life (the wait ending is enough to keep a change only if it was at
  least twice ``WAIT`` before and the rate did not fall, and never for a
  thread beyond the CPU budget, one past its count of cores whose worker's CPU
  share did not fit it when it was tried: that one stays only for a gain
  measured in all but one of the ``JUDGE`` windows after it; threads that wait
  on I/O use a few percent of a core each and are not beyond it, however many). A gain below ``RECHECK`` (and
  any for a thread beyond the CPU budget) is checked before it is kept: the
  policy goes back to the settings before, measures them again, and the
  change must beat both rates measured without it (a shared machine's speed
  drifts by tens of percent within seconds: a change made as it sped up, or
  after a slow stretch, would look like a gain). Kept, the change is made again. Medians of several windows,
  not the best or the last one: a short window's samples/s varies on a shared
  machine by more than the gains a trial looks for (docs/benchmarks.md,
  design figures), and one disturbed window (another process taking
  the CPU for a moment) must neither start nor end a trial. Each judged trial
  is kept as a :class:`Step` (before and after, measured): the report's advice
  comes from these, never from a model of how threads scale.
* Data-bound and the worker threads busy at least ``BUSY`` of their time: try
  one more thread, if the budgets allow it (several while each worker uses at
  most ``WAITING_SHARE`` of a core: as many as would end the wait, within the
  CPU budget, at most doubling the count; half as many after such a trial did
  not help). The **CPU budget** counts CPU
  actually used (the process's CPU time over the window, ``os.times``): a thread
  is added while the cores in use plus one more worker's share (the workers'
  CPU time over the threads) fit in the budget (default the CPUs this process
  may run on), with ``CPU_SLACK`` of a core to spare, or while at least
  ``CPU_SLACK`` of the budget is idle (one worker busy on a copy and the loop
  on two cores: the trial measures what a second worker gets from the rest).
  Threads that wait (I/O, sleeps) use little CPU, so more of them fit. The
  cores in use are the median over the windows at the current settings, not
  one window's. Once in a loader's life a thread is tried with the budget
  full (the **probe**): workers that stall on memory, a page fault or the
  GIL leave their cores idle part of the time, which the CPU counters do not
  show as room (a JPEG decode gained from a thread beyond the cores:
  docs/benchmarks.md, design figures). It waits for ``PROBE_AFTER`` windows at the current settings and, judged
  as every thread beyond the budget is, stays only for a gain in 4 of 5
  windows that survives the recheck. ``probe=False`` leaves it out: the
  Loader passes it when a batch is one native gather and nothing else (a copy
  bound by memory bandwidth, whose threads stall on nothing a third thread
  could fill: such probes were undone, or kept by noise).
  ``max_threads`` is a hard cap
  on the count (``chute.Workers(max_count=)``). The **memory budget** allows at
  most ``max_bytes // batch bytes`` batches in flight, and a thread needs a
  batch in flight to work on.
* Data-bound while the workers were idle (they had no batch to build because
  the depth was full of batches the loop had not reached): try a prefetch
  half as deep again, within the memory budget. Kept, the depth becomes a
  floor; undone, a ceiling.
* The workload changes (a transform or dataset swapped between passes, a training step 3x slower or faster,
  samples that grew): the loop's own time per batch, or the workers' (their CPU when measured), in all but
  one of the last ``JUDGE`` windows at the current thread count is ``SHIFT`` times (or a ``SHIFT``-th of) its
  median over the first ``JUDGE`` windows at that count, and at least ``SHIFT_SHARE`` of the time between
  batches. The judged trials are re-opened once (:meth:`Policy._reopen`): ceilings, floors, the probe reset,
  the windows from then on the new baseline.
* Not data-bound and at least 3 finished batches always waiting when the loop
  took one, for ``CALM`` windows in a row: the depth shrinks by one, not below
  the floor nor below threads + 1 (it never drains, so it is more than needed).
* Data-bound, and a batch's work (the workers' CPU time per batch, the median of ``JUDGE`` windows) under
  ``INLINE_S``, where the loop can build batches itself (``Window.can_inline``: it takes the workers'
  results itself, from a local dataset, with worker threads) and the thread count is tuned: try **inline**,
  the loop building each batch in its own ``next()`` (no hand-off to a thread and back). A trial as the
  others: undone, it is not tried again until the workload changes. While inline nothing else is tried, and
  the threads take over again once the loop's time building a batch is ``SHIFT`` times ``INLINE_S`` in all
  but one of the last ``JUDGE`` windows.
* A depth given by hand (``prefetch=``) and a thread count given by hand
  (``num_threads=``) are never changed.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chute.observe.counters import Counters, Snapshot

#: The loop is data-bound when it waits at least this share of its time.
WAIT = 0.05
#: The worker pool is saturated when its threads are busy at least this share of their time.
BUSY = 0.80
#: A change made while data-bound must raise samples/s by this factor (or end the waiting) to stay.
GAIN = 1.05
#: A measured gain below this factor is re-measured before it is kept (see Policy._judge): a shared
#: machine's speed drifts by more than GAIN between one second and the next.
RECHECK = 1.25
#: Calm windows (no waiting, >= 3 batches always ready) before the depth shrinks by one.
CALM = 2
#: The loop waits at least this share of a window: starved (see Policy._starved).
STARVED = 0.9
#: Windows at the same settings (the first one of a pass not counted) before a trial starts, and after
#: it before it is judged: the medians of these are compared.
JUDGE = 5
#: Windows measured at the current settings before the probe (a thread beyond a full CPU budget, tried
#: once): a process's first windows are slow (pages touched the first time, allocations growing), and a
#: baseline taken from them made a thread beyond the cores look like a large gain (docs/benchmarks.md, design figures).
PROBE_AFTER = 2 * JUDGE
#: Share of a core the CPU in use may exceed the budget by when one more thread is tried, and
#: the idle share of the budget that is enough to try one more thread anyway.
CPU_SLACK = 0.25
#: Cores a worker thread uses at most for the next thread trial to add several threads at once (see
#: Policy._more): tasks that wait (I/O) use a few percent of a core; one that computes uses most of
#: one, and still well above this when other processes burn every core (docs/benchmarks.md, design figures).
WAITING_SHARE = 0.15
#: A batch whose work (the workers' CPU time per batch) is below this many seconds may be built in the loop
#: itself (``inline``): handing it to a worker thread and back (a queue put, a wake-up, the GIL handed over
#: twice, the channel) costs the two threads tens of microseconds of CPU, more than such a batch's own work
#: (docs/observe.md, "Inline").
INLINE_S = 100e-6
#: Default memory budget: bytes of finished or building batches in flight.
DEFAULT_MAX_BYTES = 512 << 20
#: A window closes after ``window_batches`` batches, or after this long with at least 2: slow batches
#: (full-size images: 0.3-3 s each) would otherwise give a window every 8 batches, too few to tune an epoch.
SLOW_WINDOW_NS = 500_000_000
#: Steps (judged trials) remembered.
STEPS = 32
#: The workload changed when the time per batch of the loop's own work, or of the workers', in all but one of
#: the last ``JUDGE`` windows at a thread count differs by this factor (the same way) from its median over the
#: first ``JUDGE`` windows at that count: the judged trials are re-opened (see Policy._reopen). A short window's
#: figures are noisy on a shared machine (docs/observe.md, "Re-open the trials"): the factor stays clear of that noise.
SHIFT = 2.0
#: A time per batch (the loop's, the workers') counts for a change of workload only when it is at least this
#: share of the time between batches: a loop that only takes batches spends microseconds on each, whose
#: ratio from one window to the next is noise.
SHIFT_SHARE = 0.1
#: Windows at the current settings kept (at least ``PROBE_AFTER``).
KEEP_SEEN = 4 * PROBE_AFTER

log = logging.getLogger("chute")


def default_max_threads(cpus: int) -> int:
    """The default cap on worker threads: threads that wait on I/O use little CPU, so more than the CPUs."""
    return max(16, 4 * cpus)


@dataclasses.dataclass(frozen=True)
class Window:
    """What happened during one tuning window (differences of the counters and CPU clocks)."""

    seconds: float  # wall time of the window
    wait_s: float  # the loop blocked in next() waiting for the workers (its own stages' time not counted)
    compute_s: float  # the loop between next() calls (and in its own stages)
    batches: int  # delivered to the loop
    samples: int
    busy_s: float  # worker threads in batch tasks (summed over threads)
    idle_s: float  # worker threads waiting for a task
    min_ready: int | None = None  # fewest finished batches waiting when the loop took one
    batch_bytes: float = 0.0  # mean bytes of a batch
    cpu_s: float | None = None  # CPU time the whole process used (None: not measured)
    loop_cpu_s: float = 0.0  # CPU time of the training loop's own thread (part of cpu_s)
    side_s: float = 0.0  # busy time of the stages on threads of their own (the device copy, a user's): not workers
    can_inline: bool = False  # the loop could build the batches itself (see Policy: inline)

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

    @property
    def cores(self) -> float | None:
        """Cores the process used on average (None: not measured)."""
        return self.cpu_s / self.seconds if self.cpu_s is not None and self.seconds > 0 else None

    @property
    def worker_cores(self) -> float | None:
        """Cores used outside the training loop's thread and the stages on threads of their own: the workers
        (and any other thread of the process). Those stages' threads count in the cores in use, not in a worker's share."""
        if self.cpu_s is None or self.seconds <= 0:
            return None
        return max(0.0, self.cpu_s - self.loop_cpu_s - self.side_s) / self.seconds


@dataclasses.dataclass(frozen=True)
class Decision:
    """One change of the settings, with why."""

    time_s: float  # seconds since the loader was created
    change: str  # e.g. "threads 2 -> 3"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"time_s": round(self.time_s, 3), "change": self.change, "reason": self.reason}


@dataclasses.dataclass(frozen=True)
class Step:
    """A trial the policy judged: the change, the loop's samples/s and wait share before and after, kept or undone.

    Before is the median of the ``JUDGE`` windows ahead of the change (or
    the one starved window that started it), after the median of the
    ``JUDGE`` windows that followed it (each with the median wait).
    """

    change: str  # "threads 1 -> 2", "prefetch 8 -> 12"
    before_rate: float
    after_rate: float
    before_wait: float
    after_wait: float
    kept: bool

    @property
    def kind(self) -> str:
        return self.change.split()[0]

    @property
    def to(self) -> int:
        """The setting the trial went to (inline: 1 for on, 0 for off)."""
        to = self.change.split()[-1]
        return {"on": 1, "off": 0}[to] if self.kind == "inline" else int(to)

    @property
    def gain(self) -> float:
        return self.after_rate / self.before_rate if self.before_rate > 0 else math.inf

    def describe(self) -> str:
        """E.g. ``threads 1 -> 2 took samples/s from 1,000 to 1,520 (+52%) and the wait from 50% to 12%: kept``."""
        return (
            f"{self.change} took samples/s from {self.before_rate:,.0f} to {self.after_rate:,.0f} "
            f"({self.gain - 1:+.0%}) and the loop's wait from {self.before_wait:.0%} to {self.after_wait:.0%}: "
            + ("kept" if self.kept else "undone")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change, "before_rate": round(self.before_rate, 3), "after_rate": round(self.after_rate, 3),
            "before_wait": round(self.before_wait, 4), "after_wait": round(self.after_wait, 4), "kept": self.kept,
        }


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What the policy keeps of one window at the current settings."""

    rate: float  # samples/s; NaN for a pass's start-up window
    wait: float
    cores: float | None
    worker_cores: float | None
    period: float = 0.0  # seconds between batches
    loop: float = 0.0  # seconds of the loop's own work per batch
    work: float = 0.0  # seconds of the workers' work per batch: CPU when measured, else their busy time


@dataclasses.dataclass(frozen=True)
class _Trial:
    """A change under trial: what to go back to, the rate and wait it is judged against, the settings tried.

    ``after`` holds the samples/s of the ``JUDGE`` windows after the change
    once they are measured and the policy went back to re-measure the rate
    before (the recheck); empty until then.
    """

    kind: str  # "threads" or "prefetch"
    threads: int
    depth: int
    rate: float
    wait: float
    change: str
    to_threads: int
    to_depth: int
    after: tuple[float, ...] = ()
    after_wait: float = 0.0
    beyond: bool = False  # a thread whose CPU share did not fit the budget when it was tried

    @property
    def to_inline(self) -> bool:
        return self.kind == "inline"


class Policy:
    """Decides threads and prefetch depth from one window of measurements at a time.

    ``threads`` and ``depth`` are the current settings (read them after
    :meth:`step`). ``max_threads`` caps the thread count, ``cpu_budget`` is
    the cores the process may use (default ``max_threads``), ``max_bytes`` the
    memory budget for batches in flight; ``tune_threads``/``tune_depth`` say
    which of the two settings the policy may change, ``probe`` whether one
    thread beyond a full CPU budget is measured once. ``inline``: the loop
    builds the batches itself (tried with the thread count tuned, judged as
    the other trials). ``steps`` holds the judged trials, latest last.
    """

    def __init__(
        self, threads: int, depth: int, *, max_threads: int, cpu_budget: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES, tune_threads: bool = True, tune_depth: bool = True, probe: bool = True,
    ) -> None:
        if threads < 1 or depth < 1 or max_threads < 1:
            raise ValueError(f"threads, depth and max_threads must be at least 1, got {threads}, {depth}, {max_threads}")
        self.threads = threads
        self.depth = depth
        self.inline = False  # the loop builds the batches itself (see the module docstring)
        self.max_threads = max_threads
        self.cpu_budget = float(max_threads if cpu_budget is None else cpu_budget)
        self.max_bytes = max_bytes
        self.tune_threads = tune_threads
        self.tune_depth = tune_depth
        self.ceiling = max_threads  # lowered when a thread did not help
        self.depth_ceiling = 1 << 30  # lowered when a deeper prefetch did not help
        self.floor = 1  # the depth a kept deepening reached
        self.batch_bytes = 0.0  # the largest mean batch size seen (since the workload last changed)
        self.steps: collections.deque[Step] = collections.deque(maxlen=STEPS)
        self._trial: _Trial | None = None
        self._steady: list[_Seen] = []  # the windows since the last change
        self._first_of_pass = False
        self._calm = 0
        self._said: set[str] = set()  # one-time notes already made
        self._most_added = max_threads  # threads one trial may add (halved after a trial of several did not help)
        self.probe = probe  # whether one thread beyond a full CPU budget is measured once (see the module docstring)
        self._probed = not probe  # that trial was made (or is not to be)
        self._shapes: dict[int, list[_Seen]] = {}  # thread count (0: inline) -> windows at it since the workload was last new
        self._inline_tried = False  # building in the loop did not help (until the workload changes)
        self._waits: collections.deque[float] = collections.deque(maxlen=JUDGE)  # the loop's wait share, last windows

    def depth_limit(self) -> int:
        """The most batches the memory budget allows in flight (at least 1)."""
        if self.batch_bytes <= 0:
            return 1 << 30
        return max(1, int(self.max_bytes // self.batch_bytes))

    def new_pass(self) -> None:
        """A pass starts (nothing built ahead yet): its first window neither gives a baseline rate nor starts a trial.

        The windows of the pass before still count (the settings are the
        same, and so are the threads: the Loader keeps them across passes):
        epochs of a fraction of a second give a window or two each. A trial
        judged stays judged (its ceiling or floor), so a second pass of the
        same workload runs none of the trials of the first again; a starved
        first window (see :meth:`_starved`) is the one exception. A changed
        workload re-opens them (see :func:`_shift`).
        """
        self._first_of_pass = True

    @property
    def data_bound(self) -> bool | None:
        """Whether the loop waited for data (at least ``WAIT`` of its time, the median of the last ``JUDGE``
        windows after a pass's start-up); None before any such window. The Loader runs a gather-only pass on
        native threads when this is True (``chute.pipeline.native_gather``)."""
        if not self._waits:
            return None
        return sorted(self._waits)[len(self._waits) // 2] >= WAIT

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
        starved = self._starved(window)
        start_up = self._first_of_pass and not starved
        if changes:
            self._trial = None  # the settings moved under the trial: nothing to judge
        else:  # the first window of a pass counts as a window, but its rate is start-up's (NaN) unless starved
            rate = math.nan if start_up else window.rate
            seen = _seen(window, rate)
            self._steady.append(seen)
            if len(self._steady) > 2 * KEEP_SEEN:
                del self._steady[:-KEEP_SEEN]
            if rate == rate:  # the workload's windows at this thread count: the first JUDGE and the last ones
                shape = self._shapes.setdefault(self._shape_key, [])
                shape.append(seen)
                if len(shape) > 3 * JUDGE:
                    del shape[JUDGE:-JUDGE]
        self._first_of_pass = False
        if not start_up:
            self._waits.append(window.wait_fraction)
        if (self.tune_threads or self.tune_depth) and self._trial is None and not start_up and (
            shift := _shift(self._shapes.get(self._shape_key, []))
        ):
            return changes + self._reopen(shift)
        measured = [s for s in self._steady if s.rate == s.rate][-JUDGE:]  # s.rate == s.rate: not NaN
        settled = len(measured) >= JUDGE
        base = _median_of(measured)
        if self._trial is not None:
            if not settled:
                return changes  # judge the change on JUDGE windows, not on the one disturbed by it
            changes.extend(self._judge(self._trial, measured, limit))
            if changes or self._trial is not None:
                return changes
        if start_up:
            # A pass's start-up waits for batches nothing built ahead: that says nothing of the settings, and
            # with the windows of the pass before as a baseline it would start a trial at every pass's start.
            return changes
        if self.inline:
            return changes + self._leave_inline(measured)
        wait, busy = window.wait_fraction, window.utilisation
        if (wait >= WAIT and window.can_inline and self.tune_threads and not self._inline_tried and settled
                and base is not None and (work := _median([s.work for s in measured])) < INLINE_S):
            change = self._set_inline(
                True, f"the loop waited {wait:.0%} of its time for batches whose work takes {work * 1e6:,.0f} us each: "
                "less than handing one to a worker thread and back costs",
            )
            self._trial = _Trial("inline", self.threads, self.depth, base[0], base[1], change[0], self.threads, self.depth)
            return changes + [change]
        if wait >= WAIT:
            self._calm = 0
            if busy >= BUSY and self.tune_threads:
                used = self._cores(window, measured)
                cpu = self._cpu_full(used)
                if self.threads < min(self.ceiling, self._thread_limit()) and (cpu is None or not self._probed):
                    probe = cpu is not None
                    if starved and not settled:
                        base = (window.rate, window.wait_fraction)  # one starved window is baseline enough
                    elif not settled or base is None:
                        return changes  # more windows at these settings first
                    if probe:  # once per loader: a worker that stalls (memory, the GIL, a page fault) leaves its core idle
                        if sum(s.rate == s.rate for s in self._steady) < PROBE_AFTER:
                            return changes  # the process's first windows are slow (first touches): not a baseline
                        self._probed = True
                    beyond = self._beyond(used)  # before the count changes
                    top = min(self.ceiling, self._thread_limit())
                    added = 1 if probe else min(self._more(used, base[1]), top - self.threads)
                    change = self._set_threads(
                        self.threads + added,
                        f"the loop waited {wait:.0%} of its time and the {self.threads} worker thread(s) were {busy:.0%} busy"
                        + (f"; {cpu}: one thread beyond the budget is measured once" if probe else
                           f"; {window.cores:.2f} of {self.cpu_budget:g} cores in use" if window.cores is not None else ""),
                    )
                    old_depth = self.depth
                    changes.append(change)
                    want = min(limit, self.depth_ceiling, 2 * self.threads)
                    if self.tune_depth and self.depth < want:
                        changes.append(self._set_depth(want, "2 batches in flight per thread"))
                    self._trial = _Trial(
                        "threads", self.threads - added, old_depth, base[0], base[1], change[0], self.threads, self.depth,
                        beyond=beyond,
                    )
                else:
                    changes.extend(self._note_cap(wait, busy, limit, cpu))
            elif busy < BUSY and self.tune_depth and window.min_ready in (None, 0):
                top = min(limit, self.depth_ceiling)
                if self.depth < top:
                    if not settled or base is None:
                        return changes
                    old, new = self.depth, min(top, self.depth + max(1, self.depth // 2))
                    change = self._set_depth(
                        new,
                        f"the loop waited {wait:.0%} of its time while the workers were idle {1 - busy:.0%} of theirs: "
                        "batches were not started early enough",
                    )
                    self._trial = _Trial("prefetch", self.threads, old, base[0], base[1], change[0], self.threads, new)
                    changes.append(change)
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

    @property
    def _shape_key(self) -> int:
        """The windows a change of workload is looked for in: those at the thread count, or inline (0)."""
        return 0 if self.inline else self.threads

    def _leave_inline(self, measured: list[_Seen]) -> list[tuple[str, str]]:
        """Inline: back to the worker threads when the loop's time building a batch (its wait per batch) is
        ``SHIFT`` times ``INLINE_S`` in all but one of the last ``JUDGE`` windows (the batches grew dearer)."""
        if len(measured) < JUDGE:
            return []
        built = [s.wait * s.period for s in measured[-JUDGE:]]
        if sum(b >= SHIFT * INLINE_S for b in built) < JUDGE - 1:
            return []
        return [self._set_inline(False, f"a batch now takes the loop {_median(built) * 1e6:,.0f} us to build: the worker threads build them")]

    def _reopen(self, shift: str) -> list[tuple[str, str]]:
        """The workload changed (``shift`` says how): what the judged trials found no longer holds.

        Ceilings, floors, the probe, the one-time notes and the largest batch
        seen (the memory budget's measure: a new transform may make smaller
        batches) are reset, and the windows from now on are the new baseline
        (the settings stay where they are: the trials start from them). Once
        per change: the new workload's windows are the reference the next
        change is measured against.
        """
        self.batch_bytes = 0.0  # (the next window measures it before anything is decided on it)
        self.ceiling = self.max_threads
        self.depth_ceiling = 1 << 30
        self.floor = 1
        self._most_added = self.max_threads
        self._probed = not self.probe
        self._inline_tried = False
        self._said = set()
        self._calm = 0
        self._steady = []
        self._shapes = {}
        return [("trials re-opened", f"the workload changed: {shift}")]

    def _judge(self, trial: _Trial, measured: list[_Seen], limit: int) -> list[tuple[str, str]]:
        """Keep or undo the change under trial, measured by the ``JUDGE`` windows since the last change.

        After the change: a loss is undone at once; a gain is kept at once when
        it is beyond ``RECHECK`` (and not for a thread beyond the CPU budget);
        otherwise the policy goes back to the old settings and measures them
        again (the recheck), and the change must beat both rates measured
        without it: a shared machine's speed drifts by more than the gain
        within seconds, and one slow stretch before a change (another process on the
        cores) must not make it look like a gain.
        Kept, the change is made again. Either way it is remembered as a :class:`Step`.
        """
        now = _median_of(measured)
        assert now is not None
        if not trial.after:  # the windows after the change
            after, after_wait, before, before_wait = [s.rate for s in measured], now[1], trial.rate, trial.wait
        else:  # the windows back at the old settings: the change must beat both measures of them
            after, after_wait = list(trial.after), trial.after_wait
            before, before_wait = max((trial.rate, trial.wait), now)
        after_rate = _median(after)
        beyond = trial.beyond
        gained = sum(r >= before * GAIN for r in after)
        kept = _kept(before, before_wait, after_rate, after_wait, beyond, gained)
        if kept and not trial.after and (beyond or after_rate < before * RECHECK):
            self._trial = dataclasses.replace(trial, after=tuple(after), after_wait=after_wait)
            return self._go(
                trial.threads, trial.depth, False,
                f"{trial.change} measured {before:,.0f} -> {after_rate:,.0f} samples/s"
                + (f" ({after_rate / before - 1:+.0%})" if before > 0 else "") + ": "
                "re-measuring the settings before, as the machine's speed may have changed instead",
            )
        self._trial = None
        self.steps.append(Step(trial.change, before, after_rate, before_wait, after_wait, kept))
        measured_text = f"{before:,.0f} -> {after_rate:,.0f} samples/s"
        if kept:
            if trial.kind == "prefetch":
                self.floor = trial.to_depth
            if not trial.after:
                return []
            return self._go(
                trial.to_threads, min(trial.to_depth, limit), trial.to_inline,
                f"{trial.change} is kept: {measured_text} with the rate before re-measured",
            )
        tried = (f"thread {trial.threads + 1}" if trial.to_threads == trial.threads + 1
                 else f"threads {trial.threads + 1}-{trial.to_threads}")
        what = (f"{tried} did not help: {measured_text}; staying at {trial.threads} "
                "(the work may hold the GIL, or share one resource)") if trial.kind == "threads" else (
                f"building the batches in the loop did not help: {measured_text}; back to the worker threads"
                ) if trial.kind == "inline" else (
                f"prefetch {trial.to_depth} did not help: {measured_text}; back to {trial.depth} "
                "(the wait is not for lack of batches started)")
        if trial.kind == "inline":
            self._inline_tried = True
        elif trial.kind == "threads":
            self.ceiling = trial.to_threads - 1  # after several threads together, fewer may still help:
            self._most_added = max(1, (trial.to_threads - trial.threads) // 2)  # half as many are tried next
        else:
            self.depth_ceiling = trial.depth
        if trial.after:  # already back at the old settings: only the ceiling changes
            stays = {"threads": f"threads stay at {trial.threads}", "inline": "inline stays off"}.get(
                trial.kind, f"prefetch stays at {trial.depth}")
            return [(stays, what)]
        return self._go(trial.threads, min(trial.depth, limit), False, what)

    def _go(self, threads: int, depth: int, inline: bool, reason: str) -> list[tuple[str, str]]:
        """Set the settings (those that are tuned), one change each, with the same reason."""
        changes = []
        if self.inline != inline:
            changes.append(self._set_inline(inline, reason))
        if self.tune_threads and self.threads != threads:
            changes.append(self._set_threads(threads, reason))
        if self.tune_depth and self.depth != depth:
            changes.append(self._set_depth(depth, reason if not changes else "with the thread count"))
        return changes

    def _starved(self, window: Window) -> bool:
        """Whether the window leaves no doubt that a thread is missing: the loop did nothing but wait
        (``STARVED``), the workers were busy, and a worker's core was idle (all but ``CPU_SLACK`` of one: the
        loop's own thread uses a little). Then its rate is a
        baseline even as a pass's first window (nothing was built ahead for it to drain), and one such window
        is enough to start a thread's trial (``JUDGE`` windows judge it as always)."""
        cores = window.cores
        return (window.wait_fraction >= STARVED and window.utilisation >= BUSY and cores is not None
                and cores + 1 <= self.cpu_budget + CPU_SLACK)

    def _thread_limit(self) -> int:
        """Threads the budgets allow by count: ``max_threads``, and one batch in flight per thread."""
        return max(1, min(self.max_threads, self.depth_limit()))

    def _cores(self, window: Window, measured: list[_Seen]) -> tuple[float, float] | None:
        """``(cores in use, one worker thread's share)``, or None if CPU was not measured.

        The cores in use are the median over ``measured`` (the windows at these settings), or the window's
        alone before there are any: one window's CPU varies as much as its rate.
        """
        pairs = [(s.cores, s.worker_cores) for s in measured if s.cores is not None and s.worker_cores is not None]
        cores, workers = window.cores, window.worker_cores
        if pairs:
            cores, workers = _median([c for c, _ in pairs]), _median([w for _, w in pairs])
        if cores is None or workers is None:
            return None
        return cores, workers / self.threads

    def _more(self, used: tuple[float, float] | None, wait: float) -> int:
        """Threads the next trial adds: one; or, while each worker uses at most ``WAITING_SHARE`` of a
        core (its tasks wait: I/O, sleeps), as many as would end the loop's ``wait`` if each added its
        share of samples/s (the loop's own time per batch unchanged: ``threads / (1 - wait)`` in all),
        within what the CPU budget has room for at that share and at most doubling the count. When
        such a trial does not help, the next adds half as many (the count that helps is between).

        Added one trial at a time (10 windows each), threads that wait on I/O took many trials to reach
        the count that ends the wait; doubling takes few (docs/benchmarks.md, design figures). A
        worker that computes uses far more than ``WAITING_SHARE`` even on a machine whose other processes
        take most of the cores.
        """
        if used is None:
            return 1
        cores, per_thread = used
        if per_thread > WAITING_SHARE:
            return 1
        room = self.cpu_budget + CPU_SLACK - cores
        fit = self.threads if per_thread <= 0 else int(room // per_thread)
        enough = math.ceil(self.threads / max(1 - wait, 1 / (2 * self.threads))) - self.threads
        return max(1, min(self.threads, fit, self._most_added, enough))

    def _fits(self, used: tuple[float, float] | None) -> bool:
        """Whether one more worker's CPU share fits the budget (``used``: :meth:`_cores`; True when not measured)."""
        return used is None or used[0] + used[1] <= self.cpu_budget + CPU_SLACK

    def _beyond(self, used: tuple[float, float] | None) -> bool:
        """Whether the thread about to be tried (the current count + 1) is beyond the CPU budget: more
        threads than the budget's cores, and its worker's CPU share does not fit (threads that wait on I/O
        use a few percent of a core each and fit, however many) or no CPU was measured."""
        if self.threads + 1 <= self.cpu_budget:
            return False
        return used is None or not self._fits(used)

    def _cpu_full(self, used: tuple[float, float] | None) -> str | None:
        """Why one more thread would not fit the CPU budget, or None if it fits (or CPU was not measured)."""
        if used is None or self._fits(used):
            return None  # one more worker's share fits
        cores, per_thread = used
        if cores <= self.cpu_budget - CPU_SLACK:
            return None  # it does not, but idle CPU is there to take: the trial measures what it gives
        return (
            f"the CPU budget is used: {cores:.2f} of {self.cpu_budget:g} cores busy, "
            f"and a worker thread uses about {per_thread:.2f}"
        )

    def _set_threads(self, threads: int, reason: str) -> tuple[str, str]:
        change = f"threads {self.threads} -> {threads}"
        self.threads = threads
        self._steady = []
        return change, reason

    def _set_inline(self, inline: bool, reason: str) -> tuple[str, str]:
        change = "inline off -> on" if inline else "inline on -> off"
        self.inline = inline
        self._steady = []
        return change, reason

    def _set_depth(self, depth: int, reason: str) -> tuple[str, str]:
        change = f"prefetch {self.depth} -> {depth}"
        self.depth = depth
        self._steady = []
        return change, reason

    def _note_cap(self, wait: float, busy: float, limit: int, cpu: str | None) -> list[tuple[str, str]]:
        """Say once why no thread is added although the loop waits."""
        if cpu is not None:
            key, why = "cpu", cpu
        elif self.threads >= self.max_threads:
            key, why = "count", f"the thread budget of {self.max_threads} is reached (chute.Workers(max_count=))"
        elif self.threads >= limit:
            key, why = "memory", f"the memory budget ({_mb(self.max_bytes)}) allows {limit} batch(es) in flight"
        else:
            key, why = "ceiling", f"a thread beyond {self.ceiling} did not help before"
        if key in self._said:
            return []
        self._said.add(key)
        return [(f"threads stay at {self.threads}", f"the loop waits {wait:.0%} of its time but {why}")]


def _kept(before: float, before_wait: float, after: float, after_wait: float, beyond: bool, gained: int) -> bool:
    """Whether a trial stays: the median samples/s ``after`` rose by ``GAIN`` over ``before``; or the
    loop's wait, clearly there before (at least twice ``WAIT``), ended without the rate falling. A
    worker thread beyond the CPU budget (``beyond``) stays only for a gain measured in all but one of the
    ``JUDGE`` windows after it (``gained``; the one excused is the window the change disturbed): the end
    of a wait alone is not worth a thread the cores cannot run, and a gain in half the windows is noise
    as often as not (docs/benchmarks.md, design figures).
    """
    if beyond:
        return gained >= JUDGE - 1 and after >= before * GAIN
    if after >= before * GAIN:
        return True
    return after_wait < WAIT <= before_wait / 2 and after >= before


def _seen(window: Window, rate: float) -> _Seen:
    """What the policy keeps of ``window`` (``rate``: its samples/s, or NaN for a pass's start-up)."""
    batches = window.batches
    workers = window.worker_cores
    work = workers * window.seconds if workers is not None else window.busy_s
    return _Seen(
        rate, window.wait_fraction, window.cores, workers,
        period=window.seconds / batches, loop=window.compute_s / batches, work=work / batches,
    )


def _shift(measured: list[_Seen]) -> str | None:
    """How the workload changed between the first ``JUDGE`` of ``measured`` (windows at one thread count)
    and the last ``JUDGE``, or None: the time per batch of the loop's own work or of the workers' moved by
    ``SHIFT`` or more from its median over the first (in all but one of the last windows, the same way),
    and was at least ``SHIFT_SHARE`` of the time between batches on one side.

    At one thread count only: a thread added to work that holds the GIL slows the loop's own Python, and
    threads sharing cores stretch each other's busy time, which is not a change of workload. The prefetch
    depth changes neither.
    """
    if len(measured) < 2 * JUDGE:
        return None
    first, last = measured[:JUDGE], measured[-JUDGE:]
    period = (_median([s.period for s in first]), _median([s.period for s in last]))
    for what, name in (("loop", "the loop's own time per batch"), ("work", "the workers' time per batch")):
        before, values = _median([getattr(s, what) for s in first]), [getattr(s, what) for s in last]
        now = _median(values)
        if before < SHIFT_SHARE * period[0] and now < SHIFT_SHARE * period[1]:
            continue
        # all but one of the last windows beyond the band, the same way (medians alone would take windows
        # that alternate between two levels, as a window of a few batches of two kinds may, for a change)
        if sum(v >= SHIFT * before for v in values) >= JUDGE - 1 or sum(v * SHIFT <= before for v in values) >= JUDGE - 1:
            return f"{name} went from {before * 1e3:,.2f} ms to {now * 1e3:,.2f} ms"
    return None


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median_of(windows: list[_Seen]) -> tuple[float, float] | None:
    """``(median samples/s, median wait share)`` of ``windows``, or None if there are none."""
    if not windows:
        return None
    return _median([s.rate for s in windows]), _median([s.wait for s in windows])


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
        self._last: Snapshot | None = None
        self._cpu: tuple[float, float, int] = (0.0, 0.0, 0)
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
            self._cpu = _cpu_clocks()
            self.next_ns = now_ns + self.window_ns
            meter.take_ready()
            return
        got = counters.consumer.batches - self._last.consumer.batches
        if got < self.window_batches and (got < 2 or now_ns - self._last.time_ns < SLOW_WINDOW_NS):
            self.next_ns = now_ns + self.window_ns // 4
            return
        policy = self.policy
        if batches_left <= 2 * policy.threads:
            # The tail of the pass: the workers run out of batches to start, and the loop's wait says nothing
            # of the settings. Before it, a loop that waits leaves nothing ready, so every batch left but the
            # `threads` being built is queued work: an epoch of 30 batches at prefetch 16 still gives windows.
            self.next_ns = 1 << 62
            return
        snap, cpu = counters.snapshot(), _cpu_clocks()
        delta = snap - self._last
        (cpu_s, loop_cpu_s), self._last, self._cpu = _cpu_used(self._cpu, cpu), snap, cpu
        self.next_ns = now_ns + self.window_ns
        stages = delta.stages
        workers = stages["workers"]
        out_bytes = max((t.nbytes for t in stages.values() if t.where == "workers"), default=0)  # gathered vs finished
        # the loop's own stages run inside its wait for a batch, but no worker can shorten them
        in_loop = sum(t.busy_ns for t in stages.values() if t.where == "loop")
        consumer = delta.consumer
        window = Window(
            seconds=delta.time_ns / 1e9,
            wait_s=max(0, consumer.wait_ns - in_loop) / 1e9,
            compute_s=(consumer.compute_ns + min(in_loop, consumer.wait_ns)) / 1e9,
            batches=consumer.batches,
            samples=consumer.samples,
            busy_s=workers.busy_ns / 1e9,
            idle_s=workers.wait_out_ns / 1e9,
            min_ready=meter.take_ready(),
            batch_bytes=out_bytes / built if (built := max(workers.items, consumer.batches)) else 0.0,  # (inline: the loop built them)
            cpu_s=cpu_s,
            loop_cpu_s=loop_cpu_s,
            side_s=sum(t.busy_ns for t in stages.values() if t.where == "thread") / 1e9,
            can_inline=getattr(executor, "can_inline", False),
        )
        before = (policy.threads, policy.depth, policy.inline)
        changes = policy.step(window)
        if not changes:
            return
        at = (time.perf_counter_ns() - counters.created_ns) / 1e9
        for change, reason in changes:
            self.decisions.append(Decision(at, change, reason))
            log.info("chute: autotune: %s: %s", change, reason)
        if (policy.threads, policy.depth, policy.inline) != before:
            if getattr(executor, "can_inline", False):
                executor.inline = policy.inline  # from the next step the loop builds (or no longer builds) its batches
            if hasattr(executor, "resize"):
                executor.resize(policy.threads)
                executor.set_depth(policy.depth)
            if self.on_change is not None:
                self.on_change(policy.threads, policy.depth)


def _cpu_clocks() -> tuple[float, float, int]:
    """``(process CPU s, this thread's CPU s, this thread's id)``: the process's CPU counts every thread."""
    return time.process_time(), time.thread_time(), threading.get_ident()


def _cpu_used(before: tuple[float, float, int], after: tuple[float, float, int]) -> tuple[float, float]:
    """``(process CPU s, loop thread CPU s)`` between two readings (the loop's 0 if the windows ended on other threads)."""
    loop = after[1] - before[1] if after[2] == before[2] else 0.0
    return max(0.0, after[0] - before[0]), max(0.0, loop)
