"""``chute.observe(iterable)``: is an existing pipeline data-bound? Measured from the loop's side.

Wraps any iterable of batches (a torch ``DataLoader``, a generator, a chute
Loader) without changing what it yields, and measures the time the training
loop spends blocked in ``next()`` (waiting for data) against the time between
``next()`` calls (its own compute)::

    loader = chute.observe(torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4))
    for epoch in range(3):
        for batch in loader:
            train_step(batch)
        print(loader.report())     # "waiting for data: 63% of the loop's time ..."

It cannot see inside the pipeline, so the report has no stages and names no
stage; use a chute Loader's own ``report()`` for that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chute.observe.counters import Consumer, ConsumerTotals
from chute.observe.report import Context, Report, build_consumer_only


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (dicts, lists, tuples searched), else 1.

    A dict's value that is a list is the column of a variable-size field, one entry per sample (a ragged
    column: its first tensor is the first sample's, whose length is no count of samples): its length counts."""
    import torch

    todo = [batch]
    while todo:
        item = todo.pop(0)
        if isinstance(item, torch.Tensor):
            return int(item.shape[0]) if item.dim() else 1
        if isinstance(item, dict):
            for value in item.values():
                if isinstance(value, torch.Tensor):
                    return int(value.shape[0]) if value.dim() else 1
                if isinstance(value, list):
                    return len(value)
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)) and item:
            if not any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in item):
                return len(item)  # a list of samples (e.g. collate_fn=list)
            todo.extend(item)
    return 1


class Observed:
    """An iterable that yields what ``source`` yields and measures the loop around it.

    ``report()`` covers the last pass (``iter()`` to exhaustion, or the pass in
    progress); ``report(whole=True)`` covers every pass so far. ``len()`` and
    unknown attributes are forwarded to ``source`` (``.dataset``, ``.sampler``, ...).
    """

    def __init__(self, source: Iterable[Any], samples: Callable[[Any], int] | None = None) -> None:
        self.source = source
        self._samples = samples or batch_size_of
        self._consumer = Consumer()
        self._mark = ConsumerTotals()
        self._end: ConsumerTotals | None = None
        self._cpu_mark = 0.0
        self._cpu_end: float | None = None
        self._passes = 0
        self._first_batch_s: float | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._run(iter(self.source))

    def _run(self, iterator: Iterator[Any]) -> Iterator[Any]:
        consumer = self._consumer
        clock = time.perf_counter_ns
        self._mark, self._end = consumer.totals(), None
        self._cpu_mark, self._cpu_end = time.process_time(), None
        self._passes += 1
        self._first_batch_s = None
        start = called = clock()
        try:
            while True:
                try:
                    batch = next(iterator)
                except StopIteration:
                    consumer.wait_ns += clock() - called
                    return
                got = clock()
                consumer.wait_ns += got - called
                consumer.batches += 1
                consumer.samples += self._samples(batch)
                if self._first_batch_s is None:
                    self._first_batch_s = (got - start) / 1e9
                yielded = clock()
                yield batch
                del batch
                called = clock()
                consumer.compute_ns += called - yielded
        finally:
            self._end = consumer.totals()
            self._cpu_end = time.process_time()
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def report(self, whole: bool = False) -> Report:
        """The loop's wait vs compute over the last pass (or, with ``whole``, every pass)."""
        end = self._end if self._end is not None else self._consumer.totals()
        cpu_end = self._cpu_end if self._cpu_end is not None else time.process_time()
        window = end if whole else end - self._mark
        if whole:
            label = "all passes"
        else:
            label = "last pass" if self._end is not None else ("this pass so far" if self._passes else "nothing yet")
        context = Context(
            source="chute.observe", window=label,
            settings={"num_threads": None, "prefetch": None, "autotune": False},
            cpu_s=None if whole else cpu_end - self._cpu_mark,
            first_batch_s=None if whole else self._first_batch_s,
        )
        return build_consumer_only(window, context)

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def __repr__(self) -> str:
        return f"chute.observe({self.source!r})"


def observe(iterable: Iterable[Any], *, samples: Callable[[Any], int] | None = None) -> Observed:
    """Wrap ``iterable`` (e.g. a torch DataLoader) to measure whether the loop around it waits for data.

    ``samples(batch) -> int`` counts the samples of a batch (default: the first
    dimension of its first tensor). See :class:`Observed`.
    """
    return Observed(iterable, samples)
