"""One batch task: gather the rows, run the user's transforms, collate.

This is the function the worker threads (or processes) run; it is the only
place user code runs, so errors are wrapped here with the sample and shard
they concern.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import default_collate

from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.format.schema import Scalar


class TransformError(ChuteError):
    """A user transform raised; the message names the sample and shard, the cause is chained."""


@dataclasses.dataclass(frozen=True)
class BatchFns:
    """What to do with a gathered batch.

    ``transform`` runs once per sample (a dict, as ``dataset[i]`` returns it) and
    returns the sample to collate; ``collate`` turns the list of samples into a
    batch (default: ``torch.utils.data.default_collate``); ``batch_transform``
    runs once on the whole batch, last. With none of them the batch is exactly
    ``dataset.get_batch(indices)``.
    """

    transform: Callable[[dict[str, Any]], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    collate: Callable[[list[Any]], Any] | None = None
    on_error: str = "raise"

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")


class BatchTimes(NamedTuple):
    """Where a batch task's time went (``time.perf_counter_ns`` values and durations), for the counters."""

    start_ns: int  # when the gather started
    read_ns: int  # dataset.get_batch
    per_sample_ns: int  # the per-sample transform loop
    collate_ns: int
    batch_transform_ns: int
    nbytes: int  # bytes of the gathered batch (tensors and byte strings)
    out_nbytes: int  # bytes of the finished batch (what waits in the queue: the autotuner's memory budget)


@dataclasses.dataclass
class Loaded:
    """A finished batch task: the batch, or None if every sample of it was skipped."""

    batch: Any
    rows: int
    skipped: list[int]
    times: BatchTimes | None = None


def unbind(batch: dict[str, Any], dataset: Dataset) -> list[dict[str, Any]]:
    """The samples of a gathered batch, as ``dataset[i]`` would return them."""
    names = list(batch)
    scalars = {name for name, ctype in dataset.schema if isinstance(ctype, Scalar)}
    columns = [batch[name].tolist() if name in scalars else batch[name] for name in names]
    n = len(columns[0]) if columns else 0
    return [{name: column[j] for name, column in zip(names, columns)} for j in range(n)]


def describe_row(dataset: Dataset, index: int) -> str:
    shard, row = dataset.locate(index)
    return f"sample {index} (shard {dataset.shards[shard].file}, row {row})"


def load_batch(
    dataset: Dataset, indices: np.ndarray, fns: BatchFns, out: dict[str, torch.Tensor] | None = None, timed: bool = True
) -> Loaded:
    """Gather ``indices`` from ``dataset`` and apply ``fns``; with ``timed``, say where the time went."""
    clock = time.perf_counter_ns
    start = clock() if timed else 0
    batch = dataset.get_batch(indices, out=out)
    read = clock() if timed else 0
    per_sample = collate = done = read
    nbytes = nbytes_of(batch) if timed else 0
    skipped: list[int] = []
    if fns.transform is not None or fns.collate is not None:
        samples = unbind(batch, dataset)
        if fns.transform is not None:
            kept = []
            for index, sample in zip(indices.tolist(), samples):
                try:
                    kept.append(fns.transform(sample))
                except Exception as exc:
                    if fns.on_error == "skip":
                        skipped.append(index)
                        continue
                    raise TransformError(
                        f"transform {_name(fns.transform)} failed on {describe_row(dataset, index)}: "
                        f"{type(exc).__name__}: {exc}. Pass on_error='skip' to skip such samples"
                    ) from exc
            samples = kept
        per_sample = collate = done = clock() if timed else 0
        if not samples:
            times = BatchTimes(start, read - start, per_sample - read, 0, 0, nbytes, 0) if timed else None
            return Loaded(None, 0, skipped, times)
        batch = (fns.collate or default_collate)(samples)
        collate = done = clock() if timed else 0
    if fns.batch_transform is not None:
        try:
            batch = fns.batch_transform(batch)
        except Exception as exc:
            first = describe_row(dataset, int(indices[0])) if len(indices) else "an empty batch"
            raise TransformError(
                f"batch_transform {_name(fns.batch_transform)} failed on a batch of {len(indices)} samples "
                f"starting with {first}: {type(exc).__name__}: {exc}"
            ) from exc
        done = clock() if timed else 0
    if timed:
        out_nbytes = nbytes if done == read else nbytes_of(batch)  # transformed: measure what came out
        times = BatchTimes(start, read - start, per_sample - read, collate - per_sample, done - collate, nbytes, out_nbytes)
    else:
        times = None
    return Loaded(batch, len(indices) - len(skipped), skipped, times)


def nbytes_of(batch: Any) -> int:
    """Bytes of the tensors and byte-string lists at the top level of a batch (dict, list or tensor)."""
    if isinstance(batch, torch.Tensor):
        return batch.nbytes
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.nbytes
        elif isinstance(value, list) and value and isinstance(value[0], (bytes, bytearray)):
            total += sum(len(v) for v in value)
    return total


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
