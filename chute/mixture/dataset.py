"""``chute.mix``: several datasets read as one, in weighted proportions.

A :class:`Mixture` reads like a :class:`chute.Dataset` whose rows are its
sources' rows one after the other (source ``k``'s row ``r`` is row
``base[k] + r``) and whose shards are the sources' shards in the same order.
What makes it a mixture is its order (:class:`chute.mixture.order.MixOrder`),
which draws from each source in proportion to its weight.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from chute.errors import SchemaError
from chute.format.manifest import ShardInfo
from chute.format.reader import Dataset, open_dataset
from chute.format.schema import FIXED_SIZE, Schema
from chute.mixture.order import MixOrder
from chute.order import DEFAULT_WINDOW


class Mixture:
    """Datasets read as one; make it with :func:`chute.mix`.

    Has what a loader reads from a :class:`chute.Dataset` (``schema``, ``len``,
    ``[i]``, ``get_batch``, ``shards``, ``offsets``, ``locate``, ``shard_path``)
    and :meth:`order`, the mixture's order for given loader settings.
    Picklable; ``close()`` closes the sources.
    """

    def __init__(
        self,
        sources: Mapping[str, Dataset],
        weights: Mapping[str, float],
        columns: Sequence[str] | None = None,
        epoch_rows: int | None = None,
    ) -> None:
        if not sources:
            raise ValueError("chute.mix needs at least one dataset")
        self.sources = dict(sources)
        self.names = tuple(self.sources)
        if set(weights) != set(self.names):
            raise ValueError(
                f"weights name {sorted(weights)} but the datasets are {sorted(self.names)}; give one weight per dataset"
            )
        self.weights = {name: weights[name] for name in self.names}
        self.columns = None if columns is None else tuple(columns)
        self.schema = common_schema(self.sources, self.columns)
        self.epoch_rows = epoch_rows
        self._datasets = tuple(self.sources.values())
        sizes = [len(ds) for ds in self._datasets]
        self.base = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.base[1:])
        self.shards: tuple[ShardInfo, ...] = tuple(s for ds in self._datasets for s in ds.shards)
        self.offsets = np.concatenate([[0], np.cumsum([s.rows for s in self.shards])]).astype(np.int64)
        self._shard_base = np.concatenate([[0], np.cumsum([len(ds.shards) for ds in self._datasets])]).astype(np.int64)
        self._fixed = [name for name, ctype in self.schema if isinstance(ctype, FIXED_SIZE)]
        self.root = "chute.mix(" + ", ".join(f"{n}={ds.root}" for n, ds in self.sources.items()) + ")"
        self.cache = None  # each remote source reads through its own node cache

    # ------------------------------------------------------------------ description

    def __len__(self) -> int:
        return int(self.base[-1])

    def __repr__(self) -> str:
        weights = ", ".join(f"{n}={w}" for n, w in self.weights.items())
        return f"chute.Mixture({self.root}, weights=({weights}), rows={len(self)}, columns={self.schema.names})"

    def __reduce__(self):
        return (Mixture, (self.sources, self.weights, self.columns, self.epoch_rows))

    @property
    def nbytes(self) -> int:
        return sum(ds.nbytes for ds in self._datasets)

    def order(
        self, batch_size: int, shuffle: bool = False, seed: int = 0, window: int = DEFAULT_WINDOW, drop_last: bool = False
    ) -> MixOrder:
        """The mixture's order for these loader settings (see :class:`chute.mixture.order.MixOrder`)."""
        return MixOrder(
            self.names, tuple(tuple(s.rows for s in ds.shards) for ds in self._datasets),
            tuple(self.weights[n] for n in self.names), int(batch_size), bool(shuffle), int(seed), int(window),
            bool(drop_last), self.epoch_rows,
        )

    def source_of(self, index: int) -> tuple[int, int]:
        """``(source number, row within the source)`` of mixture row ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range for {self.root} of {len(self)} rows")
        k = int(np.searchsorted(self.base, index, side="right")) - 1
        return k, index - int(self.base[k])

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number in the concatenated list, row within the shard)`` of mixture row ``index``."""
        k, row = self.source_of(index)
        shard, within = self._datasets[k].locate(row)
        return int(self._shard_base[k]) + shard, within

    def shard_path(self, i: int) -> str:
        """The local file of shard ``i`` of the concatenated list."""
        k = int(np.searchsorted(self._shard_base, i, side="right")) - 1
        return self._datasets[k].shard_path(i - int(self._shard_base[k]))

    # ------------------------------------------------------------------ reading

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, (np.integer, torch.Tensor)):
            index = int(index)
        if not isinstance(index, int):
            raise TypeError(f"mixture indices must be integers, not {type(index).__name__}; use get_batch for many rows")
        k, row = self.source_of(index + len(self) if index < 0 else index)
        sample = self._datasets[k][row]
        return {name: sample[name] for name in self.schema.names}

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Gather mixture rows ``indices`` (in that order), as :meth:`chute.Dataset.get_batch` does.

        Each source gathers its rows into its slice of the output; rows grouped
        by source (as :class:`MixOrder` gives them) cost no extra copy.
        """
        idx = Dataset._check_indices(self, indices)  # the same checks and messages as a dataset's
        source = np.searchsorted(self.base, idx, side="right") - 1
        order = None
        if len(idx) > 1 and (source[1:] < source[:-1]).any():  # not grouped: gather grouped, then put back
            order = np.argsort(source, kind="stable")
            idx, source = idx[order], source[order]
        n = len(idx)
        result: dict[str, Any] = {name: self._output(name, n, out if order is None else None) for name in self._fixed}
        variable: dict[str, list[Any]] = {name: [] for name in self.schema.names if name not in result}
        cuts = np.flatnonzero(np.diff(source)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), n]):
            if a == b:
                continue
            k = int(source[a])
            part = self._datasets[k].get_batch(idx[a:b] - self.base[k], out={name: result[name][a:b] for name in self._fixed})
            for name, values in variable.items():
                values.extend(part[name])
        result.update(variable)
        if order is not None:
            inverse = np.empty_like(order)
            inverse[order] = np.arange(n)
            for name in self.schema.names:
                value = result[name]
                if isinstance(value, torch.Tensor):
                    put = torch.from_numpy(inverse)
                    result[name] = torch.index_select(value, 0, put, out=out[name]) if out is not None and name in out else value[put]
                else:
                    result[name] = [value[i] for i in inverse.tolist()]
        return {name: result[name] for name in self.schema.names}

    def _output(self, name: str, n: int, out: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
        if out is not None and name in out:
            return out[name]
        ctype = self.schema[name]
        from chute.format.reader import torch_dtype

        shape = (n, *getattr(ctype, "shape", ()))
        return torch.empty(shape, dtype=torch_dtype(ctype.dtype))

    def close(self) -> None:
        """Close every source."""
        for ds in self._datasets:
            ds.close()

    def __enter__(self) -> Mixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def common_schema(sources: Mapping[str, Dataset], columns: Sequence[str] | None) -> Schema:
    """The schema every source shares, or of the ``columns`` selected; raises naming what differs."""
    names = list(sources)
    first = sources[names[0]].schema
    if columns is None:
        differences = []
        for name in names[1:]:
            other = sources[name].schema
            only_a = [c for c in first.names if c not in other.names]
            only_b = [c for c in other.names if c not in first.names]
            if only_a:
                differences.append(f"{only_a} only in {names[0]!r}")
            if only_b:
                differences.append(f"{only_b} only in {name!r}")
            for c in first.names:
                if c in other.names and first[c] != other[c]:
                    differences.append(f"column {c!r} is {first[c].describe()} in {names[0]!r} but {other[c].describe()} in {name!r}")
        if differences:
            raise SchemaError(
                "the datasets of a mixture must have the same columns: " + "; ".join(differences)
                + ". Select the columns they share with chute.mix(..., columns=[...])"
            )
        return first
    if not columns:
        raise SchemaError("columns= selects no column; name at least one")
    for c in columns:
        missing = [n for n in names if c not in sources[n].schema.names]
        if missing:
            raise SchemaError(f"column {c!r} selected with columns= is not in dataset(s) {missing}")
        types = {n: sources[n].schema[c] for n in names}
        if len(set(types.values())) > 1:
            detail = ", ".join(f"{t.describe()} in {n!r}" for n, t in types.items())
            raise SchemaError(f"column {c!r} has different types in the mixture's datasets ({detail}); it cannot be mixed")
    return Schema.from_dict({c: first[c] for c in columns})


def mix(
    datasets: Mapping[str, Dataset | str | os.PathLike],
    weights: Mapping[str, float],
    *,
    columns: Sequence[str] | None = None,
    epoch_rows: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Mixture:
    """A weighted mixture of datasets, read as one dataset (see docs/mix.md).

    ``datasets`` maps names to :class:`chute.Dataset` objects or paths/URLs
    (opened with :func:`chute.open`; remote ones through the node cache
    ``cache_dir``, at most ``cache_limit`` bytes each); ``weights`` maps the same
    names to positive numbers (relative: ``{"a": 3, "b": 1}`` is 75%/25%). Every
    global batch then holds each dataset's share to within one sample, each
    dataset is read through its own shuffled passes, and an epoch is
    ``epoch_rows`` rows (default: all datasets' rows together).

    The datasets must have the same columns (name and type); otherwise the
    error names the differences, and ``columns=[...]`` selects the ones to mix.
    """
    opened = {
        str(name): ds if isinstance(ds, Dataset) else open_dataset(ds, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options)
        for name, ds in datasets.items()
    }
    mixture = Mixture(opened, weights, columns, epoch_rows)
    mixture.order(1)  # validates the weights now, not at the first batch
    return mixture
