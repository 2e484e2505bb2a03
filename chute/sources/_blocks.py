"""Blocks of rows in, a committed chute dataset out: the array sources' write path.

An array source (HDF5, Zarr) and a parallel record reader (LMDB, TFRecord)
hands over rows a *block* at a time: a dict of column name to the block's
values, a numpy array of ``rows`` rows for each fixed-size column (tensor,
scalar) and a list for each other column. :class:`BlockShards` cuts the blocks
into shards exactly where the per-sample writer would (the same bytes counted
per row, the shard written once it reaches ``shard_size``), copies each
fixed-size column into its shard with one numpy concatenation instead of one
call per row, and appends the other columns' values through the per-sample
builders (which check each value). :func:`write_blocks` is
:func:`chute.sources._write.write_samples` for blocks: the same writer, lock,
progress bar and abort on any error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

import chute
from chute.errors import SchemaError
from chute.format.builders import cast_exact
from chute.format.columns import numpy_dtype
from chute.format.schema import FIXED_SIZE, ColumnType, Tensor, arrow_type, as_array
from chute.format.writer import ShardWriter
from chute.sources._progress import Progress
from chute.storage.open import open_dataset
from chute.storage.write import StoreOptions, Writer, store_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Block", "BlockShards", "BlockWriter", "columns_block", "fixed_block", "rows_block", "write_blocks"]

Block = tuple[dict[str, Any], int, str]
"""``(values by column, rows, where)``: a block of rows and what names it in errors."""


def fixed_block(name: str, ctype: Any, values: Any, rows: int, where: str) -> np.ndarray:
    """``values`` as the ``(rows, *shape)`` array of ``ctype``'s storage dtype, or a SchemaError naming ``where``."""
    array = np.asarray(values)
    shape = (rows, *ctype.shape) if isinstance(ctype, Tensor) else (rows,)
    want = numpy_dtype(ctype.dtype)
    if array.shape != shape:
        raise SchemaError(f"{where}, column {name!r}: a block of shape {array.shape}, expected {shape}")
    if array.dtype != want:
        cast = cast_exact(array, ctype.dtype) if array.dtype.kind in "biuf" else None
        if cast is None:
            raise SchemaError(f"{where}, column {name!r}: {array.dtype} values do not fit the column's {ctype.dtype}")
        array = cast.astype(want, copy=False)
    return array


def rows_block(samples: Sequence[Mapping[str, Any]], schema: Mapping[str, ColumnType], where: str) -> dict[str, Any]:
    """Row dicts as one block: each fixed-size column stacked into one array (the per-row work, done where the rows
    were read: a reader process), the other columns as lists of values."""
    return columns_block({name: [sample[name] for sample in samples] for name in schema}, schema, where)


def columns_block(columns: Mapping[str, list[Any]], schema: Mapping[str, ColumnType], where: str) -> dict[str, Any]:
    """Each column's values (a list, one per row) as one block: :func:`rows_block` of rows given by column."""
    block: dict[str, Any] = {}
    for name, ctype in schema.items():
        values = columns[name]
        if not isinstance(ctype, FIXED_SIZE):
            block[name] = values
            continue
        shape = (len(values), *ctype.shape) if isinstance(ctype, Tensor) else (len(values),)
        try:
            types = set(map(type, values))
            arrays: list[Any] = values if types <= {np.ndarray} or types <= {int, float, bool} else [
                as_array(v) if not isinstance(v, (int, float, np.generic)) else v for v in values]
            block[name] = np.stack(arrays) if values and isinstance(ctype, Tensor) else np.asarray(arrays).reshape(shape)
        except (ValueError, TypeError) as exc:
            raise SchemaError(f"{where}, column {name!r}: the values do not stack into {ctype.describe()} ({exc})") from None
    return block


def _fixed_arrow(ctype: Any, parts: list[np.ndarray]) -> pa.Array:
    """One shard's fixed-size column from its blocks: one concatenation, no Python object per row."""
    array = np.concatenate(parts) if len(parts) != 1 else parts[0]
    if not isinstance(ctype, Tensor):
        return pa.array(array, type=arrow_type(ctype))
    flat = np.ascontiguousarray(array).reshape(-1)
    storage = pa.FixedSizeListArray.from_arrays(pa.array(flat), max(1, math.prod(ctype.shape)))
    return pa.ExtensionArray.from_storage(arrow_type(ctype), storage)


class BlockShards(ShardWriter):
    """A :class:`ShardWriter` fed blocks of rows (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fixed = [(name, ctype) for name, ctype in self.schema if isinstance(ctype, FIXED_SIZE)]
        self.variable = [(name, builder) for name, builder in self.builders if not isinstance(self.schema[name], FIXED_SIZE)]
        self.fixed_row_bytes = sum(ctype.row_bytes for _, ctype in self.fixed)
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name, _ in self.fixed}
        self.position = 0  # rows added before this block: the sample numbers errors name

    def add(self, block: Mapping[str, Any], rows: int, where: str = "a block") -> None:
        """Add ``rows`` rows; ``where`` names the block in errors."""
        missing = sorted(set(self.names) - set(block))
        if missing:
            raise SchemaError(f"{where}: no values for column(s) {missing}")
        fixed = {name: fixed_block(name, ctype, block[name], rows, where) for name, ctype in self.fixed}
        ends = self._row_ends(block, rows)
        start = 0
        while start < rows:
            if ends is not None:  # the same cut, from the bytes each row adds, told by the builders at once
                base = int(ends[start - 1]) if start else 0
                end = min(rows, start + 1 + int(np.searchsorted(ends[start:] - base, self.shard_size - self.bytes)))
                for name, builder in self.variable:
                    builder.extend(block[name][start:end])
                self.bytes += int(ends[end - 1]) - base
            elif self.variable:  # the builders count what each value adds, as the per-sample writer does
                end = start
                while end < rows and self.bytes < self.shard_size:
                    for name, builder in self.variable:
                        self.bytes += builder.append(block[name][end], self.position + end)
                    self.bytes += self.fixed_row_bytes
                    end += 1
            else:
                room = self.shard_size - self.bytes
                end = min(rows, start + max(1, -(-room // max(1, self.fixed_row_bytes))))
                self.bytes += (end - start) * self.fixed_row_bytes
            for name, _ in self.fixed:
                self.parts[name].append(fixed[name][start:end])
            self.rows += end - start
            start = end
            if self.bytes >= self.shard_size:
                self.flush()
        self.position += rows

    def _row_ends(self, block: Mapping[str, Any], rows: int) -> np.ndarray | None:
        """The bytes rows ``0..i`` of ``block`` add, for each ``i``, if every variable-size column's builder can tell
        them without appending (plain str or bytes values); None otherwise (and without such columns)."""
        if not self.variable or not rows:
            return None
        total = np.full(rows, self.fixed_row_bytes, dtype=np.int64)
        for name, builder in self.variable:
            values = block[name]
            sizes = builder.sizes(values) if isinstance(values, list) and len(values) == rows else None
            if sizes is None:
                return None
            total += np.asarray(sizes, dtype=np.int64)
        return np.cumsum(total)

    def flush(self) -> None:
        if self.rows == 0:
            return
        fixed = {name: _fixed_arrow(ctype, self.parts[name]) for name, ctype in self.fixed}
        variable = {name: builder.finish() for name, builder in self.variable}
        arrays = [fixed[name] if name in fixed else variable[name] for name in self.schema.names]
        self.parts = {name: [] for name, _ in self.fixed}
        self.write_batch(pa.record_batch(arrays, schema=self.arrow_schema))


class BlockWriter(Writer):
    """:class:`chute.Writer` (every option of it) whose shards are written by :class:`BlockShards`."""

    part_type = BlockShards


def write_blocks(
    blocks: Iterable[Block], dst: str | os.PathLike, *, progress: Progress, **options: Unpack[StoreOptions],
) -> chute.Dataset:
    """Write ``(block, rows, where)`` triples to a dataset at ``dst`` (a folder or a URL), commit it and open it.

    ``options`` are :class:`chute.Writer`'s (``schema`` is needed: a block's columns are typed before it is read).
    """
    o = store_options(options, "write_blocks")
    if o["schema"] is None:
        raise TypeError("write_blocks needs schema=: the columns' types before the first block")
    writer = BlockWriter(dst, **options)
    shards = writer.part
    assert isinstance(shards, BlockShards)  # made by the writer (part_type), with the writer's own options
    where = ""
    with progress:
        try:
            for block, rows, where in blocks:
                shards.add(block, rows, where)
                progress.update(rows)
            writer.close()
        except SchemaError as exc:  # a value a builder refused: "sample N" is a row of the dataset; say where it came from
            writer.abort()
            if type(exc) is not SchemaError or not where or where in str(exc):
                raise  # an InferenceError keeps its fix for the converter to render
            raise SchemaError(f"{exc} [while writing {where}]") from None
        except BaseException:
            writer.abort()
            raise
    return open_dataset(writer.url, storage_options=o["storage_options"])
