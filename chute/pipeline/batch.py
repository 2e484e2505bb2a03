"""One batch task: gather the rows, run the user's transforms, collate.

This is the function the worker threads (or processes) run; it is the only
place user code runs, so errors are wrapped here with the sample and shard
they concern.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

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


@dataclasses.dataclass
class Loaded:
    """A finished batch task: the batch, or None if every sample of it was skipped."""

    batch: Any
    rows: int
    skipped: list[int]


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


def load_batch(dataset: Dataset, indices: np.ndarray, fns: BatchFns, out: dict[str, torch.Tensor] | None = None) -> Loaded:
    """Gather ``indices`` from ``dataset`` and apply ``fns``."""
    batch = dataset.get_batch(indices, out=out)
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
        if not samples:
            return Loaded(None, 0, skipped)
        batch = (fns.collate or default_collate)(samples)
    if fns.batch_transform is not None:
        try:
            batch = fns.batch_transform(batch)
        except Exception as exc:
            first = describe_row(dataset, int(indices[0])) if len(indices) else "an empty batch"
            raise TransformError(
                f"batch_transform {_name(fns.batch_transform)} failed on a batch of {len(indices)} samples "
                f"starting with {first}: {type(exc).__name__}: {exc}"
            ) from exc
    return Loaded(batch, len(indices) - len(skipped), skipped)


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
