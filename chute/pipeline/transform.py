"""The transform stage: the Loader's ``transform=`` (and ``collate=``), run on the workers on a gathered batch.

The Loader's function arguments (:class:`Functions`) are sugar for stages:

``transform``
    Either a function of one sample (a dict, as ``dataset[i]`` returns it),
    run in a loop over the batch's samples, whose results are collated
    (``chute.pipeline.collate``, or the user's ``collate``); or an object with
    a ``transform_batch(batch, ctx)`` method (such as the image transforms of
    ``chute.images``), called once with the whole gathered batch and a
    :class:`BatchContext`, which returns the batch. Both are the
    :class:`Transform` stage (named ``transform``).
``collate``
    list of samples -> batch, replacing the default.
``batch_transform``
    batch -> batch, once per batch: ``chute.BatchStage(fn, name="batch_transform")``
    on the workers, after the transform.

A sample whose transform raises fails the batch with a :class:`TransformError`
naming the sample and shard, or is skipped (``on_error="skip"``). While a
per-sample loop runs, the position of the sample being transformed is
published in ``progress[worker]``, which the hang watchdog reads to name the
sample a stuck transform is working on.

Randomness (``chute.pipeline.randomness``): a batch-level transform draws
from ``ctx.random(k)``; a per-sample function from ``chute.sample_rng()`` or
``chute.sample_seed()``, which read the sample the loop publishes in its
thread's :class:`~chute.pipeline.randomness.SampleScope`. Both depend only on
``(seed, epoch, dataset row)``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from chute._arena import Arena
from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.format.schema import Scalar
from chute.pipeline.collate import Collate
from chute.pipeline.randomness import scope, uniform
from chute.pipeline.stage import BatchStage


class TransformError(ChuteError):
    """A user transform raised; the message names the sample and shard, the cause is chained."""


class StageError(TransformError):
    """A user's stage raised on a batch; the message names the stage and the batch, the cause is chained."""


@dataclasses.dataclass(frozen=True)
class Functions:
    """The user's functions of a Loader (see the module docstring)."""

    transform: Callable[[dict[str, Any]], Any] | Any | None = None
    batch_transform: Callable[[Any], Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    on_error: str = "raise"

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        for role in ("transform", "batch_transform", "collate"):
            fn = getattr(self, role)
            if fn is not None and not callable(fn) and not (role == "transform" and hasattr(fn, "transform_batch")):
                raise TypeError(f"{role} must be a function (or None), got {type(fn).__name__} {fn!r}")

    @property
    def batched(self) -> bool:
        """Whether ``transform`` is a batch-level transform object (``transform_batch``)."""
        return hasattr(self.transform, "transform_batch")

    @property
    def transforms(self) -> bool:
        """Whether there is a :class:`Transform` stage (a transform, or a collate of the gathered samples)."""
        return self.transform is not None or self.collate is not None


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """numpy's dtype of a torch dtype (once per dtype: a batch transform asks for its block every batch)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


class BatchContext:
    """What a batch-level stage receives besides the batch, on the workers (``map(batch, ctx)``).

    ``indices`` are the dataset rows of the batch (int64; a sample skipped by a
    stage before is no longer among them), ``epoch`` and ``seed`` those of the
    Loader, ``step`` the batch's step in the pass. :meth:`take` gives an output
    block from the Loader's pool (reused once the user drops the batch; pinned
    when the Loader copies to a CUDA device): write results there instead of
    allocating. :meth:`random` gives the batch's random numbers (a function of
    the rows, not of the thread or the order batches are built in). A sample
    that cannot be transformed is reported with :meth:`fail`: it is skipped or
    fails the batch, as the Loader's ``on_error`` says.

    One context per worker, reused from batch to batch: valid during the call.
    """

    __slots__ = ("indices", "epoch", "seed", "pool", "on_error", "skipped", "step", "worker", "progress", "parts", "_describe")

    def __init__(
        self, indices: np.ndarray | None, epoch: int, seed: int, pool: Arena | None,
        on_error: str = "raise", describe: Callable[[int], str] | None = None,
    ) -> None:
        self.indices, self.epoch, self.seed, self.pool = indices, epoch, seed, pool
        self.on_error = on_error
        self.skipped: list[int] = []  # positions in the batch of the samples given up on (by the stage running now)
        self.step = -1
        self.worker = 0  # the worker's number: its slot in ``progress``
        self.progress: list[int] = [-1]  # per worker: the sample being transformed (the hang watchdog reads it)
        self.parts: tuple[int, ...] = ()  # the running stage's own breakdown of its time (the transform's)
        self._describe = describe

    def take(self, shape: tuple[int, ...], dtype: torch.dtype | np.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` to fill (its contents are undefined)."""
        np_dtype = dtype if isinstance(dtype, np.dtype) else _numpy_dtype(dtype)
        if self.pool is None:
            return torch.from_numpy(np.empty(tuple(shape), np_dtype))
        return self.pool.take(tuple(shape), np_dtype)[1]

    def random(self, k: int, stream: int = 0) -> np.ndarray:
        """``float64[n, k]`` in [0, 1), row ``i`` a function of ``(seed, epoch, stream, indices[i])`` only."""
        assert self.indices is not None, "set for each batch"
        return uniform(self.seed, self.epoch, self.indices, k, stream)

    def describe(self, j: int) -> str:
        """Sample ``j`` of the batch for a message: its dataset row and shard."""
        assert self.indices is not None, "set for each batch"
        row = int(self.indices[j])
        return self._describe(row) if self._describe is not None else f"sample {row}"

    def fail(self, j: int, what: str, exc: BaseException | None = None) -> None:
        """Sample ``j`` could not be transformed (``what`` says why): skip it, or raise a :class:`TransformError`."""
        if self.on_error == "skip":
            self.skipped.append(j)
            return
        cause = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        raise TransformError(f"{what} for {self.describe(j)}{cause}. Pass on_error='skip' to skip such samples") from exc


class Transform(BatchStage):
    """The ``transform`` stage: a per-sample function and the collate, or a batch-level transform object.

    Runs on the workers. A per-sample function runs in a loop over the
    batch's samples, whose results are collated (``chute.pipeline.collate``, or
    the user's ``collate``); a ``transform_batch(batch, ctx)`` object is called
    once with the whole batch. Its time is split into ``per_sample`` and
    ``collate`` (``ctx.parts``), which the report names.
    """

    _builtin = True  # chute's own: its errors name the sample already

    def __init__(self, fns: Functions, dataset: Dataset, seed: int = 0) -> None:
        super().__init__(name="transform", where="workers", gil=not getattr(fns.transform, "gil_free", False) or fns.collate is not None)
        self.fns, self.dataset, self.seed = fns, dataset, seed
        self.scalars = {name for name, ctype in dataset.schema if isinstance(ctype, Scalar)}

    def map(self, batch: Any, ctx: Any) -> Any:
        """The transformed batch (None when every sample was skipped); skipped samples' positions in ``ctx.skipped``."""
        fns = self.fns
        clock = time.perf_counter_ns
        began = clock()
        collate_ns = 0
        if fns.batched:
            batched: Any = fns.transform  # batched: it has transform_batch
            batch = batched.transform_batch(batch, ctx)
        else:
            batch, collate_ns = self._per_sample(batch, ctx)
        ctx.parts = (clock() - began - collate_ns, collate_ns)
        return batch

    def _per_sample(self, batch: dict[str, Any], ctx: BatchContext) -> tuple[Any, int]:
        fns = self.fns
        samples = unbind(batch, self.scalars)
        indices: Any = ctx.indices  # set for each batch
        rows = indices.tolist()
        origin = self._origin(rows)
        collate = None if fns.collate is not None else Collate(len(rows), ctx.pool, origin)
        skipped = ctx.skipped
        progress, w = ctx.progress, ctx.worker
        if fns.transform is None:
            kept = samples
        else:
            fn = fns.transform
            kept = []
            add = kept.append if collate is None else collate.add
            skip = fns.on_error == "skip"
            sample = scope()  # what chute.sample_rng() reads: this batch's seed, epoch and rows, and the sample
            sample.seed, sample.epoch, sample.rows = self.seed, ctx.epoch, rows
            try:
                for j in range(len(samples)):
                    progress[w] = sample.j = j
                    try:
                        value = fn(samples[j])
                    except Exception as exc:
                        if skip:
                            skipped.append(j)
                            continue
                        raise TransformError(
                            f"transform {_name(fn)} failed on {self.describe(rows[j])}: {type(exc).__name__}: {exc}. "
                            "Pass on_error='skip' to skip such samples"
                        ) from exc
                    if collate is not None:
                        collate.add(value)
                    else:
                        add(value)
                    value = None  # with a streaming collate, the sample's copy is in the batch already
            finally:
                progress[w] = sample.j = -1
            if skipped and collate is not None:
                gone = set(skipped)
                collate.origin = self._origin([r for j, r in enumerate(rows) if j not in gone])
        began = time.perf_counter_ns()
        if collate is not None:
            if not collate.samples and not collate.count:
                return None, 0
            batch = collate.result()
        elif not kept:
            return None, 0
        else:
            user_collate: Any = fns.collate  # set whenever the streaming collate is not used
            batch = user_collate(kept)
        return batch, time.perf_counter_ns() - began

    def _origin(self, rows: list[int]) -> Callable[[int], str]:
        return lambda j: self.describe(rows[j])

    def describe(self, index: int) -> str:
        return describe_row(self.dataset, index)


def describe_row(dataset: Any, index: int) -> str:
    """Dataset row ``index`` for a message: its shard file and row there."""
    try:
        shard, row = dataset.locate(index)
        return f"sample {index} (shard {dataset.shards[shard].file}, row {row})"
    except Exception:
        return f"sample {index}"


def unbind(batch: dict[str, Any], scalars: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The samples of a gathered batch, as ``dataset[i]`` would return them."""
    names = list(batch)
    columns = []
    for name in names:
        value = batch[name]
        if isinstance(value, torch.Tensor):
            value = value.tolist() if name in scalars else value.unbind(0)
        columns.append(value)
    return [dict(zip(names, row)) for row in zip(*columns)]


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
