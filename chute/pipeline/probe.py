"""What a Loader pass is doing, told by the pass itself, for the hang watchdog's report.

The watchdog (``chute.observe.watchdog``) knows nothing of a pass: when a wait
times out it calls the ``describe`` function the Loader gave it, which is
:func:`describe` here. It reads what the runtime publishes (the step the loop
waits for; what each worker builds, since when and in which stage; the
position of the sample each worker transforms; the step each stage on a
thread of its own is on) and the worker processes' status and stacks, so a
stage of the user's is named as chute's are.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from chute.observe import inflight
from chute.observe.watchdog import Details, _stdlib, innermost_own_frame, stack_of


def describe(loader: Any, run: Any) -> Details:
    """The :class:`Details` of ``run``, a pass of ``loader``, for a stall report."""
    return LoaderProbe(loader, run).details()


class LoaderProbe:
    """What a Loader pass is doing, from what it publishes (``chute.pipeline.run.Pass``), for the report.

    Reads the pass without locks: the values are snapshots taken under the
    GIL, good enough for a report.
    """

    def __init__(self, loader: Any, run: Any) -> None:
        self.loader, self.run = loader, run

    def _indices(self, step: int) -> list[int]:
        return self.run.rows_of(step)

    def details(self) -> Details:
        loader, run = self.loader, self.run
        step = run.received
        waiting_for = f"batch {step} of {run.steps} (epoch {run.epoch}, rank {run.rank} of {run.world_size})"
        executor = run.executor
        kind = loader.workers.kind
        unit = "thread(s)" if kind == "threads" else "worker process(es)"
        threads = getattr(executor, "threads", loader.num_threads)
        settings = f"workers={kind!r}, {threads} {unit}, prefetch {getattr(executor, 'depth', loader.prefetch)}"
        if loader.device is not None:
            settings += f", device={str(loader.device)!r}"
        details = Details(waiting_for, settings)
        feed = run.feed
        at_workers = feed.taken if feed is not None and run.relays else step  # steps before it are past the workers
        if at_workers < run.steps:
            if kind == "processes":
                self._processes(details, at_workers)
            else:
                self._threads(details, at_workers)
        if run.relays:
            self._relays(details, step)  # (a stage that holds the loop's batch is where it is stuck)
        return details

    def _relays(self, details: Details, step: int) -> None:
        """The stages on threads of their own (the device copy, a user's): the batch each is on, since when."""
        now = time.perf_counter_ns()
        frames = sys._current_frames()
        lines = []
        for relay in self.run.relays:
            ident = relay.thread.ident
            name = relay.stage.name
            if relay.step >= 0:
                doing = f"batch {relay.step} in the stage for {(now - relay.since) / 1e9:.1f} s"
                if relay.step == step:
                    frame = frames.get(ident) if ident is not None else None
                    own = innermost_own_frame(stack_of(frame)) if frame is not None else None
                    details.stuck = f"batch {step} is in stage {name!r} on thread {relay.thread.name!r}" + (
                        f" at {own.where()}" if own is not None else "")
            elif relay.waiting >= 0:
                doing = f"waiting for batch {relay.waiting} from the stage before"
            else:
                doing = "idle: the batches it handed on are not taken yet"
            if ident is not None:
                details.roles[ident] = f"stage {name!r} on a thread of its own"
            lines.append(f"  stage {name!r} (thread {relay.thread.name!r}): {doing}")
        del frames
        details.sections.append(("Stages on threads of their own", lines))

    def _threads(self, details: Details, step: int) -> None:
        run, task = self.run, self.run.task
        now = time.perf_counter_ns()
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        building = {}
        if task is not None:
            for w, s in enumerate(list(task.building)):
                if s >= 0:
                    building[s] = w
        submitted = max(run.submitted, step + 1)
        lines = []
        for s in sorted(set(building) | set(range(step, min(submitted, run.steps)))):
            indices = self._indices(s)
            if s in building:
                w = building[s]
                ident = task.threads[w]
                since, name = task.doing(w)
                stage = f" in stage {name!r}" if name else ""
                where = f"building for {(now - since) / 1e9:.1f} s in thread {names.get(ident, ident)!r}{stage}"
                position = task.progress[w]
                sample = indices[position] if 0 <= position < len(indices) else None
                if sample is not None:
                    where += f", inside the transform on {run.describe(sample)}"
                details.roles[ident] = f"loader thread: the stages on the workers; building batch {s}"
                if s == step:
                    frame = frames.get(ident)
                    own = innermost_own_frame(stack_of(frame)) if frame is not None else None
                    details.stuck = f"batch {s} is being built by thread {names.get(ident, ident)!r}{stage}"
                    if own is not None:
                        details.stuck += f" at {own.where()}"
                    if sample is not None:
                        details.stuck += f", on {run.describe(sample)}"
                    reads = [r for r in inflight.snapshot() if r.thread == names.get(ident)]
                    if reads:
                        details.stuck += f"; its read in flight: {reads[0].describe(time.monotonic())}"
            elif s == step:
                where = "not started (every loader thread is busy with other batches)"
                details.stuck = f"batch {s} has not started: every loader thread is busy"
            elif s < submitted:
                where = "built, waiting behind batch " + str(step) if len(building) < getattr(run.executor, "threads", 1) else "built, or queued for a free thread"
            else:
                where = "not submitted yet"
            lines.append(f"  batch {s}: samples {_list(indices)}: {where}")
        depth = getattr(run.executor, "depth", self.loader.prefetch)
        lines.append(
            f"  queue: {max(0, submitted - step)} batch(es) submitted (prefetch {depth}), "
            f"{len(building)} being built by {getattr(run.executor, 'threads', self.loader.num_threads)} thread(s)"
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
            if step in pool.waiting_for_shards():
                why = "waiting until the downloader holds its shards"
                details.stuck = f"batch {step} waits for the downloader: its shards are not held yet"
            else:
                why = "no free ring slot"
            lines.insert(0, f"  batch {step}: samples {_list(self._indices(step))}: not sent to a worker yet ({why})")
        lines.append(f"  queue: {sum(len(w.steps) for w in status)} batch(es) sent to workers, prefetch {self.loader.prefetch}")
        details.sections.insert(0, ("Batches in flight", lines))
        details.sections.append(("Worker processes (stacks dumped by faulthandler, most recent call first)", worker_lines))


def _list(values: list[int], limit: int = 16) -> str:
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    return "[" + ", ".join(map(str, values[:limit])) + f", ... {len(values) - limit} more]"


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
        if not os.path.realpath(file).startswith(_stdlib()):
            return f"{name} ({file}:{number})"
    return ""
