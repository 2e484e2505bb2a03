"""Arrays that already lie in files, read where they are: a dataset the Loader takes like a chute dataset.

A contiguous, uncompressed array in a file (an HDF5 dataset, see
:func:`chute.sources.hdf5.open_hdf5`) is its rows back to back at a byte
offset: exactly what a chute shard's fixed-size column is. So
:class:`InPlaceArrays` maps each array once, read-only, where it lies, and
hands the same :class:`chute.format.reader.BatchReader` a chute dataset uses
a view of it per shard: a batch is one native gather per column, with the
GIL released, and nothing is copied or converted beforehand.

Its shards are row ranges, cut where the writer would cut a converted copy
(``shard_size`` bytes of rows), so the Loader's global order (shuffle,
resume, ranks and workers) over the view is the one over the converted
dataset. It pickles as its description (file names, offsets, types) and maps
again in the process that unpickles it (worker processes). Before mapping, a
file is checked to still have the size and modification time it had when the
view was made, and to hold every row (a rewritten or truncated file is an
error, never a read past its end).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from chute._sizes import parse_size
from chute.errors import ShardError
from chute.format.manifest import ShardInfo
from chute.format.reader import BatchReader, get_batch, get_item
from chute.format.schema import Scalar, Schema, Tensor
from chute.format.writer import DEFAULT_SHARD_SIZE

__all__ = ["InPlaceArrays", "Mapped", "shard_bounds"]


@dataclasses.dataclass(frozen=True)
class Mapped:
    """One column: ``ctype``'s rows back to back from byte ``offset`` of ``file``."""

    name: str
    file: str
    offset: int
    ctype: Tensor | Scalar


def shard_bounds(rows: int, row_bytes: int, shard_size: int) -> np.ndarray:
    """The first row of each shard and the end: ``shard_size`` bytes of rows a shard (the writer's cut: a shard
    is written once it holds at least ``shard_size`` bytes)."""
    per = max(1, -(-shard_size // max(1, row_bytes)))
    return np.asarray([*range(0, rows, per), rows] if rows else [0], dtype=np.int64)


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ShardError(f"{path} is missing: the in-place view reads the file where it is") from None
    return st.st_size, st.st_mtime_ns


class InPlaceArrays:
    """Columns that are arrays at file offsets, as a dataset (see the module doc). Picklable, thread-safe."""

    def __init__(
        self, root: str, arrays: Sequence[Mapped], rows: int, *, shard_size: int | str = DEFAULT_SHARD_SIZE,
        metadata: Mapping[str, Any] | None = None, stamps: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.root = root
        self.arrays = list(arrays)
        self.shard_size = parse_size(shard_size)
        self.metadata = dict(metadata or {})
        self.schema = Schema.from_dict({m.name: m.ctype for m in self.arrays})
        self.stamps = dict(stamps) if stamps is not None else {m.file: _stamp(m.file) for m in self.arrays}
        self.row_bytes = sum(m.ctype.row_bytes for m in self.arrays)
        self.offsets = shard_bounds(int(rows), self.row_bytes, self.shard_size)
        name = os.path.basename(root)
        self.shards = tuple(
            ShardInfo(f"{name} rows {a}-{b - 1}", int(b - a), int(b - a) * self.row_bytes, "")
            for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist())
        )
        self.cache = None  # local files: nothing to download or hold
        self.progressive = False
        self._lock = threading.Lock()
        self._maps: list[np.ndarray] | None = None
        self._batches = BatchReader(self.schema, self.offsets, self._map, lambda i: self.shards[i].file, root)
        self.read = self._batches.read  # the Loader's per-batch call: the batch reader itself
        self.native_indices = True  # read() checks every index natively (get_batch's fast path)

    def __reduce__(self):
        return (_restore, (self.root, self.arrays, int(self.offsets[-1]), self.shard_size, self.metadata, self.stamps))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"InPlaceArrays({self.root!r}, rows={len(self)}, shards={len(self.shards)}, columns={self.schema.names})"

    @property
    def nbytes(self) -> int:
        return len(self) * self.row_bytes

    @property
    def fixed_columns(self) -> list[tuple[str, tuple[int, ...], np.dtype, torch.dtype]]:
        return self._batches.fixed_columns

    @property
    def variable_columns(self) -> list[str]:
        return []

    # ------------------------------------------------------------------ mapping

    def _map(self, shard: int) -> None:
        """Map every column (once) and publish each shard's rows of it: a view, no copy."""
        with self._lock:
            if self._maps is None:
                self._maps = [self._map_array(m) for m in self.arrays]
            for i, (a, b) in enumerate(zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist())):
                self._batches.publish(i, {
                    m.name: whole[a * m.ctype.row_bytes : b * m.ctype.row_bytes] for m, whole in zip(self.arrays, self._maps)
                })

    def _map_array(self, m: Mapped) -> np.ndarray:
        size = len(self) * m.ctype.row_bytes
        if _stamp(m.file) != self.stamps[m.file]:
            raise ShardError(f"{m.file} changed since it was opened in place; open it again (column {m.name!r})")
        available = self.stamps[m.file][0]
        if m.offset < 0 or m.offset + size > available:
            raise ShardError(
                f"{m.file}: column {m.name!r} needs bytes {m.offset}..{m.offset + size} but the file holds {available}; "
                "it is truncated or not what the view was made from"
            )
        if size == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(m.file, dtype=np.uint8, mode="r", offset=m.offset, shape=(size,))

    # ------------------------------------------------------------------ rows

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, row within the shard)`` of row ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range for {self.root} of {len(self)} rows")
        shard = int(np.searchsorted(self.offsets[:-1], index, side="right")) - 1
        return shard, index - int(self.offsets[shard])

    def shards_of(self, indices: np.ndarray) -> list[int]:
        return np.unique(np.searchsorted(self.offsets[:-1], indices, side="right") - 1).tolist()

    def shard_path(self, i: int) -> str:
        return self.root

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None,
                  *, columnar: bool = False) -> dict[str, Any]:
        """Rows ``indices`` as a dict of column name to a tensor ``[len(indices), *shape]`` (one gather per column)."""
        return get_batch(self, indices, out, columnar)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return get_item(self, index)

    def release_direct_holds(self) -> None:
        """Nothing is held: the files are local."""

    def close(self) -> None:
        """Drop the mappings (mapped again on the next read)."""
        with self._lock:
            self._maps = None
            self._batches.unpublish()

    def __enter__(self) -> InPlaceArrays:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _restore(root: str, arrays: list[Mapped], rows: int, shard_size: int, metadata: dict[str, Any],
             stamps: dict[str, tuple[int, int]]) -> InPlaceArrays:
    return InPlaceArrays(root, arrays, rows, shard_size=shard_size, metadata=metadata, stamps=stamps)
