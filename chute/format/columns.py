"""How each kind of column is read: its shard buffers, and a whole batch of its rows at once.

A mapped shard exposes each column as the buffers the native kernels
(``chute._native``) read: the rows of a fixed-size column back to back, or
the offsets and data of a variable one. A :class:`ColumnReader` turns the rows
of a batch, spread over any number of shards, into one batch value with one or
two native calls, never one call per sample:

==========  ============================================  ===============================
kind        Python values (default)                        columnar (``columnar=True``)
==========  ============================================  ===============================
bytes       list of bytes                                  ``pyarrow.LargeBinaryArray``
string      list of str                                    ``pyarrow.LargeStringArray``
json        list of decoded values (one ``json.loads``)    ``LargeStringArray`` of JSON text
map         list of dicts, keys in stored order            ``pyarrow.MapArray``
ragged      list of tensors (views of one buffer)          ``pyarrow.LargeListArray``
nullable    the inner type's batch when no row is None,    the inner type's Arrow array
            else a list with None for the missing rows     with nulls
==========  ============================================  ===============================

Fixed-size columns (tensors, scalars) are gathered by the reader itself into
output blocks (one native call for all of them).

Every structural problem the kernels find (offsets out of bounds, invalid
UTF-8, ...) comes back as ``_native.CorruptShard`` naming the shard and row;
the reader turns it into a :class:`chute.ShardError`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from chute import _native
from chute.format.schema import Bytes, ColumnType, Json, Map, Nullable, Ragged, Scalar, String, Tensor, storage_dtype

Unmapped = _native.Unmapped
CorruptShard = _native.CorruptShard

_TORCH_DTYPES = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "uint16": torch.uint16, "int16": torch.int16,
    "uint32": torch.uint32, "int32": torch.int32, "uint64": torch.uint64, "int64": torch.int64,
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a chute dtype name."""
    return _TORCH_DTYPES[dtype]


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a batch of chute dtype ``dtype`` is built in (``bool`` as numpy bool, ``bfloat16`` as uint16)."""
    return np.dtype(np.bool_) if dtype == "bool" else storage_dtype(dtype)


# --------------------------------------------------------------------------- shard buffers


def _values(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """A zero-copy numpy view of a primitive Arrow array without nulls (bools unpacked to uint8, a copy).

    ``pa.Array.to_numpy`` imports pandas on first use (docs/benchmarks.md, design figures); this reads the buffer.
    """
    data = array.buffers()[1]
    if pa.types.is_boolean(array.type):
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[array.offset : array.offset + len(array)].astype(np.uint8)
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _offsets(array: pa.Array, dtype: str = "int64") -> np.ndarray:
    """The ``len + 1`` offsets of a list-like Arrow array (its own slice of the offsets buffer)."""
    dt = np.dtype(dtype)
    return np.frombuffer(array.buffers()[1], dtype=dt, count=len(array) + 1, offset=array.offset * dt.itemsize)


def _var(array: pa.Array) -> tuple[np.ndarray, pa.Buffer | bytes]:
    """``(offsets, data)`` of a large_binary / large_string array."""
    data = array.buffers()[2]
    return _offsets(array), data if data is not None else b""


def fixed_source(column: pa.Array, ctype: Tensor | Scalar) -> np.ndarray:
    """The rows of a fixed-size column back to back, as bytes (zero-copy but for bools)."""
    if isinstance(ctype, Tensor):
        storage = column.storage
        size = storage.type.list_size
        values = _values(storage.values, storage_dtype(ctype.dtype))
        values = values[storage.offset * size : (storage.offset + len(storage)) * size]
    else:
        values = _values(column, storage_dtype(ctype.dtype))
    return values.view(np.uint8)


# --------------------------------------------------------------------------- batch readers


class ColumnReader:
    """Reads one variable-size column for a batch: ``source`` per shard, ``read`` per batch."""

    def __init__(self, name: str, ctype: ColumnType) -> None:
        self.name, self.ctype = name, ctype

    def source(self, column: pa.Array) -> Any:
        """What the kernels read of this column in one shard."""
        raise NotImplementedError

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        """The batch value of rows ``indices``."""
        raise NotImplementedError


class BinaryReader(ColumnReader):
    """bytes and str columns (and JSON text, for :class:`JsonReader`)."""

    def source(self, column: pa.Array) -> Any:
        return _var(column)

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        if columnar:
            offs, data = _native.gather_binary(indices, offsets, sources)
            kind = pa.large_binary() if isinstance(self.ctype, Bytes) else pa.large_string()
            return pa.Array.from_buffers(kind, len(indices), [None, pa.py_buffer(offs), pa.py_buffer(data)])
        return _native.take_objects(indices, offsets, sources, "bytes" if isinstance(self.ctype, Bytes) else "str")


class JsonReader(BinaryReader):
    """JSON columns: the batch's texts joined into one JSON array, decoded with one ``json.loads``."""

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        offs, data = _native.gather_binary(indices, offsets, sources)
        if columnar:
            return pa.Array.from_buffers(pa.large_string(), len(indices), [None, pa.py_buffer(offs), pa.py_buffer(data)])
        return loads(offs, data, indices, offsets)


class MapReader(ColumnReader):
    """map columns: dicts built in C straight from the shards (JSON values decoded in one call)."""

    ctype: Map

    def source(self, column: pa.Array) -> Any:
        entries = column.values  # the whole struct child: the entry offsets index into it
        keys, items = entries.field(0), entries.field(1)
        values: Any
        if self.ctype.value in ("int64", "float64"):
            values_offsets, values = None, _values(items, np.dtype(self.ctype.value)).view(np.uint8)
        else:
            values_offsets, values = _var(items)
        key_offsets, key_data = _var(keys)
        return (_offsets(column, "int32"), key_offsets, key_data, values_offsets, values)

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        value = self.ctype.value
        if columnar or value == "json":
            entries, key_offsets, key_data, value_offsets, value_data = _native.gather_map(indices, offsets, sources)
            if not columnar:
                values = loads(value_offsets, value_data, indices, offsets, np.frombuffer(entries, np.int32))
                return _native.dicts_from_values(entries, key_offsets, key_data, values)
            count = len(key_offsets) // 8 - 1
            keys = pa.Array.from_buffers(pa.large_string(), count, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)])
            if value in ("int64", "float64"):
                items = pa.Array.from_buffers(pa.from_numpy_dtype(np.dtype(value)), count, [None, pa.py_buffer(value_data)])
            else:
                kind = pa.large_binary() if value == "bytes" else pa.large_string()
                items = pa.Array.from_buffers(kind, count, [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)])
            return pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(indices) + 1, [None, pa.py_buffer(entries)]), keys, items)
        return _native.take_dicts(indices, offsets, sources, _TAKE_KIND[value])


#: a map column's value type -> what ``_native.take_dicts`` builds its values as (JSON is decoded apart)
_TAKE_KIND: dict[str, Literal["str", "bytes", "int64", "float64"]] = {
    "string": "str", "bytes": "bytes", "int64": "int64", "float64": "float64"}


class RaggedReader(ColumnReader):
    """ragged columns: the batch's values gathered into one buffer, split into per-sample views."""

    ctype: Ragged

    def __init__(self, name: str, ctype: Ragged) -> None:
        super().__init__(name, ctype)
        self.numpy = storage_dtype(ctype.dtype)
        self.torch = torch_dtype(ctype.dtype)

    def source(self, column: pa.Array) -> Any:
        if self.ctype.ndim == 1:
            lists, shapes = column, None
        else:
            lists = column.field("data")
            shape = column.field("shape")
            shapes = _values(shape.values, np.dtype(np.int32))[shape.offset * self.ctype.ndim : (shape.offset + len(shape)) * self.ctype.ndim]
            shapes = shapes.view(np.uint8)
        values = lists.values
        data = values.buffers()[1]
        offs = _offsets(lists)
        if values.offset:  # not written by chute: make the offsets absolute in the data buffer
            offs = offs + values.offset
        return (offs, data if data is not None else b""), shapes

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        lists = [None if s is None else s[0] for s in sources]
        offs, data = _native.gather_binary(indices, offsets, lists, self.numpy.itemsize)
        ndim = self.ctype.ndim
        shapes = None
        if ndim > 1:
            shape_rows = np.empty((len(indices), ndim), np.int32)
            _native.gather(indices, offsets, ((sources_shapes(sources), shape_rows, 4 * ndim),))
            shapes = shape_rows
        if columnar:
            arrow = pa.from_numpy_dtype(self.numpy)
            values = pa.Array.from_buffers(arrow, len(data) // self.numpy.itemsize, [None, pa.py_buffer(data)])
            lists = pa.Array.from_buffers(pa.large_list(arrow), len(indices), [None, pa.py_buffer(offs)], children=[values])
            if shapes is None:
                return lists
            return pa.StructArray.from_arrays(
                [lists, pa.FixedSizeListArray.from_arrays(pa.array(shapes.reshape(-1)), ndim)], names=["data", "shape"]
            )
        flat = torch.from_numpy(np.frombuffer(data, self.numpy).copy())  # the batch's own, writable memory
        if flat.dtype != self.torch:  # bool, bfloat16: stored as uint8, uint16
            flat = flat.view(self.torch)
        lengths = np.diff(np.frombuffer(offs, np.int64)).tolist()
        parts = list(torch.split(flat, lengths)) if lengths else []
        if shapes is not None:
            parts = [part.view(shape) for part, shape in zip(parts, shapes.tolist())]
        return parts


class NullableReader(ColumnReader):
    """Nullable columns: a validity byte per row gathered beside the inner column's rows.

    What ``default_collate`` users expect: a batch with no None in it is the
    inner type's batch (a stacked tensor for a tensor or scalar column); a batch
    with some is a list holding None for those rows and, for the others, what
    the inner type gives one row (a tensor, str, bytes, dict).
    """

    ctype: Nullable

    def __init__(self, name: str, ctype: Nullable) -> None:
        super().__init__(name, ctype)
        inner = ctype.value
        #: the inner type when it is fixed-size (gathered here), else None (read by ``self.inner``)
        self.fixed_type = inner if isinstance(inner, (Tensor, Scalar)) else None
        self.fixed = self.fixed_type is not None
        self.inner: ColumnReader | None = None
        if isinstance(inner, (Tensor, Scalar)):
            self.shape = tuple(inner.shape) if isinstance(inner, Tensor) else ()
            self.row_bytes = inner.row_bytes
            self.numpy = numpy_dtype(inner.dtype)
            self.torch = torch_dtype(inner.dtype)
        else:
            self.inner = reader_for(name, inner)

    def source(self, column: pa.Array) -> Any:
        bitmap = column.buffers()[0] if not isinstance(column, pa.ExtensionArray) else column.storage.buffers()[0]
        if bitmap is None or column.null_count == 0:
            valid = np.ones(len(column), dtype=np.uint8)
        else:
            bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
            valid = bits[column.offset : column.offset + len(column)].astype(np.uint8)
        if self.inner is not None:
            inner = self.inner.source(column)
        else:
            assert self.fixed_type is not None  # set whenever inner is not
            inner = fixed_source(column, self.fixed_type)
        return valid, inner

    def read(self, indices: np.ndarray, offsets: np.ndarray, sources: list, columnar: bool) -> Any:
        n = len(indices)
        valid = np.empty(n, dtype=np.uint8)
        inner_sources = [None if s is None else s[1] for s in sources]
        columns = [([None if s is None else s[0] for s in sources], valid, 1)]
        if self.fixed:
            rows = np.empty((n, *self.shape), dtype=self.numpy)
            columns.append((inner_sources, rows.view(np.uint8) if rows.dtype == np.bool_ else rows, self.row_bytes))
        _native.gather(indices, offsets, tuple(columns))
        present = valid.astype(bool)
        if self.inner is None:
            value: Any = torch.from_numpy(rows)
            if value.dtype != self.torch:  # bfloat16, stored as uint16
                value = value.view(self.torch)
        else:
            value = self.inner.read(indices, offsets, inner_sources, columnar)
        if columnar and not self.fixed:
            from chute.format.builders import with_nulls

            return value if present.all() else with_nulls(value, present)
        if present.all():
            return value
        return [value[j] if ok else None for j, ok in enumerate(present.tolist())]


def sources_shapes(sources: list) -> list:
    return [None if s is None else s[1] for s in sources]


def reader_for(name: str, ctype: ColumnType) -> ColumnReader:
    """The reader of a variable-size column."""
    if isinstance(ctype, Json):
        return JsonReader(name, ctype)
    if isinstance(ctype, (Bytes, String)):
        return BinaryReader(name, ctype)
    if isinstance(ctype, Map):
        return MapReader(name, ctype)
    if isinstance(ctype, Ragged):
        return RaggedReader(name, ctype)
    if isinstance(ctype, Nullable):
        return NullableReader(name, ctype)
    raise AssertionError(f"not a variable-size column type: {ctype!r}")


class JsonError(ValueError):
    """JSON text that does not parse: ``shard`` and ``row`` of the first bad row (``-1`` if not found)."""

    def __init__(self, message: str, shard: int, row: int) -> None:
        super().__init__(message)
        self.shard, self.row = shard, row


def loads(offs: bytes, data: bytes, indices: np.ndarray, offsets: np.ndarray, entries: np.ndarray | None = None) -> list[Any]:
    """Every JSON text of a batch (rows, or map entries), decoded with one ``json.loads`` of them joined.

    A failure (or a count that does not match, which only corrupted texts can
    give) is looked for row by row, so the error names the shard and row.
    """
    count = len(offs) // 8 - 1
    try:
        values = json.loads(_native.join_json(offs, data))
        if isinstance(values, list) and len(values) == count:
            return values
    except (ValueError, RecursionError):
        pass
    o = np.frombuffer(offs, np.int64)
    for k in range(count):
        try:
            json.loads(data[o[k] : o[k + 1]])
        except (ValueError, RecursionError) as exc:
            position = k if entries is None else int(np.searchsorted(entries, k, side="right")) - 1
            global_row = int(indices[position])
            shard = int(np.searchsorted(offsets, global_row, side="right")) - 1
            raise JsonError(f"invalid JSON text ({type(exc).__name__}: {exc})", shard, global_row - int(offsets[shard])) from None
    raise JsonError("the JSON texts of the batch do not decode to one value per row", -1, -1)
