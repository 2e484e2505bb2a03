"""An ordered, bounded thread pool: tasks go in in order, results come out in order.

The unit of work is a whole batch (DESIGN.md decision 2), so the per-task cost
(a queue put, a future, a wake-up) is paid once per batch, not per sample.
Threads are daemons: a task stuck in a read cannot keep the interpreter from
exiting (``concurrent.futures`` joins its threads at exit and would hang).

The autotuner changes the pool while it runs: ``resize`` starts threads or
retires some (a retired thread finishes its current task, then exits), and
``depth`` (results in flight ahead of the consumer) may be set at any time.
With a ``stage`` (``chute.observe.counters.Stage``) each thread counts its time
in tasks (busy) and waiting for one (``wait_out``: idle because the consumer
has not taken results, so no task was submitted).
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from chute.observe.counters import Stage

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()  # every thread exits
_RETIRE = object()  # the one thread that takes it exits

#: Every how many results the consumer counts the finished ones waiting (for ``min_ready``).
_READY_EVERY = 4


def _work(tasks: queue.SimpleQueue, stage: Stage | None) -> None:
    clock = time.perf_counter_ns
    cell = stage.cell() if stage is not None else None
    while True:
        if cell is None:
            item = tasks.get()
        else:
            idle = clock()
            item = tasks.get()
            start = clock()
            cell.wait_out_ns += start - idle
        if item is _STOP or item is _RETIRE:
            return
        future, fn, arg = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(arg)
        except BaseException as exc:  # delivered to the consumer, in order
            try:
                future.set_exception(exc)
            except InvalidStateError:  # already failed by interrupt()
                pass
        else:
            try:
                future.set_result(result)
            except InvalidStateError:
                pass
        if cell is not None:
            cell.busy_ns += clock() - start
            cell.items += 1
        del item, future, arg  # do not keep the last batch alive while idle
        result = None


class OrderedPool(Generic[T, R]):
    """Runs ``fn`` over items on ``threads`` daemon threads, at most ``depth`` ahead."""

    def __init__(
        self, fn: Callable[[T], R], threads: int, depth: int, name: str = "chute-worker", stage: Stage | None = None
    ) -> None:
        if threads < 1 or depth < 1:
            raise ValueError(f"threads and depth must be at least 1, got {threads} and {depth}")
        self.fn = fn
        self.depth = depth
        self.name = name
        self._stage = stage
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._numbers = itertools.count()
        self._threads: list[threading.Thread] = []  # running, not retired
        self._retired: list[threading.Thread] = []  # told to exit, maybe still finishing a task
        self._pending: collections.deque[Future] = collections.deque()
        self._closed = False
        self._waiting: Future | None = None  # the result the consumer is waiting for
        self._taken = 0
        self._min_ready: int | None = None
        self.resize(threads)

    @property
    def threads(self) -> int:
        """Threads taking tasks (retired ones not counted)."""
        return len(self._threads)

    def resize(self, threads: int) -> None:
        """Run ``threads`` threads from now on: start new ones, or retire the newest ones.

        A retired thread exits after the task it is running (tasks are never
        interrupted); ``close`` joins it.
        """
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        if self._closed:
            return
        while len(self._threads) < threads:
            thread = threading.Thread(
                target=_work, args=(self._tasks, self._stage), name=f"{self.name}-{next(self._numbers)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        while len(self._threads) > threads:
            self._retired.append(self._threads.pop())
            self._tasks.put(_RETIRE)
        self._retired = [t for t in self._retired if t.is_alive()]
        if self._stage is not None:
            self._stage.workers = len(self._threads)

    def map(self, items: Iterable[T]) -> Iterator[R]:
        """Results of ``fn`` over ``items``, in order; an exception is raised at its item."""
        items = iter(items)
        exhausted = False
        pending = self._pending
        while True:
            while not exhausted and len(pending) < self.depth:
                try:
                    item = next(items)
                except StopIteration:
                    exhausted = True
                    break
                future: Future = Future()
                pending.append(future)
                self._tasks.put((future, self.fn, item))
            if not pending:
                return
            self._taken += 1
            if self._taken % _READY_EVERY == 0:
                self._count_ready()
            yield self._take()

    def _take(self) -> R:
        """Wait for the result at the head (interrupt() can fail that wait)."""
        future = self._waiting = self._pending.popleft()
        try:
            return future.result()
        finally:
            self._waiting = None

    def interrupt(self, exc: BaseException) -> bool:
        """Make the consumer's current wait for a result raise ``exc`` (the hang watchdog's ``on_stall="raise"``).

        The task itself cannot be stopped: its thread stays busy until it
        returns, and its result is dropped. False if the consumer is not waiting.
        """
        future = self._waiting
        if future is None:
            return False
        try:
            future.set_exception(exc)
        except InvalidStateError:  # it finished meanwhile
            return False
        return True

    def _count_ready(self) -> None:
        """Note how many finished results wait at the front of the queue (the head included)."""
        ready = 0
        for future in self._pending:
            if not future.done():
                break
            ready += 1
        if self._min_ready is None or ready < self._min_ready:
            self._min_ready = ready

    def take_min_ready(self) -> int | None:
        """The fewest finished results seen waiting when the consumer took one, since the last call.

        0 means the consumer had to wait at least once; ``depth`` means the
        queue never drained. ``None`` if not sampled since.
        """
        value, self._min_ready = self._min_ready, None
        return value

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self, timeout: float = 5.0) -> list[threading.Thread]:
        """Cancel queued tasks and stop the threads; return those still busy after ``timeout``."""
        if self._closed:
            return []
        self._closed = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        for _ in self._threads:
            self._tasks.put(_STOP)
        deadline = time.monotonic() + timeout
        everyone = self._threads + self._retired
        for thread in everyone:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in everyone if t.is_alive()]

    def __enter__(self) -> OrderedPool[T, R]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
