"""Mapping Arrow columns (Parquet, Arrow/Feather, Hugging Face) onto chute column types.

==============================================  =================================
Arrow type                                      chute column
==============================================  =================================
bool, int*, uint*, float*                       Scalar of that dtype
string, large_string                            String
binary, large_binary, fixed_size_binary         Bytes
struct<bytes, path> (Hugging Face Image/Audio)  Bytes: the encoded file
(fixed_size_)list nested lists of numbers       Tensor if every row has the same
                                                shape, else Ragged (ndim = depth)
arrow.fixed_shape_tensor                        Tensor
map<string, V>                                  Map (string/bytes/int64/float64/json)
dictionary<V>                                   as V (decoded)
anything else (struct, list<string>, dates...)  Json
==============================================  =================================

Whether a nested list column has one shape or many cannot be told from its type,
so :func:`scan_shapes` reads those columns once before writing (only those
columns; a list column whose rows are not rectangular falls back to Json).
Columns are converted one record batch at a time, with numpy doing the
reshaping, so memory stays bounded by the batch size.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chute.errors import ChuteError
from chute.format.schema import Bytes, ColumnType, Json, Map, Nullable, Ragged, Scalar, String, Tensor

ROWS_PER_SLICE = 1024
"""Rows converted to Python values at a time."""


@dataclasses.dataclass(frozen=True)
class Column:
    """How one Arrow column becomes one chute column."""

    name: str
    ctype: ColumnType
    convert: Callable[[pa.Array], Sequence[Any]]  # one batch's column -> one value per row
    nullable: bool = False  # Json and Nullable columns store nulls (JSON null, None); others cannot
    source: str = ""  # a struct's field: the top-level Arrow column it is in ...
    path: tuple[str, ...] = ()  # ... and the field names down to it


class ColumnError(ChuteError):
    """A column's values cannot be converted (nulls, non-rectangular arrays)."""


# --------------------------------------------------------------------------- type plumbing


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)


def _dtype_name(t: pa.DataType) -> str:
    return "bool" if pa.types.is_boolean(t) else np.dtype(t.to_pandas_dtype()).name


def _unwrap(t: pa.DataType) -> tuple[pa.DataType, Callable[[pa.Array], pa.Array]]:
    """The type the column's values really have, and how to get an array of it.

    Dictionary-encoded columns (categoricals) are decoded; extension types other
    than fixed_shape_tensor (Hugging Face ArrayND, say) are read through their storage.
    """
    if pa.types.is_dictionary(t):
        inner, get = _unwrap(t.value_type)
        return inner, lambda a: get(a.dictionary_decode())
    if isinstance(t, pa.ExtensionType) and not isinstance(t, pa.FixedShapeTensorType):
        inner, get = _unwrap(t.storage_type)
        return inner, lambda a: get(a.storage)
    return t, lambda a: a


def list_levels(t: pa.DataType) -> tuple[list[pa.DataType], pa.DataType]:
    """The list types from the outside in, and the element type inside them."""
    levels = []
    while _is_list(t):
        levels.append(t)
        t = t.value_type
    return levels, t


def is_numeric_nested(t: pa.DataType) -> bool:
    """A (possibly nested) list of numbers: a tensor or ragged candidate."""
    levels, inner = list_levels(t)
    return bool(levels) and _is_numeric(inner)


def needs_shape_scan(t: pa.DataType) -> bool:
    """Nested numeric lists with a variable-size level: one shape or many? Only the data tells."""
    t, _ = _unwrap(t)
    levels, _ = list_levels(t)
    return is_numeric_nested(t) and not all(pa.types.is_fixed_size_list(level) for level in levels)


def is_file_struct(t: pa.DataType) -> bool:
    """Hugging Face's Image/Audio storage: ``struct<bytes: binary, path: string>``."""
    if not pa.types.is_struct(t) or t.num_fields != 2:
        return False
    fields = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
    return (
        set(fields) == {"bytes", "path"}
        and (pa.types.is_binary(fields["bytes"]) or pa.types.is_large_binary(fields["bytes"]))
        and (pa.types.is_string(fields["path"]) or pa.types.is_large_string(fields["path"]))
    )


# --------------------------------------------------------------------------- shapes


def nested_layout(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """The flat element values of a nested numeric list array and each row's shape.

    Returns ``(values, shapes)`` with ``shapes[i]`` the shape of row ``i`` (an
    ``(n, depth)`` int64 array), or ``shapes=None`` when some row is not rectangular
    (its inner lists differ in length). Raises ColumnError on nulls.
    """
    n = len(array)
    owner = np.arange(n)  # the row each element at the current level belongs to
    dims = []
    level = array
    rectangular = True
    while _is_list(level.type):
        if level.null_count:
            raise ColumnError("it holds null lists; chute arrays cannot have missing values")
        lengths = pc.list_value_length(level).to_numpy(zero_copy_only=False).astype(np.int64)
        dim = np.zeros(n, dtype=np.int64)
        if len(lengths):
            # owner is sorted, so each row's elements are one run: compare min and max per run
            starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
            low = np.minimum.reduceat(lengths, starts)
            if rectangular and (low != np.maximum.reduceat(lengths, starts)).any():
                rectangular = False
            dim[owner[starts]] = low
        dims.append(dim)
        owner = np.repeat(owner, lengths)
        level = level.flatten()
    if level.null_count:
        raise ColumnError("it holds null elements; chute arrays cannot have missing values")
    values = level.to_numpy(zero_copy_only=False)
    return values, (np.stack(dims, axis=1) if rectangular else None)


@dataclasses.dataclass
class ShapeScan:
    """What a pass over a nested list column found: its shapes (up to two) or non-rectangular rows."""

    shapes: set[tuple[int, ...]] = dataclasses.field(default_factory=set)
    rectangular: bool = True

    def add(self, array: pa.Array) -> None:
        if not self.rectangular or len(self.shapes) > 1 or not len(array):
            return  # already decided: ragged or Json
        _, shapes = nested_layout(array)
        if shapes is None:
            self.rectangular = False
            return
        for shape in np.unique(shapes, axis=0):
            self.shapes.add(tuple(int(d) for d in shape))


def scan_shapes(schema: pa.Schema, batches: Iterable[tuple[pa.RecordBatch, str]]) -> dict[str, ShapeScan]:
    """One pass over the variable-size nested numeric columns of ``batches``: their shapes."""
    names = [f.name for f in schema if needs_shape_scan(f.type)]
    scans = {name: ShapeScan() for name in names}
    if not names:
        return scans
    for batch, where in batches:
        for name in names:
            _, get = _unwrap(schema.field(name).type)
            try:
                scans[name].add(get(batch.column(name)))
            except ColumnError as exc:
                raise ChuteError(
                    f"{where}: column {name!r}: {exc}; fill them before converting, or leave the column out "
                    "(columns= / chute convert --columns)"
                ) from None
    return scans


# --------------------------------------------------------------------------- planning


def plan_columns(schema: pa.Schema, scans: dict[str, ShapeScan], *, where: str) -> list[Column]:
    """The chute column each Arrow field becomes, and how to convert its values."""
    columns = []
    for field in schema:
        if _flat_struct(field.type):
            columns.extend(_struct_columns(field.name, field.name, (), field.type))
            continue
        column = _plan_column(field.name, field.type, scans.get(field.name))
        columns.append(column)
    if not columns:
        raise ChuteError(f"{where} has no columns; there is nothing to convert")
    return columns


def _flat_struct(t: pa.DataType) -> bool:
    """A struct (not an image/audio file) whose fields, at every depth, are numbers, strings, bytes or structs:
    its fields become columns ``parent.child`` (Parquet structs, Hugging Face dict features)."""
    if not pa.types.is_struct(t) or is_file_struct(t) or t.num_fields == 0:
        return False
    for k in range(t.num_fields):
        child = t.field(k).type
        flat = _flat_struct(child) or _is_numeric(child) or pa.types.is_string(child) or pa.types.is_large_string(child) \
            or pa.types.is_binary(child) or pa.types.is_large_binary(child)
        if not flat:
            return False
    return True


def _struct_columns(name: str, source: str, path: tuple[str, ...], t: pa.StructType) -> list[Column]:
    """One nullable column per leaf field of struct ``t`` (a missing struct or field is None)."""
    out = []
    for k in range(t.num_fields):
        field = t.field(k)
        child_name, child_path = f"{name}.{field.name}", (*path, field.name)
        if pa.types.is_struct(field.type):
            out.extend(_struct_columns(child_name, source, child_path, field.type))
            continue
        plain = _plan_column(child_name, field.type, None)
        assert not isinstance(plain.ctype, (Json, Nullable))  # _flat_struct admits numbers, strings and bytes only
        out.append(dataclasses.replace(plain, ctype=Nullable(plain.ctype), nullable=True, source=source, path=child_path))
    return out


def _plan_column(name: str, arrow_type: pa.DataType, scan: ShapeScan | None) -> Column:
    t, get = _unwrap(arrow_type)

    def via(convert: Callable[[pa.Array], Sequence[Any]]) -> Callable[[pa.Array], Sequence[Any]]:
        return lambda a: convert(get(a))

    if _is_numeric(t):
        return Column(name, Scalar(_dtype_name(t)), via(lambda a: a.to_pylist()))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Column(name, String(), via(lambda a: a.to_pylist()))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return Column(name, Bytes(), via(lambda a: a.to_pylist()))
    if isinstance(t, pa.FixedShapeTensorType):
        ctype = Tensor(_dtype_name(t.value_type), tuple(t.shape))
        return Column(name, ctype, via(lambda a: list(a.to_numpy_ndarray())))
    if is_file_struct(t):
        return Column(name, Bytes(), via(_file_bytes))
    if is_numeric_nested(t):
        return _plan_nested(name, t, get, scan)
    if pa.types.is_map(t) and (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
        return Column(name, Map(_map_value_kind(t.item_type)), via(_map_values))
    if pa.types.is_null(t):
        raise ChuteError(
            f"column {name!r} has Arrow type null (every value missing); leave it out (columns= / chute convert --columns)"
        )
    return Column(name, Json(), via(lambda a: [to_jsonable(v) for v in a.to_pylist()]), nullable=True)


def _plan_nested(name: str, t: pa.DataType, get: Callable[[pa.Array], pa.Array], scan: ShapeScan | None) -> Column:
    levels, inner = list_levels(t)
    dtype = _dtype_name(inner)
    if all(pa.types.is_fixed_size_list(level) for level in levels):
        shape = tuple(level.list_size for level in levels)
    elif scan is None:
        raise AssertionError(f"column {name!r} needs a shape scan")
    elif not scan.rectangular:
        return Column(name, Json(), lambda a: [to_jsonable(v) for v in get(a).to_pylist()], nullable=True)
    elif len(scan.shapes) == 1:
        shape = next(iter(scan.shapes))
    else:
        ctype = Ragged(dtype, len(levels))
        return Column(name, ctype, lambda a: _ragged_rows(get(a)))
    if 0 in shape:  # an always-empty array: stored ragged rather than as a zero-byte tensor
        return Column(name, Ragged(dtype, len(levels)), lambda a: _ragged_rows(get(a)))
    return Column(name, Tensor(dtype, shape), lambda a: _tensor_rows(get(a), shape))


def _map_value_kind(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_integer(t):
        return "int64"
    if pa.types.is_floating(t):
        return "float64"
    return "json"


# --------------------------------------------------------------------------- value conversion


def _tensor_rows(array: pa.Array, shape: tuple[int, ...]) -> list[np.ndarray]:
    values, shapes = nested_layout(array)
    if shapes is None or (len(shapes) and not (shapes == np.asarray(shape)).all()):
        raise ColumnError(f"a row's shape differs from {shape}, the shape of every other row")
    return list(values.reshape(len(array), *shape))


def _ragged_rows(array: pa.Array) -> list[np.ndarray]:
    values, shapes = nested_layout(array)
    if shapes is None:
        raise ColumnError("a row is not a rectangular array (its inner lists differ in length)")
    ends = np.cumsum(np.prod(shapes, axis=1))
    starts = ends - np.prod(shapes, axis=1)
    return [values[a:b].reshape(shape) for a, b, shape in zip(starts.tolist(), ends.tolist(), shapes.tolist())]


def _map_values(array: pa.Array) -> list[dict[str, Any]]:
    return [dict(row) for row in array.to_pylist()]


def _file_bytes(array: pa.StructArray) -> list[bytes]:
    """The ``bytes`` of each row, read from ``path`` when only the path is stored."""
    index = {array.type.field(i).name: i for i in range(array.type.num_fields)}
    children = array.flatten()
    data = children[index["bytes"]].to_pylist()
    paths = children[index["path"]].to_pylist()
    out = []
    for value, path in zip(data, paths):
        if value is None:
            if path is None:
                raise ColumnError("a row has neither bytes nor a path")
            try:
                with open(path, "rb") as f:
                    value = f.read()
            except OSError as exc:
                raise ColumnError(f"a row stores only the path {path}, which cannot be read ({exc})") from None
        out.append(value)
    return out


def to_jsonable(value: Any) -> Any:
    """``value`` (from ``to_pylist``) as plain JSON data.

    Dates and times become ISO 8601 strings, decimals strings, durations seconds,
    bytes base64 strings, map entries ``[key, value]`` pairs, and NaN/inf null.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    return str(value)


def batch_samples(
    batch: pa.RecordBatch, columns: list[Column], *, where: str, first_row: int
) -> Iterator[tuple[dict[str, Any], str]]:
    """``(sample, origin)`` for each row of ``batch``, converted slice by slice.

    ``where`` names the file (or dataset) and ``first_row`` is the row number of the
    batch's first row in it, so errors point at a row.
    """
    names = [c.name for c in columns]
    for start in range(0, batch.num_rows, ROWS_PER_SLICE):
        part = batch.slice(start, ROWS_PER_SLICE)
        row0 = first_row + start
        values = [_column_values(part, c, where, row0) for c in columns]
        for i, row in enumerate(zip(*values)):
            yield dict(zip(names, row)), f"{where} row {row0 + i}"


def number_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(row number of the batch's first row, batch)`` for each batch."""
    row = 0
    for batch in batches:
        yield row, batch
        row += batch.num_rows


def _column_values(batch: pa.RecordBatch, column: Column, where: str, row0: int) -> Sequence[Any]:
    array = batch.column(column.source or column.name)
    for key in column.path:  # a struct's field, with the struct's own nulls carried down
        array = array.flatten()[array.type.get_field_index(key)]
    if array.null_count and not column.nullable:
        first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise ChuteError(
            f"{where} row {row0 + first}: column {column.name!r} is null ({array.null_count} null(s) in rows "
            f"{row0}..{row0 + len(array) - 1}); chute columns cannot hold missing values: fill them "
            "(pyarrow.compute.fill_null) or leave the column out (columns= / chute convert --columns)"
        )
    try:
        return column.convert(array)
    except ColumnError as exc:
        raise ChuteError(f"{where} rows {row0}..{row0 + len(array) - 1}: column {column.name!r}: {exc}") from None


def check_same_schema(first: pa.Schema, other: pa.Schema, first_where: str, other_where: str) -> None:
    """Raise naming the first differing column unless two files have the same columns and types."""
    if first.remove_metadata().equals(other.remove_metadata()):
        return
    a = {f.name: f.type for f in first}
    b = {f.name: f.type for f in other}
    if list(a) != list(b):
        detail = f"columns {list(a)} vs {list(b)}"
    else:
        name = next(n for n in a if a[n] != b[n])
        detail = f"column {name!r} is {a[name]} vs {b[name]}"
    raise ChuteError(
        f"{other_where} does not have the same schema as {first_where} ({detail}); convert them separately"
    )
