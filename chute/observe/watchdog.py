"""The hang watchdog: when the training loop waits too long for a batch, say why.

MISSION.md section 1: a loader that hangs in what looks like a read must never
be silent. One daemon thread per iterating Loader pass sleeps on a deadline
(``threading.Event.wait(timeout)``; it wakes at most once per timeout, never
per batch) and, when the consumer has been blocked in ``next()`` for longer
than the stall timeout, writes a report to stderr and the ``"chute"`` logger:

- what the loop waits for (step, epoch, rank) and for how long;
- the batches in flight: their sample indices, which thread or worker process
  builds each one and for how long, and the exact sample when a thread is
  inside the user's transform;
- every read in flight (``chute.observe.inflight``): file or URL, byte range,
  seconds elapsed;
- queue depths (batches submitted, being built, prefetch);
- the Python stack of every thread of this process, named by role, and of
  every worker process (dumped by ``faulthandler`` in the worker on SIGUSR1,
  so it works even when the worker holds the GIL).

With ``on_stall="warn"`` (the default) it keeps waiting and reports again
after another timeout; with ``"raise"`` the consumer's wait is interrupted and
raises :class:`chute.errors.StallError` carrying the report as ``.report``.

The consumer side costs two ``time.monotonic()`` calls and a few attribute
stores per batch (:meth:`Watchdog.waiting`, :meth:`Watchdog.delivered`).

The timeout (``stall_timeout``): a number is used for every wait; ``"auto"``
(the default) allows :data:`FIRST_TIMEOUT` seconds for the first batch of a
pass (start-up, first downloads) and, once :data:`WARMUP` waits have been
seen, ``max(FLOOR, FACTOR x the 95th percentile of the last HISTORY waits)``;
``None`` turns the watchdog off.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chute.errors import StallError
from chute.observe import inflight

log = logging.getLogger("chute")

FIRST_TIMEOUT = 300.0  # seconds for the first batch of a pass with stall_timeout="auto"
FLOOR = 60.0  # the adaptive timeout is never shorter than this
FACTOR = 20.0  # ... and otherwise this many times the 95th percentile of recent waits
WARMUP = 8  # waits seen before the adaptive rule replaces FIRST_TIMEOUT
HISTORY = 256  # recent waits the percentile is taken over
STACK_LIMIT = 40  # innermost frames shown per thread

#: Roles of chute's threads, by name prefix (threads not named here are "chute thread" or "not chute's").
THREAD_ROLES = (
    ("chute-loader", "loader thread: gather, transform, collate"),
    ("chute-device", "device stage: takes built batches, copies them to the device"),
    ("chute-fetch", "downloader: fetches shards into the node cache ahead of use"),
    ("chute-watchdog", "hang watchdog"),
)

_STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})


# --------------------------------------------------------------------------- the timeout rule


class WaitHistory:
    """The consumer's recent waits in ``next()`` (seconds), kept across passes."""

    __slots__ = ("_waits", "count")

    def __init__(self, size: int = HISTORY) -> None:
        self._waits = [0.0] * size
        self.count = 0

    def add(self, seconds: float) -> None:
        self._waits[self.count % len(self._waits)] = seconds
        self.count += 1

    def percentile(self, q: float) -> float | None:
        """The ``q``-quantile (0..1) of the recent waits, or None before any."""
        n = min(self.count, len(self._waits))
        if not n:
            return None
        values = sorted(self._waits[:n])
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
                raise ValueError(f"stall_timeout must be a number of seconds, 'auto' or None, got {setting!r}") from None
            if not self.fixed > 0:
                raise ValueError(f"stall_timeout must be positive (or None to turn the watchdog off), got {setting!r}")
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


class Probe(Protocol):
    """The pipeline side of a watchdog (one per Loader pass: :class:`LoaderProbe`)."""

    def details(self) -> Details: ...

    def interrupt(self, exc: BaseException) -> bool:
        """Make the consumer's wait raise ``exc``; False if nothing could be interrupted."""
        ...


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
        if not os.path.realpath(f.file).startswith(_STDLIB):
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
        f"(stall_timeout {rule}, on_stall={on_stall!r})",
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
        "stall_timeout; on_stall='raise' turns this report into a StallError."
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the watchdog thread


class Watchdog:
    """Watches one pass: reports (or raises) when the consumer waits longer than the timeout.

    The consumer calls :meth:`waiting` when it asks for a batch and
    :meth:`delivered` when it has one; :meth:`start` and :meth:`stop` bracket
    the pass (``stop`` joins the thread).
    """

    def __init__(
        self,
        rule: StallTimeout,
        history: WaitHistory,
        on_stall: str,
        probe: Probe,
        name: str = "chute-watchdog",
        write: Callable[[str], None] | None = None,
    ) -> None:
        if on_stall not in ("warn", "raise"):
            raise ValueError(f"on_stall must be 'warn' or 'raise', got {on_stall!r}")
        self.rule, self.history, self.on_stall, self.probe = rule, history, on_stall, probe
        self.name = name
        self.reports = 0
        self._write = write or _to_stderr
        self._since = 0.0  # monotonic time the consumer started waiting; 0.0 while it is not
        self._delivered = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumer: int | None = None

    # consumer side (one thread)

    def waiting(self) -> None:
        """The consumer asks for the next batch."""
        self._since = time.monotonic()

    def delivered(self) -> None:
        """The consumer has its batch."""
        if self._delivered:  # the first wait of a pass (start-up) says nothing about later ones
            self.history.add(time.monotonic() - self._since)
        self._delivered += 1
        self._since = 0.0

    def start(self) -> None:
        """Start watching (call in the consumer's thread)."""
        self.consumer = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching and join the thread (bounded: a report being written may take a moment)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # watchdog side

    def _run(self) -> None:
        reported_at = 0.0
        while True:
            since = self._since
            timeout = self.rule.seconds(self.history, first_of_pass=self._delivered == 0)
            now = time.monotonic()
            if since:
                due = max(since, reported_at) + timeout  # after a report, the next one a timeout later
                if now >= due:
                    if self._report(now - since, timeout):
                        return  # the consumer was interrupted: this pass is over
                    reported_at = time.monotonic()
                    continue
                wait = due - now
            else:
                wait = timeout  # a wait that starts now is due no earlier than this
            if self._stop.wait(wait):
                return

    def _report(self, waited: float, timeout: float) -> bool:
        """Write one report; with on_stall='raise' interrupt the consumer. True if it was."""
        try:
            details = self.probe.details()
        except Exception as exc:  # the report must not die with the probe
            details = Details("the next batch", stuck=f"(the loader could not describe itself: {exc!r})")
        if self.consumer is not None:
            details.roles.setdefault(self.consumer, "the training loop, waiting in next()")
        skip = {threading.get_ident()}
        text = build_report(details, waited, timeout, self.rule.describe(), self.on_stall, skip)
        if self._stop.is_set() or not self._since:
            return False  # the batch arrived (or the pass ended) while the report was built
        self.reports += 1
        self._write(text)
        if log.hasHandlers():
            log.warning("%s", text.rstrip())
        if self.on_stall != "raise":
            return False
        headline = f"no batch for {waited:.1f} s (stall_timeout {timeout:g} s) while waiting for {details.waiting_for}"
        if details.stuck:
            headline += f"; stuck: {details.stuck}"
        exc = StallError(f"{headline}. The full report was written to stderr and is in this exception's .report", text)
        if self.probe.interrupt(exc):
            return True
        self._write("chute: could not interrupt the wait (no batch task to fail); still waiting\n")
        return False


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


# --------------------------------------------------------------------------- the Loader's probe


class LoaderProbe:
    """What a :class:`chute.Loader` pass looks like from outside, for the watchdog.

    Reads the pass state (``received``, the thread pool and its task's map of
    steps being built, or the process pool) without locks: the values are
    snapshots taken under the GIL, good enough for a report.
    """

    def __init__(self, loader: Any, state: Any) -> None:
        self.loader, self.state = loader, state

    @property
    def order(self) -> Any:
        order = getattr(self.state, "order", None)  # progressive mode: this epoch's order
        return order if order is not None else self.loader.order

    @property
    def dataset(self) -> Any:
        dataset = getattr(self.state, "dataset", None)
        return dataset if dataset is not None else self.loader.dataset

    def _indices(self, step: int) -> list[int]:
        loader, state = self.loader, self.state
        return self.order.batch(state.epoch, step, loader.rank, loader.world_size, state.start).tolist()

    def details(self) -> Details:
        loader, state = self.loader, self.state
        step = state.received
        total = self.order.num_batches(loader.world_size, state.start)
        waiting_for = f"batch {step} of {total} (epoch {state.epoch}, rank {loader.rank} of {loader.world_size})"
        unit = "thread(s)" if loader.workers == "threads" else "worker process(es)"
        pool = getattr(state, "pool", None)  # threads: the autotuner may have resized it
        threads = getattr(pool, "threads", loader.num_threads)
        settings = f"workers={loader.workers!r}, {threads} {unit}, prefetch {getattr(pool, 'depth', loader.prefetch)}"
        if loader.device is not None:
            settings += f", device={str(loader.device)!r}"
        details = Details(waiting_for, settings)
        if self.loader.workers == "processes":
            self._processes(details, step)
        else:
            self._threads(details, step)
        return details

    def _threads(self, details: Details, step: int) -> None:
        now = time.monotonic()
        task, pool = self.state.task, self.state.pool
        running = dict(task.running) if task is not None else {}
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        lines = []
        in_flight = pool.in_flight if pool is not None else 0
        submitted = range(step, step + in_flight + 1)  # the one waited for, then those queued behind it
        for s in sorted(set(running) | set(submitted)):
            indices = self._indices(s)
            if s in running:
                _, ident, since = running[s]
                where = f"building for {now - since:.1f} s in thread {names.get(ident, ident)!r}"
                frame = frames.get(ident)
                sample = _sample_in_transform(frame, loader_fns=self.loader.fns) if frame is not None else None
                if sample is not None:
                    where += f", inside the transform on {_describe_row(self.dataset, sample)}"
                details.roles[ident] = f"loader thread: gather, transform, collate; building batch {s}"
                if s == step:
                    own = innermost_own_frame(stack_of(frame)) if frame is not None else None
                    details.stuck = f"batch {s} is being built by thread {names.get(ident, ident)!r}"
                    if own is not None:
                        details.stuck += f" at {own.where()}"
                    if sample is not None:
                        details.stuck += f", on {_describe_row(self.dataset, sample)}"
                    thread_name = names.get(ident)
                    reads = [r for r in inflight.snapshot() if r.thread == thread_name]
                    if reads:
                        details.stuck += f"; its read in flight: {reads[0].describe(now)}"
            elif s == step:
                where = "not started (every loader thread is busy with other batches)"
                details.stuck = f"batch {s} has not started: every loader thread is busy"
            elif len(running) < getattr(pool, "threads", self.loader.num_threads):
                where = f"built, waiting behind batch {step}"  # a thread is idle: nothing is queued
            else:
                where = "built, or queued for a free thread"
            lines.append(f"  batch {s}: samples {_list(indices)}: {where}")
        lines.append(
            f"  queue: {len(submitted)} batch(es) submitted (prefetch {self.loader.prefetch}), "
            f"{len(running)} being built by {getattr(pool, 'threads', self.loader.num_threads)} thread(s)"
        )
        del frames
        details.sections.insert(0, ("Batches in flight", lines))

    def _processes(self, details: Details, step: int) -> None:
        pool = self.loader._processes
        lines: list[str] = []
        if pool is None:
            details.sections.insert(0, ("Batches in flight", ["  (the worker processes have not started)"]))
            return
        status = pool.status()
        stacks = pool.dump_stacks()
        worker_lines: list[str] = []
        for w in status:
            alive = ("alive" if w.ready else "alive, still starting: spawn, imports, dataset") if w.alive else f"exited with code {w.exitcode}"
            doing = f"building batch {w.steps[0]}" if w.steps else "idle"
            queued = f", then {_list(w.steps[1:])}" if len(w.steps) > 1 else ""
            worker_lines.append(f"  worker pid {w.pid} ({alive}): {doing}{queued}")
            dump = stacks.get(w.pid)
            if dump:
                worker_lines.extend("    " + line for line in dump.rstrip().splitlines())
            elif w.alive:
                worker_lines.append("    (no stack: the worker is still starting, or did not answer SIGUSR1 in time)")
            for s in w.steps[:1]:
                lines.append(f"  batch {s}: samples {_list(self._indices(s))}: building in worker pid {w.pid}")
                if s == step:
                    details.stuck = f"batch {s} is being built by worker process {w.pid}"
                    top = _innermost_dumped_frame(dump or "")
                    if top:
                        details.stuck += f" at {top}"
            for s in w.steps[1:]:
                lines.append(f"  batch {s}: samples {_list(self._indices(s))}: queued for worker pid {w.pid}")
        if not any(step in w.steps for w in status):
            lines.insert(0, f"  batch {step}: samples {_list(self._indices(step))}: not sent to a worker yet (no free ring slot)")
        lines.append(f"  queue: {sum(len(w.steps) for w in status)} batch(es) sent to workers, prefetch {self.loader.prefetch}")
        details.sections.insert(0, ("Batches in flight", lines))
        details.sections.append(("Worker processes (stacks dumped by faulthandler, most recent call first)", worker_lines))

    def interrupt(self, exc: BaseException) -> bool:
        if self.loader.workers == "processes":
            pool = self.loader._processes
            return pool.interrupt(exc) if pool is not None else False
        pool = self.state.pool
        return pool.interrupt(exc) if pool is not None else False


def _list(values: list[int], limit: int = 16) -> str:
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    return "[" + ", ".join(map(str, values[:limit])) + f", ... {len(values) - limit} more]"


def _describe_row(dataset: Any, index: int) -> str:
    try:
        shard, row = dataset.locate(index)
        return f"sample {index} (shard {dataset.shards[shard].file}, row {row})"
    except Exception:
        return f"sample {index}"


def _sample_in_transform(frame: Any, loader_fns: Any) -> int | None:
    """The sample index a thread's ``load_batch`` is running the transform on, if it is."""
    from chute.pipeline.batch import load_batch

    transform = getattr(loader_fns, "transform", None)
    if transform is None:
        return None
    code = getattr(transform, "__code__", None) or getattr(getattr(type(transform), "__call__", None), "__code__", None)
    callee = None
    while frame is not None:
        if frame.f_code is load_batch.__code__:
            if callee is None or callee.f_code is not code:
                return None  # in the gather, collate or batch_transform, not the transform
            try:
                index = frame.f_locals.get("index")
            except Exception:
                return None
            return int(index) if index is not None else None
        callee, frame = frame, frame.f_back
    return None


def _innermost_dumped_frame(dump: str) -> str:
    """``name (file:line)`` of the innermost frame outside the stdlib in a faulthandler dump."""
    for line in dump.splitlines():
        line = line.strip()
        if not line.startswith('File "'):
            continue
        try:
            file, rest = line[len('File "'):].split('", line ', 1)
            number, name = rest.split(" in ", 1)
        except ValueError:
            continue
        if not os.path.realpath(file).startswith(_STDLIB):
            return f"{name} ({file}:{number})"
    return ""
