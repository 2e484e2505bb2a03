"""The thread executor: fused tasks (``chute.pipeline.task``) on worker threads, results into the pass's channel.

The consumer submits steps (``submit``) at most ``depth`` ahead of what it has
taken; each worker takes the next step from a queue, runs the batch task and
puts the result into the step's slot of the :class:`Channel` (an exception
goes in as a ``Failure``, re-raised by the consumer at that step). Per batch
that is one queue get and one lock release on the worker's side, one queue
put on the consumer's: no ``Future``, no Python-level synchronisation.

Threads are daemons: a task stuck in a read cannot keep the interpreter from
exiting. The autotuner changes the executor while it runs: ``resize`` starts
threads or retires some (a retired thread finishes its task, then exits) and
``depth`` may change at any time (up to the channel's slots). Each thread
counts its time in tasks (``workers`` stage busy) and waiting for one
(``wait_out``: the consumer had not taken results, so no step was submitted).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from chute._channel import Channel, Failure

if TYPE_CHECKING:
    from chute.observe.counters import StageCounter
    from chute.pipeline.task import Task

_STOP = -1  # every thread exits
_RETIRE = -2  # the one thread that takes it exits


def _work(tasks: queue.SimpleQueue, task: Task, channel: Channel, stage: StageCounter | None) -> None:
    clock = time.perf_counter_ns
    get, put = tasks.get, channel.put
    w = task.register(threading.get_ident())
    cell = stage.cell() if stage is not None else None
    item: Any  # a batch, or the Failure delivered in its place
    idle = clock()
    while True:
        step = get()
        if step < 0:
            return
        start = clock()
        try:
            item, end = task(step, start, w)
        except BaseException as exc:  # delivered to the consumer at its step
            item, end = Failure(exc), clock()
        put(step, item)
        item = None  # do not keep the last batch alive while idle
        if cell is not None:
            cell.wait_out_ns += start - idle
            cell.busy_ns += end - start
            cell.items += 1
            idle = end


class ThreadExecutor:
    """Runs ``task`` for submitted steps on ``threads`` daemon threads, results into ``channel``."""

    def __init__(
        self, task: Task, channel: Channel, threads: int, depth: int, name: str = "chute-loader", stage: StageCounter | None = None
    ) -> None:
        if threads < 1 or depth < 1:
            raise ValueError(f"threads and depth must be at least 1, got {threads} and {depth}")
        self.task, self.channel, self.name = task, channel, name
        self.depth = min(depth, channel.slots)
        self._stage = stage
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.submit = self._tasks.put  # the consumer's one call per batch
        self._numbers = itertools.count()
        self._threads: list[threading.Thread] = []  # running, not retired
        self._retired: list[threading.Thread] = []  # told to exit, maybe still finishing a task
        self._closed = False
        self.resize(threads)

    @property
    def threads(self) -> int:
        """Threads taking tasks (retired ones not counted)."""
        return len(self._threads)

    def resize(self, threads: int) -> None:
        """Run ``threads`` threads from now on: start new ones, or retire the newest ones."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if self._closed:
            return
        while len(self._threads) < threads:
            thread = threading.Thread(
                target=_work, args=(self._tasks, self.task, self.channel, self._stage),
                name=f"{self.name}-{next(self._numbers)}", daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        while len(self._threads) > threads:
            self._retired.append(self._threads.pop())
            self._tasks.put(_RETIRE)
        self._retired = [t for t in self._retired if t.is_alive()]
        if self._stage is not None:
            self._stage.workers = len(self._threads)

    def set_depth(self, depth: int) -> None:
        self.depth = max(1, min(depth, self.channel.slots))

    def close(self, timeout: float = 5.0, broken: bool = False) -> list[threading.Thread]:
        """Stop the threads once their current task is done; return those still busy after ``timeout``.

        Steps submitted and not started are not run (their results would be dropped).
        ``broken`` (a stalled pass) changes nothing for threads: one stuck in a
        task cannot be stopped, and is left behind as a daemon.
        """
        if self._closed:
            return []
        self._closed = True
        while True:  # drop what is queued, so every thread sees its stop at once
            try:
                self._tasks.get_nowait()
            except queue.Empty:
                break
        everyone = self._threads + [t for t in self._retired if t.is_alive()]
        for _ in everyone:  # (a retired thread's own sentinel may have been drained above)
            self._tasks.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in everyone:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in everyone if t.is_alive()]
