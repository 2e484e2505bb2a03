"""The one protocol of every stage of a pass, chute's and a user's: ``next``, ``reset(state)``, ``state``, ``close``.

The shape of torchdata.nodes: a stage pulls batches from the stage before it
(its ``source``) and hands them on one at a time, can say where its consumer
is (:meth:`Stage.state`) and start again from such a place
(:meth:`Stage.reset`). Every stage also says **where it runs** when a Loader
runs it (:attr:`Stage.where`) and whether its work **holds the GIL**
(:attr:`Stage.gil`, what the autotuner starts from):

``"workers"``
    on the pass's workers (threads, or worker processes with
    ``workers="processes"``), in parallel, any number of batches at once:
    consecutive worker stages are fused into one task per batch, so a batch
    crosses between threads once. Only a :class:`BatchStage` (a function of
    one batch, no state of its own) can run there.
``"thread"``
    on a thread of its own, in order, a couple of batches ahead of the loop
    (the device copy does this).
``"loop"``
    in the training loop's thread, in order, as the loop asks for the batch.

A :class:`BatchStage` is a function of one batch (``fn(batch) -> batch``, or a
subclass's :meth:`BatchStage.map`); its state is its source's. A stage that
keeps state of its own (micro-batches, a running statistic) subclasses
:class:`Stage` and runs in the loop. ``chute.Loader(ds, ..., stages=[...])``
runs a list of stages inside its pass, measured like its own (a row of
``loader.report()`` each); outside a Loader, a stage pulls from its ``source``
(a Loader is a stage too) in the caller's thread.

**A pass per ``for``.** ``iter(stage)`` starts a new pass (:meth:`Stage.reset`)
unless the stage was just reset and has handed nothing on since, so
``stage.reset(saved)`` followed by a ``for`` resumes from ``saved``, and a
second ``for`` gives a whole new pass. A subclass's ``reset`` calls
``super().reset(state)`` (as torchdata's nodes do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: Where a stage may run in a Loader's pass (see the module docstring).
WHERE = ("workers", "thread", "loop")


class Stage:
    """A step of a pass that hands on batches one at a time and can say, and restore, where it is.

    Subclasses implement :meth:`next`, :meth:`reset` (calling
    ``super().reset(state)``), :meth:`state`, and :meth:`close` if they start
    anything. ``name`` is the stage's row in ``loader.report()``.
    """

    name: str = "stage"
    where: str = "loop"
    gil: bool = True  # whether its work holds the GIL (Python code): the autotuner's input
    source: Any = None  # the stage it pulls from (set by its constructor, or by the Loader that runs it)
    _armed: bool = False  # reset and nothing handed on since: the next ``iter()`` does not reset again

    def next(self) -> Any:
        """The next batch; ``StopIteration`` at the end of the pass."""
        raise NotImplementedError(f"{type(self).__name__} must define next()")

    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Start a pass: from ``state`` (one :meth:`state` returned) if given, else from where the stages before are."""
        self._armed = True

    def state(self) -> dict[str, Any]:
        """Where the consumer is: ``reset(state())`` goes on with the batch after the last one handed on."""
        raise NotImplementedError(f"{type(self).__name__} must define state()")

    def length(self, batches: int) -> int:
        """The batches this stage hands on in a pass whose source hands on ``batches`` (``len(loader)`` asks it).

        A stage that keeps state of its own may split a batch into several
        (micro-batches) or merge some, so this one cannot know: TypeError,
        naming the stage. A subclass that knows says so (``return batches``
        for one batch out per batch in, ``return batches * 4`` for quarters).
        """
        raise TypeError(
            f"len() is not known through stage {self.name!r} ({type(self).__name__}): a chute.Stage of one's own may hand "
            "on any number of batches per batch it takes; define length(self, batches) on it to say how many"
        )

    def close(self) -> None:
        """Stop what this stage started (threads, a Loader's pass); the stages before it too."""
        if self.source is not None:
            self.source.close()

    def __iter__(self) -> Iterator[Any]:
        if not self._armed:
            self.reset()
        return self

    def __next__(self) -> Any:
        self._armed = False
        return self.next()

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, where={self.where!r})"


class BatchStage(Stage):
    """``fn(batch) -> batch`` for every batch, as a stage (``chute.BatchStage``).

    Args:
        fn: a function of a whole batch (None in a subclass that overrides :meth:`map`).
        name: its row in ``loader.report()`` (default: the function's name).
        where: ``"workers"`` (default: on the Loader's workers, in parallel),
            ``"thread"`` (a thread of its own, in order) or ``"loop"`` (the
            training loop's thread). With ``workers="processes"`` a workers
            stage runs in the worker processes: ``fn`` must then be a
            module-level function.
        gil: False if ``fn``'s work runs without the GIL (native code that
            releases it): the autotuner then starts at one thread per CPU.
        source: the stage it pulls from when used outside a Loader.

    It keeps no state of its own: its state is its source's, so a resume is
    exact wherever it runs. A subclass overrides ``map(batch, ctx)``, where
    ``ctx`` is the batch's :class:`chute.pipeline.transform.BatchContext` on
    the workers (its dataset rows, epoch and seed, ``ctx.take`` for output
    memory, ``ctx.random`` for randomness that survives a resume) and None
    elsewhere.
    """

    def __init__(
        self, fn: Callable[[Any], Any] | None = None, *, name: str | None = None, where: str = "workers",
        gil: bool = True, source: Stage | None = None,
    ) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(f"BatchStage takes a function of a batch, got {type(fn).__name__} {fn!r}")
        if fn is None and type(self).map is BatchStage.map:
            raise TypeError("BatchStage needs a function of a batch (or a subclass that defines map(batch, ctx))")
        if where not in WHERE:
            raise ValueError(f"where must be one of {', '.join(map(repr, WHERE))}, got {where!r}")
        self.fn = fn
        self.name = str(name) if name is not None else _name_of(fn if fn is not None else self)
        self.where = where
        self.gil = bool(gil)
        self.source = source

    def map(self, batch: Any, ctx: Any) -> Any:
        """The batch after this stage (``ctx``: see the class docstring)."""
        fn: Any = self.fn
        return fn(batch)

    def next(self) -> Any:
        if self.source is None:
            raise TypeError(f"stage {self.name!r} has no source: pass source= (a chute.Loader or another stage), or run it in chute.Loader(stages=[...])")
        return self.map(self.source.next(), None)

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        if self.source is not None:
            self.source.reset(state)

    def state(self) -> dict[str, Any]:
        if self.source is None:
            return {}
        return self.source.state()

    def length(self, batches: int) -> int:
        return batches  # one batch out per batch in

    def __repr__(self) -> str:
        return f"BatchStage({_name_of(self.fn) if self.fn is not None else type(self).__name__}, name={self.name!r}, where={self.where!r})"


def _name_of(fn: Any) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "stage" if name == "<lambda>" else name


def batch_stages(stages: Any) -> list[Stage]:
    """``stages=`` as given to a Loader: a list of :class:`Stage`, checked (each error says what to pass)."""
    if stages is None:
        return []
    if isinstance(stages, Stage) or callable(stages):
        stages = [stages]
    out: list[Stage] = []
    for stage in stages:
        if not isinstance(stage, Stage):
            raise TypeError(
                f"stages= takes chute.Stage objects, got {type(stage).__name__} {stage!r}; "
                "wrap a function of a batch as chute.BatchStage(fn, name=..., where='workers')"
            )
        if stage.where not in WHERE:
            raise ValueError(f"stage {stage.name!r}: where must be one of {', '.join(map(repr, WHERE))}, got {stage.where!r}")
        if stage.where != "loop" and not isinstance(stage, BatchStage):
            raise ValueError(
                f"stage {stage.name!r} keeps state of its own (a chute.Stage that is not a BatchStage), so it runs in order in "
                f"the loop: give it where='loop', not {stage.where!r}"
            )
        if any(s is stage for s in out):
            raise ValueError(f"stage {stage.name!r} is given twice: a stage runs once per batch")
        out.append(stage)
    return out


# ---------------------------------------------------------------------------- deprecated (CHANGELOG.md, 0.1 -> 0.2)


class _LoaderStage(Stage):
    """Deprecated: a Loader is a stage itself. The batches of ``loader``, one pass per :meth:`reset`."""

    name = "loader"

    def __init__(self, loader: Any) -> None:
        self.loader = self.source = loader

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        self.loader.reset(state)

    def next(self) -> Any:
        return self.loader.next()

    def state(self) -> dict[str, Any]:
        return self.loader.state_dict()


class _Map(Stage):
    """Deprecated: ``chute.BatchStage(fn)`` in ``chute.Loader(stages=[...])`` runs on the Loader's workers.

    ``fn(batch)`` for every batch of ``source`` on ``threads`` threads of its
    own, in order, ``ahead`` batches ahead; its state is its source's right
    after the batch it last handed on, so a resume recomputes what was ahead.
    """

    name = "map"

    def __init__(self, source: Stage, fn: Callable[[Any], Any], *, threads: int = 2, ahead: int | None = None) -> None:
        import collections
        import concurrent.futures

        if threads < 1:
            raise ValueError(f"Map needs at least one thread, got threads={threads}")
        self.source, self.fn = source, fn
        self.ahead = ahead if ahead is not None else 2 * threads
        if self.ahead < 1:
            raise ValueError(f"Map needs at least one batch ahead, got ahead={self.ahead}")
        self._futures = concurrent.futures
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="chute-map")
        self._pending: collections.deque[tuple[Any, dict[str, Any]]] = collections.deque()
        self._state: dict[str, Any] | None = None
        self._drained = False

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
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
                self._futures.wait([future])


_DEPRECATED = {
    "LoaderStage": (_LoaderStage, "a chute.Loader is a stage itself: pull from it, or pass it as source="),
    "Map": (_Map, "use chute.BatchStage(fn, where='workers') in chute.Loader(stages=[...]) (on the Loader's workers, "
                  "measured), or chute.BatchStage(fn, source=...) after it"),
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        cls, instead = _DEPRECATED[name]
        warnings.warn(
            f"chute.pipeline.stage.{name} is deprecated since chute 0.1 and will be removed in chute 0.2; {instead}",
            FutureWarning, stacklevel=2,
        )
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
