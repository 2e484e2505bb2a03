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
from chute.pipeline.buffers import BufferPool


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


def _times(values: tuple[int, ...]) -> BatchTimes:
    """A BatchTimes without NamedTuple's Python-level ``__new__`` (a fifth of a microsecond per batch)."""
    return tuple.__new__(BatchTimes, values)


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
    dataset: Dataset,
    indices: np.ndarray,
    fns: BatchFns,
    out: dict[str, torch.Tensor] | None = None,
    timed: bool = True,
    buffers: BufferPool | None = None,
) -> Loaded:
    """Gather ``indices`` from ``dataset`` and apply ``fns``; with ``timed``, say where the time went.

    ``buffers``: where the default collate stacks tensors (reused once nobody holds them).
    """
    clock = time.perf_counter_ns
    start = clock() if timed else 0
    batch = dataset.get_batch(indices, out=out)
    read = clock() if timed else 0
    per_sample = collate = done = read
    nbytes = nbytes_of(batch) if timed else 0
    skipped: list[int] = []
    if fns.transform is not None or fns.collate is not None:
        samples = unbind(batch, dataset)
        # The default collate runs as the samples come (into reused buffers), so that one
        # transformed sample is alive at a time, not the whole batch (see StreamCollate).
        sink = StreamCollate(len(samples), buffers) if fns.collate is None and buffers is not None else None
        if fns.transform is not None:
            kept: list[Any] = []
            add = kept.append if sink is None else sink.add
            value = None
            for index, sample in zip(indices.tolist(), samples):
                try:
                    value = fns.transform(sample)
                except Exception as exc:
                    if fns.on_error == "skip":
                        skipped.append(index)
                        continue
                    raise TransformError(
                        f"transform {_name(fns.transform)} failed on {describe_row(dataset, index)}: "
                        f"{type(exc).__name__}: {exc}. Pass on_error='skip' to skip such samples"
                    ) from exc
                add(value)
            value = None  # the last sample: with the sink, its copy is in the batch
            samples = kept
        per_sample = collate = done = clock() if timed else 0
        if not samples and not (sink is not None and sink.count):
            times = _times((start, read - start, per_sample - read, 0, 0, nbytes, 0)) if timed else None
            return Loaded(None, 0, skipped, times)
        batch = fns.collate(samples) if fns.collate is not None else sink.result() if sink is not None else default_collate(samples)
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
        times = _times((start, read - start, per_sample - read, collate - per_sample, done - collate, nbytes, out_nbytes))
    else:
        times = None
    return Loaded(batch, len(indices) - len(skipped), skipped, times)


class StreamCollate:
    """``torch.utils.data.default_collate``, one sample at a time, into reused buffers.

    A batch of decoded images is tens of MB. Collated the usual way, every
    transformed sample stays alive until ``torch.stack`` copies them all into a
    fresh tensor: tens of MB of new memory per batch, each 4 KiB page faulting
    on first write. Measured on W4 (256 JPEGs decoded and cropped to
    3x224x224 per batch): +100-130 us of CPU per image, a fifth of the decode.
    Here each sample is copied into its slot of a buffer from ``buffers`` as it
    comes and then dropped, so the allocator keeps reusing the same warm memory.

    Handled this way: samples that are CPU tensors of one shape and dtype, or
    dicts with the same keys whose tensor values keep one shape and dtype
    (other values are collected and given to default_collate per key, as it
    would). The first sample that does not fit (a new shape, another type)
    turns the batch back into a list (the samples so far as views of their
    slots), and default_collate does the rest, with its usual results and errors.
    """

    def __init__(self, n: int, buffers: BufferPool) -> None:
        self.n, self.buffers = n, buffers
        self.count = 0
        self.tensor: torch.Tensor | None = None  # samples are tensors: their batch
        self.columns: dict[Any, torch.Tensor | list[Any]] | None = None  # samples are dicts: a batch or a list per key
        self.fallback: list[Any] | None = None  # samples kept as they are, for default_collate

    def add(self, sample: Any) -> None:
        if self.fallback is None and (self._plan(sample) if self.count == 0 else self._fits(sample)):
            self._put(sample)
        else:
            if self.fallback is None:
                self.fallback = [self._view(i) for i in range(self.count)]
            self.fallback.append(sample)
        self.count += 1

    def result(self) -> Any:
        if self.fallback is not None:
            return default_collate(self.fallback)
        if self.tensor is not None:
            return self.tensor[: self.count]
        return {
            key: column[: self.count] if isinstance(column, torch.Tensor) else default_collate(column)
            for key, column in self.columns.items()
        }

    def _plan(self, sample: Any) -> bool:
        """Buffers for a batch of samples like the first; False if it is not a kind handled here."""
        if _stackable(sample):
            self.tensor = self.buffers.take((self.n, *sample.shape), sample.dtype)
            return True
        if type(sample) is dict and sample:
            self.columns = {
                key: self.buffers.take((self.n, *value.shape), value.dtype) if _stackable(value) else []
                for key, value in sample.items()
            }
            return True
        return False

    def _fits(self, sample: Any) -> bool:
        if self.tensor is not None:
            return _stackable(sample) and sample.shape == self.tensor.shape[1:] and sample.dtype == self.tensor.dtype
        if self.columns is None or type(sample) is not dict or sample.keys() != self.columns.keys():
            return False
        for key, column in self.columns.items():
            if isinstance(column, torch.Tensor):
                value = sample[key]
                if not (_stackable(value) and value.shape == column.shape[1:] and value.dtype == column.dtype):
                    return False
        return True

    def _put(self, sample: Any) -> None:
        i = self.count
        if self.tensor is not None:
            copy_into(self.tensor[i], sample)
            return
        for key, column in self.columns.items():
            if isinstance(column, torch.Tensor):
                copy_into(column[i], sample[key])
            else:
                column.append(sample[key])

    def _view(self, i: int) -> Any:
        """Sample ``i`` as collected so far (tensors as views of their slot)."""
        if self.tensor is not None:
            return self.tensor[i]
        return {key: column[i] for key, column in self.columns.items()}


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` on this thread alone.

    torch splits a copy of more than 32K elements over its intra-op threads,
    whose OpenMP workers then spin for a while after each one: called from
    loader threads, that took a core from the decoding (measured on W4 with one
    loader thread: 1.2 ms of CPU per image instead of 0.6). numpy copies on
    the calling thread, without the GIL; dtypes numpy lacks (bfloat16, ...) go
    through torch.
    """
    try:
        np.copyto(dst.numpy(), src.numpy(), casting="no")
    except (TypeError, RuntimeError, ValueError):
        dst.copy_(src)


def _stackable(value: Any) -> bool:
    return (
        type(value) is torch.Tensor and value.device.type == "cpu" and value.layout == torch.strided
        and not value.requires_grad and not value.is_quantized
    )


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
