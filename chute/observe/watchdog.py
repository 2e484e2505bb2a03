"""The hang watchdog: when the training loop waits too long for a batch, say why.

A loader that hangs in what looks like a read must never be silent (the
"why does my DataLoader hang?" case). The training loop waits for each batch
with a timeout; when a wait times out, the loop itself (:class:`StallWatch`)
writes a report to stderr and the ``"chute"`` logger:

- what the loop waits for (step, epoch, rank) and for how long;
- the batches in flight: their sample indices, which thread or worker process
  builds each one and for how long, and the exact sample when a thread is
  inside the user's transform (the pass publishes the position of the sample
  each worker is transforming; nothing walks another thread's variables);
- every read in flight (``chute.observe.inflight``): file or URL, byte range,
  seconds elapsed;
- queue depths (batches submitted, being built, prefetch);
- the Python stack of every thread of this process, named by role, and of
  every worker process (dumped by ``faulthandler`` in the worker on SIGUSR1,
  so it works even when the worker holds the GIL).

With ``on_stall="warn"`` (the default) it keeps waiting and reports again
after another timeout; with ``"raise"`` the wait raises
:class:`chute.errors.StallError` carrying the report as ``.report``. There is
no watchdog thread: a report is made only for the wait that timed out, and the
cost per batch is the timeout argument of the wait. The one exception is a
pass whose loop builds its batches itself (inline): its own work cannot time
out, so a thread watches it (:class:`BuildWatch`).

The timeout: a number is used for every wait; ``"auto"`` (the default) allows
:data:`FIRST_TIMEOUT` seconds for the first batch of a pass (start-up, first
downloads) and, once :data:`WARMUP` waits have been seen,
``max(FLOOR, FACTOR x the 95th percentile of the last HISTORY waits)``;
``None`` turns the watchdog off.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from chute.errors import StallError
from chute.observe import inflight

log = logging.getLogger("chute")

FIRST_TIMEOUT = 300.0  # seconds for the first batch of a pass with the timeout "auto"
FLOOR = 60.0  # the adaptive timeout is never shorter than this
FACTOR = 20.0  # ... and otherwise this many times the 95th percentile of recent waits
WARMUP = 8  # waits seen before the adaptive rule replaces FIRST_TIMEOUT
HISTORY = 256  # recent waits the percentile is taken over
STACK_LIMIT = 40  # innermost frames shown per thread

#: Roles of chute's threads, by name prefix (threads not named here are "chute thread" or "not chute's").
THREAD_ROLES = (
    ("chute-loader", "loader thread: the stages on the workers (read, transform, ...)"),
    ("chute-device", "device stage: takes built batches, copies them to the device"),
    ("chute-stage", "a stage on a thread of its own"),
    ("chute-fetch", "downloader: fetches shards into the node cache ahead of use"),
)


@cache
def _stdlib() -> tuple[str, ...]:
    """The standard library's directories (computed on a stall's first report: ``sysconfig`` is not on a pass's path)."""
    import sysconfig

    return tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})


# --------------------------------------------------------------------------- the timeout rule


class WaitHistory:
    """The consumer's recent waits in ``next()`` (seconds), kept across passes.

    A ring of ``size`` values: the loop writes ``values[count % size]`` and
    increments ``count`` itself (no call per batch), or calls :meth:`add`.
    """

    __slots__ = ("values", "size", "count")

    def __init__(self, size: int = HISTORY) -> None:
        self.values = [0.0] * size
        self.size = size
        self.count = 0

    def add(self, seconds: float) -> None:
        self.values[self.count % self.size] = seconds
        self.count += 1

    def percentile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) of the recent waits, or None before any."""
        n = min(self.count, self.size)
        if not n:
            return None
        values = sorted(self.values[:n])
        return values[min(n - 1, int(q * n))]


class StallTimeout:
    """How long the consumer may wait for one batch before the watchdog reports.

    ``setting``: a number of seconds (every wait), ``"auto"`` (see the module
    docstring) or ``None`` (no watchdog).
    """

    def __init__(self, setting: float | str | None) -> None:
        if setting is None or setting == "auto":
            self.fixed: float | None = None
        else:
            try:
                self.fixed = float(setting)
            except (TypeError, ValueError):
                raise ValueError(f"the watchdog timeout must be a number of seconds, 'auto' or None, got {setting!r}") from None
            if not self.fixed > 0:
                raise ValueError(f"the watchdog timeout must be positive (or None to turn the watchdog off), got {setting!r}")
        self.enabled = setting is not None
        self.setting = setting

    def seconds(self, history: WaitHistory, first_of_pass: bool) -> float:
        """The timeout for the wait in progress."""
        if self.fixed is not None:
            return self.fixed
        if first_of_pass or history.count < WARMUP:
            return FIRST_TIMEOUT
        return max(FLOOR, FACTOR * (history.percentile(0.95) or 0.0))

    def describe(self) -> str:
        return "auto" if self.fixed is None else f"{self.fixed:g} s"


# --------------------------------------------------------------------------- what a report is made of


@dataclass
class Details:
    """What a probe knows about the stalled pipeline, for the report."""

    waiting_for: str  # e.g. "step 3 of epoch 0 (rank 0 of 1)"
    settings: str = ""  # e.g. "workers='threads', 2 thread(s), prefetch 4"
    sections: list[tuple[str, list[str]]] = field(default_factory=list)  # (title, lines)
    roles: dict[int, str] = field(default_factory=dict)  # thread ident -> role
    stuck: str = ""  # one line: where the batch the loop waits for is stuck


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: function, file, line, source text."""

    name: str
    file: str
    line: int
    text: str = ""

    def where(self) -> str:
        return f"{self.name} ({self.file}:{self.line})"


def stack_of(frame: Any, limit: int = STACK_LIMIT) -> list[Frame]:
    """The innermost ``limit`` frames from ``frame`` outwards, outermost first."""
    summary = traceback.extract_stack(frame, limit=limit)
    return [Frame(f.name, f.filename, f.lineno or 0, (f.line or "").strip()) for f in summary]


def format_stack(frames: list[Frame], indent: str = "    ") -> list[str]:
    """Traceback-style lines (most recent call last)."""
    lines = []
    for f in frames:
        lines.append(f'{indent}File "{f.file}", line {f.line}, in {f.name}')
        if f.text:
            lines.append(f"{indent}  {f.text}")
    return lines


def innermost_own_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame outside the standard library (user code, chute, a library)."""
    for f in reversed(frames):
        if not os.path.realpath(f.file).startswith(_stdlib()):
            return f
    return frames[-1] if frames else None


def thread_stacks(roles: dict[int, str], skip: set[int]) -> list[str]:
    """Report lines: every thread of this process but ``skip``, its role, its stack."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    lines: list[str] = []
    # chute's threads and the consumer first, then the others
    def key(ident: int) -> tuple[bool, str]:
        name = getattr(threads.get(ident), "name", "")
        return (ident not in roles and not name.startswith("chute"), name)

    order = sorted(frames, key=key)
    for ident in order:
        if ident in skip:
            continue
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"thread {ident:#x}"
        role = roles.get(ident) or _role(name)
        lines.append(f'  "{name}" ({role}):')
        lines.extend(format_stack(stack_of(frames[ident])))
    del frames
    return lines


def _role(name: str) -> str:
    for prefix, role in THREAD_ROLES:
        if name.startswith(prefix):
            return role
    return "chute thread" if name.startswith("chute") else "not chute's"


def reads_in_flight(now: float | None = None) -> list[str]:
    """Report lines: every read registered with ``chute.observe.inflight``, oldest first."""
    now = time.monotonic() if now is None else now
    return [f"  {read.describe(now)}" for read in inflight.snapshot()]


def build_report(details: Details, waited: float, timeout: float, rule: str, on_stall: str, skip: set[int]) -> str:
    """The full text of one stall report."""
    rule = f"{timeout:g} s" + (" (auto)" if rule == "auto" else "")
    lines = [
        f"chute: STALL: the training loop has waited {waited:.1f} s in next() for {details.waiting_for} "
        f"(watchdog timeout {rule}, on_stall={on_stall!r})",
    ]
    if details.settings:
        lines.append(f"Loader: {details.settings}")
    if details.stuck:
        lines.append(f"Stuck: {details.stuck}")
    reads = reads_in_flight()
    sections = [*details.sections[:1], ("Reads in flight", reads or ["  none"]), *details.sections[1:]]
    sections.append(("Threads of this process", thread_stacks(details.roles, skip)))
    for title, body in sections:
        lines.append("")
        lines.append(f"{title}:")
        lines.extend(body)
    lines.append("")
    lines.append(
        "What to do: the stacks above show where each thread and worker is. A read that never returns points at the "
        "storage or network; a frame in your transform points at the transform. If the loop is just slow, raise "
        "the timeout (Loader(watchdog=seconds)); chute.Watchdog(on_stall='raise') turns this report into a StallError."
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the loop's own watchdog


class StallWatch:
    """The hang watchdog of one pass, run by the training loop itself.

    The loop waits for each batch with a timeout (:meth:`timeout`); when a wait
    times out it calls :meth:`wait`, which writes the report and then keeps
    waiting (``on_stall="warn"``, reporting again every timeout) or raises
    :class:`chute.StallError` (``"raise"``). No thread of its own, and nothing
    to interrupt: a report is only ever made for the wait in progress, and
    costs nothing per batch beyond the wait's timeout argument.

    ``describe(run)`` returns the :class:`Details` of the stalled pass.
    """

    def __init__(
        self, setting: float | str, on_stall: str, history: WaitHistory, describe: Callable[[Any], Details],
        write: Callable[[str], None] | None = None,
    ) -> None:
        if on_stall not in ("warn", "raise"):
            raise ValueError(f"on_stall must be 'warn' or 'raise', got {on_stall!r}")
        self.rule, self.on_stall, self.history, self.describe = StallTimeout(setting), on_stall, history, describe
        self.reports = 0
        self._write = write or _to_stderr

    def timeout(self, first: bool) -> float:
        """Seconds the next wait may last before a report."""
        return self.rule.seconds(self.history, first_of_pass=first)

    def wait(self, run: Any, step: int, take: Callable[[int, float], Any], since_ns: int) -> Any:
        """The wait for ``step`` timed out: report, then keep waiting with ``take(step, timeout)`` or raise.

        ``run`` is opaque here: it is only handed to ``describe``, which the pipeline provides.
        """
        while True:
            waited = (time.perf_counter_ns() - since_ns) / 1e9
            timeout = self.timeout(first=step == 0)
            try:
                details = self.describe(run)
            except Exception as exc:  # the report must not die with the probe
                details = Details("the next batch", stuck=f"(the loader could not describe itself: {exc!r})")
            details.roles.setdefault(threading.get_ident(), "the training loop, waiting in next()")
            text = build_report(details, waited, timeout, self.rule.describe(), self.on_stall, set())
            self.reports += 1
            self._write(text)
            if log.hasHandlers():
                log.warning("%s", text.rstrip())
            if self.on_stall == "raise":
                headline = f"no batch for {waited:.1f} s (watchdog timeout {timeout:g} s) while waiting for {details.waiting_for}"
                if details.stuck:
                    headline += f"; stuck: {details.stuck}"
                raise StallError(f"{headline}. The full report was written to stderr and is in this exception's .report", text)
            try:
                return take(step, timeout)
            except TimeoutError:
                continue


    def building(self, run: Any) -> BuildWatch:
        """A :class:`BuildWatch` for ``run``, whose loop builds its batches itself (an inline pass)."""
        return BuildWatch(self, run, threading.get_ident())

    def report_building(self, run: Any, step: int, since_ns: int, loop: int) -> None:
        """The loop has been building ``step`` itself since ``since_ns``, past the timeout: write the report (warn only)."""
        waited = (time.perf_counter_ns() - since_ns) / 1e9
        try:
            details = self.describe(run)
        except Exception as exc:  # the report must not die with the probe
            details = Details("the next batch", stuck=f"(the loader could not describe itself: {exc!r})")
        details.roles[loop] = f"the training loop, building step {step} itself (an inline pass)"
        details.stuck = details.stuck or f"the training loop, building step {step} itself (an inline pass): see its stack below"
        text = build_report(details, waited, self.timeout(first=step == 0), self.rule.describe(), self.on_stall, set())
        self.reports += 1
        self._write(text)
        if log.hasHandlers():
            log.warning("%s", text.rstrip())


class BuildWatch:
    """The hang watchdog of a pass whose training loop builds its batches itself (inline: docs/observe.md, rule 7).

    The loop cannot time out its own work, so a daemon thread looks at it: the
    loop sets ``step`` and ``since`` (``perf_counter_ns``) before it builds a
    step and ``since = 0`` after (stores, no call); the thread wakes a few
    times per timeout and, when a build has lasted longer than the timeout,
    writes the report, again after each further timeout. It only warns: a
    thread cannot raise into a loop stuck in a read, so a pass with
    ``on_stall="raise"`` is never inline. Started at a pass's first inline
    build, stopped when the pass ends (:meth:`stop`).
    """

    def __init__(self, watch: StallWatch, run: Any, loop: int) -> None:
        self.step, self.since = -1, 0
        self._watch, self._run, self._loop = watch, run, loop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._look, name="chute-watchdog-inline", daemon=True)
        self._thread.start()

    def _look(self) -> None:
        reported = (0, 0)  # (the build, when it was last reported)
        while True:
            timeout = self._watch.timeout(first=self.step == 0)
            if self._stopped.wait(min(max(timeout / 4, 0.01), 1.0)):
                return
            since, step = self.since, self.step
            if not since:
                continue
            now = time.perf_counter_ns()
            last = reported[1] if reported[0] == since else since
            if (now - last) / 1e9 >= timeout:
                try:
                    self._watch.report_building(self._run, step, since, self._loop)
                except Exception:  # (a report that fails must not end the watch)
                    log.exception("chute: the hang watchdog could not report an inline build")
                reported = (since, now)

    def stop(self) -> None:
        """End the watch (the pass ended); the thread exits at once."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._run = None


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
