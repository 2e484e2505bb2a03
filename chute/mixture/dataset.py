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
from chute.format.reader import BatchReader, Dataset, get_batch, get_item
from chute.format.schema import Schema
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
        self.root = "chute.mix(" + ", ".join(f"{n}={ds.root}" for n, ds in self.sources.items()) + ")"
        self.cache = None  # each remote source reads through its own node cache
        self._views = not all(isinstance(ds, Dataset) for ds in self._datasets)
        if self._views:  # views (chute.tokens.sequences): each reads its own rows, see _read_views
            self._batches = None
            self.read = self._read_views
            return
        # One native gather reads every source's shards: their buffers, in the concatenated shard list.
        self._batches = BatchReader(self.schema, self.offsets, self._map, lambda i: self.shards[i].file, self.root)
        self.read = self._batches.read
        self.native_indices = True  # read() checks every index natively (get_batch's fast path)
        for k, ds in enumerate(self._datasets):
            if ds.cache is not None:  # a shard the source's cache lets go is let go here too
                ds.cache.on_unpin = _chain(ds.cache.on_unpin, int(self._shard_base[k]), self._batches)

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

    @property
    def fixed_columns(self) -> list[tuple[str, tuple[int, ...], np.dtype, torch.dtype]]:
        return self._datasets[0].fixed_columns if self._batches is None else self._batches.fixed_columns

    @property
    def variable_columns(self) -> list[str]:
        return self._datasets[0].variable_columns if self._batches is None else self._batches.variable_columns

    def _read_views(self, indices: np.ndarray, outs: Sequence[np.ndarray], columnar: bool = False) -> list[Any]:
        """Rows ``indices`` of a mixture of views (``chute.tokens.sequences``): each source reads its rows
        (one call), which land at their places in ``outs``.

        Their only variable column, ``cu_seqlens`` (packed documents), is rebuilt for the whole batch from
        ``position_ids``: every piece and every padding run starts at position 0.
        """
        source = np.searchsorted(self.base, indices, side="right") - 1
        for k in np.unique(source).tolist():
            at = np.flatnonzero(source == k)
            parts = [np.empty((len(at), *out.shape[1:]), out.dtype) for out in outs]
            self._datasets[k].read(np.ascontiguousarray(indices[at] - self.base[k]), parts, columnar)
            for out, part in zip(outs, parts):
                out[at] = part
        if not self.variable_columns:
            return []
        positions = outs[[name for name, _, _, _ in self.fixed_columns].index("position_ids")].reshape(-1)
        cu = np.append(np.flatnonzero(positions == 0), positions.size).astype(np.int32)
        return [torch.from_numpy(cu)]

    def shards_of(self, indices: np.ndarray) -> list[int]:
        """The shards (of the concatenated list) rows ``indices`` are in, once each, ascending."""
        return np.unique(np.searchsorted(self.offsets[:-1], indices, side="right") - 1).tolist()

    def _map(self, i: int) -> None:
        """Shard ``i`` of the concatenated list: map it in its source and publish its buffers here."""
        k = int(np.searchsorted(self._shard_base, i, side="right")) - 1
        ds, j = self._datasets[k], i - int(self._shard_base[k])
        ds.shard(j)
        assert self._batches is not None  # only datasets' shards are mapped here
        self._batches.publish(i, {name: ds._batches.sources[name][j] for name in self.schema.names})

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
        return get_item(self, index)

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None,
                  *, columnar: bool = False) -> dict[str, Any]:
        """Gather mixture rows ``indices`` (in that order), as :meth:`chute.Dataset.get_batch` does.

        One native call reads the rows of every source at once, from all their shards.
        """
        return get_batch(self, indices, out, columnar)

    def close(self) -> None:
        """Close every source."""
        if self._batches is not None:
            self._batches.unpublish()
        for ds in self._datasets:
            ds.close()

    def __enter__(self) -> Mixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chain(unpin: Any, base: int, batches: BatchReader) -> Any:
    """A source cache's ``on_unpin`` that also drops the shard from the mixture's reader."""

    def on_unpin(j: int) -> None:
        if unpin is not None:
            unpin(j)
        batches.unpublish(base + j)

    return on_unpin


def common_schema(sources: Mapping[str, Dataset], columns: Sequence[str] | None) -> Schema:
    """The schema every source shares, or of the ``columns`` selected; raises naming what differs."""
    names = list(sources)
    _same_sequences(sources)
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


def _same_sequences(sources: Mapping[str, Any]) -> None:
    """Token views (``chute.tokens.sequences``) mix only with one ``seq_len`` and packing: say so, and how."""
    shapes = {name: (getattr(ds, "seq_len", None), getattr(ds, "pack", None)) for name, ds in sources.items()}
    if len(set(shapes.values())) <= 1 or any(v[0] is None for v in shapes.values()):
        return
    detail = ", ".join(f"{name!r} seq_len={length} pack={pack!r}" for name, (length, pack) in shapes.items())
    length, pack = max(int(v[0] or 0) for v in shapes.values()), next(iter(shapes.values()))[1]
    raise SchemaError(
        f"the token views of a mixture must have one seq_len and packing ({detail}): make each view with the same "
        f"ones, e.g. chute.tokens.sequences(data, {length}, pack={pack!r}) for every dataset"
    )


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

    ``datasets`` maps names to :class:`chute.Dataset` objects, token sequence
    views (:func:`chute.tokens.sequences`, all of the same ``seq_len`` and
    packing: a weight is then a share of the tokens) or paths/URLs
    (opened with :func:`chute.open`; remote ones through the node cache
    ``cache_dir``, at most ``cache_limit`` bytes each); ``weights`` maps the same
    names to positive numbers (relative: ``{"a": 3, "b": 1}`` is 75%/25%). Every
    global batch then holds each dataset's share to within one sample, each
    dataset is read through its own shuffled passes, and an epoch is
    ``epoch_rows`` rows (default: all datasets' rows together).

    The datasets must have the same columns (name and type); otherwise the
    error names the differences, and ``columns=[...]`` selects the ones to mix.
    """
    from chute.storage.open import open_dataset

    opened: dict[str, Any] = {  # datasets, or views that read like one (chute.tokens.sequences)
        str(name): ds if isinstance(ds, Dataset) or hasattr(ds, "read") else open_dataset(ds, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options)
        for name, ds in datasets.items()
    }
    mixture = Mixture(opened, weights, columns, epoch_rows)
    mixture.order(1)  # validates the weights now, not at the first batch
    return mixture
