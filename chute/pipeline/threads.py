"""An ordered, bounded thread pool: tasks go in in order, results come out in order.

The unit of work is a whole batch (DESIGN.md decision 2), so the per-task cost
(a queue put, a future, a wake-up) is paid once per batch, not per sample.
Threads are daemons: a task stuck in a read cannot keep the interpreter from
exiting (``concurrent.futures`` joins its threads at exit and would hang).
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_STOP = object()


def _work(tasks: queue.SimpleQueue) -> None:
    while True:
        item = tasks.get()
        if item is _STOP:
            return
        future, fn, arg = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(arg)
        except BaseException as exc:  # delivered to the consumer, in order
            future.set_exception(exc)
        else:
            future.set_result(result)
        del item, future, arg  # do not keep the last batch alive while idle


class OrderedPool(Generic[T, R]):
    """Runs ``fn`` over items on ``threads`` daemon threads, at most ``depth`` ahead."""

    def __init__(self, fn: Callable[[T], R], threads: int, depth: int, name: str = "chute-worker") -> None:
        if threads < 1 or depth < 1:
            raise ValueError(f"threads and depth must be at least 1, got {threads} and {depth}")
        self.fn = fn
        self.depth = depth
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=_work, args=(self._tasks,), name=f"{name}-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()
        self._pending: collections.deque[Future] = collections.deque()
        self._closed = False

    def map(self, items: Iterable[T]) -> Iterator[R]:
        """Results of ``fn`` over ``items``, in order; an exception is raised at its item."""
        items = iter(items)
        exhausted = False
        while True:
            while not exhausted and len(self._pending) < self.depth:
                try:
                    item = next(items)
                except StopIteration:
                    exhausted = True
                    break
                future: Future = Future()
                self._pending.append(future)
                self._tasks.put((future, self.fn, item))
            if not self._pending:
                return
            yield self._pending.popleft().result()

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
        for thread in self._threads:
            thread.join(timeout)
        return [t for t in self._threads if t.is_alive()]

    def __enter__(self) -> OrderedPool[T, R]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
