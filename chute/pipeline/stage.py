"""One protocol for a stage after the loader: ``next()``, ``reset(state)``, ``state()``.

The shape of torchdata.nodes: a stage pulls items from the stage before it
and hands them on one at a time, and can say where the consumer is
(:meth:`Stage.state`) and start again from such a place (:meth:`Stage.reset`),
so a pipeline of stages resumes exactly like the Loader it starts from.

* :class:`LoaderStage` is the root: a :class:`chute.Loader`'s batches, its
  ``state_dict`` as the state.
* :class:`Map` runs a function of a whole batch in its own thread pool, in
  order, a few batches ahead; its state is the state of the stage before it as
  it was right after the batch last handed on, so batches computed ahead and
  not yet delivered are computed again after a resume, never skipped.

A stage of one's own subclasses :class:`Stage` (see ``chute/pipeline/README.md``
for a worked example). The unit is a batch: the Loader's per-batch path stays
a handful of Python calls, and a stage adds its own calls per batch, never per
sample.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
from collections.abc import Callable
from typing import Any


class Stage(abc.ABC):
    """A step of the pipeline that hands on items one at a time and can say, and restore, where it is."""

    def __iter__(self) -> Stage:
        return self

    def __next__(self) -> Any:
        return self.next()

    @abc.abstractmethod
    def next(self) -> Any:
        """The next item; ``StopIteration`` at the end of the pass."""

    @abc.abstractmethod
    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Start a pass: from ``state`` (one :meth:`state` returned) if given, else from where the stages before are."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """Where the consumer is: ``reset(state())`` goes on with the item after the last one handed on."""

    def close(self) -> None:  # noqa: B027 (a stage that started nothing has nothing to stop)
        """Stop what this stage started (threads, the loader's pass); the stages before it too."""

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LoaderStage(Stage):
    """The root stage: the batches of ``loader``, one pass per :meth:`reset`."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._batches: Any = None

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self._end_pass()
        if state is not None:
            self.loader.load_state_dict(state)
        self._batches = iter(self.loader)

    def next(self) -> Any:
        if self._batches is None:
            self.reset()
        return next(self._batches)

    def state(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def close(self) -> None:
        self._end_pass()

    def _end_pass(self) -> None:
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()


class Map(Stage):
    """``fn(batch)`` for every batch of ``source``, on ``threads`` threads of its own, delivered in order.

    Up to ``ahead`` batches (default: two per thread) are being computed at
    once. An exception raised by ``fn`` is raised by :meth:`next` at that
    batch. The threads are named ``chute-map_<n>`` and stop at :meth:`close`.
    """

    def __init__(self, source: Stage, fn: Callable[[Any], Any], *, threads: int = 2, ahead: int | None = None) -> None:
        if threads < 1:
            raise ValueError(f"Map needs at least one thread, got threads={threads}")
        self.source, self.fn = source, fn
        self.ahead = ahead if ahead is not None else 2 * threads
        if self.ahead < 1:
            raise ValueError(f"Map needs at least one batch ahead, got ahead={self.ahead}")
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="chute-map")
        self._pending: collections.deque[tuple[concurrent.futures.Future, dict[str, Any]]] = collections.deque()
        self._state: dict[str, Any] | None = None  # the source's state right after the batch last handed on
        self._drained = False

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self._drop_pending()
        self.source.reset(state)
        self._state, self._drained = None, False

    def next(self) -> Any:
        while not self._drained and len(self._pending) < self.ahead:
            try:
                batch = self.source.next()
            except StopIteration:
                self._drained = True
                break
            self._pending.append((self._pool.submit(self.fn, batch), self.source.state()))
        if not self._pending:
            raise StopIteration
        future, state = self._pending.popleft()
        result = future.result()
        self._state = state
        return result

    def state(self) -> dict[str, Any]:
        return self._state if self._state is not None else self.source.state()

    def close(self) -> None:
        self._drop_pending()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.source.close()

    def _drop_pending(self) -> None:
        while self._pending:
            future, _ = self._pending.popleft()
            if not future.cancel():
                concurrent.futures.wait([future])
