"""A stage on a thread of its own: takes each step from upstream in order, runs the stage, hands it on.

    upstream (the workers' channel, or the relay before) ──► relay thread: stage.map(batch) ──► its channel ──► next relay, or the loop

One relay per ``where="thread"`` stage of a pass (the device copy is one).
Its channel has ``depth`` slots and is filled only once the consumer freed the
slot (``Channel.reserve``), so the stage runs at most ``depth`` batches ahead.
The relay measures its stage (busy while in ``map``, ``wait_in`` while waiting
for upstream, ``wait_out`` while waiting for room) into the stage's counter
and leaves a span per batch in the trace; it publishes the step it is on and
since when, for the hang watchdog. An exception (its stage's, or one that
came from upstream) travels to the loop at its step; closing the channel
ends the relay's loop.

The loop runs as a job on a thread the Loader keeps across its passes
(``chute.pipeline.kept``); :meth:`Relay.close` waits for the job to return.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from chute._channel import Channel, Closed, Failure
from chute._sched import CHECK_EVERY, Adaptive
from chute.observe.counters import nbytes_of
from chute.pipeline.transform import StageError

if TYPE_CHECKING:
    from chute.pipeline.kept import Kept


class Relay:
    """Runs ``stage`` on ``steps`` steps taken with ``take(step)`` from upstream, as a job on the thread ``kept``."""

    def __init__(self, stage: Any, take: Any, steps: int, kept: Kept, counters: Any = None, depth: int = 2) -> None:
        self.stage, self.steps, self.kept = stage, steps, kept
        self.thread = kept.thread
        self.name = kept.thread.name
        self._take = take
        self.channel = Channel(depth, reserve=True)
        self.take = self.channel.take  # the consumer's side: (step, timeout) -> (batch, rows, skipped)
        self.step = -1  # the step in the stage now (-1: none)
        self.waiting = -1  # the step it waits for from upstream (-1: none)
        self.since = 0  # perf_counter_ns when it started on ``step``
        self.counter = None if counters is None else counters.stage(stage.name, where="thread", gil=stage.gil)
        self._started = False

    def start(self) -> None:
        self._started = True
        self.kept.run(self._run)

    def _run(self) -> None:
        clock = time.perf_counter_ns
        channel, take, apply = self.channel, self._take, self.stage.map
        counter = self.counter
        cell = counter.cell() if counter is not None else None
        record = counter.record if counter is not None else None
        done = 0
        step = 0
        sched = Adaptive()  # batch class while the stage computes: woken by the loop, it never preempts it (chute._sched)
        tasks, tasks_ns = 0, 0
        try:
            while step < self.steps:
                if not channel.reserve(step):
                    return
                asked = clock()
                self.waiting = step
                batch, rows, skipped = take(step)
                self.waiting = -1
                got = clock()
                nbytes = 0
                if batch is not None:
                    self.since, self.step = got, step
                    if cell is not None:
                        nbytes = nbytes_of(batch)
                    try:
                        batch = apply(batch, None)
                    except Exception as exc:
                        if getattr(self.stage, "_builtin", False):
                            raise
                        raise StageError(
                            f"stage {self.stage.name!r} failed on batch {step} ({rows} samples): {type(exc).__name__}: {exc}"
                        ) from exc
                    self.step = -1
                end = clock()
                channel.put(step, (batch, rows, skipped))
                if cell is not None and record is not None:
                    cell.wait_in_ns += got - asked
                    if done:
                        cell.wait_out_ns += asked - done
                    record(got, end, rows, nbytes, step)
                done = end
                step += 1
                if sched.active:
                    tasks += 1
                    tasks_ns += end - got
                    if tasks == CHECK_EVERY:
                        sched.check(tasks_ns)
                        tasks, tasks_ns = 0, 0
        except Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - raised in the loop at this step
            channel.put(step, Failure(exc))
        finally:
            self.step = self.waiting = -1
            self.stage.close()

    def close(self, timeout: float = 5.0) -> bool:
        """End the relay's loop (its channel is closed: a wait upstream ends with the pass) and wait up to
        ``timeout`` seconds for it to return; True if it did (or never started)."""
        self.channel.close()
        return not self._started or self.kept.wait(timeout)
