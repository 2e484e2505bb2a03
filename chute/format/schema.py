"""Column types, the dataset schema, and schema inference from samples.

A chute schema is an ordered list of named columns, each of one of seven kinds
(any of them but json may be wrapped in :class:`Nullable`, see below):

========  =====================================  ===========================================
kind      Python value written                   Arrow storage
========  =====================================  ===========================================
tensor    array of one fixed shape and dtype     ``arrow.fixed_shape_tensor`` (one buffer)
ragged    array whose shape varies per sample    ``large_list<T>`` (1-D) or
                                                 ``struct<data: large_list<T>, shape: ...>``
scalar    int, float, bool, numpy scalar          a primitive column
bytes     bytes-like                             ``large_binary``
string    str                                    ``large_string``
map       dict of str to str/bytes/int/float     ``map<large_string, V>``
json      any JSON-serialisable value            ``large_string`` holding JSON text
========  =====================================  ===========================================

A :class:`Nullable` column holds ``None`` in some rows (a key missing from some
samples): its Arrow field is nullable and those rows are Arrow nulls over a zeroed
(or empty) value of the inner type. ``docs/format.md`` is the authoritative
description of the layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Union

import numpy as np
import pyarrow as pa

from chute.errors import SchemaError

# dtype name -> (numpy storage dtype, arrow storage type). ``bool`` and ``bfloat16``
# are stored as uint8 / uint16 so that their buffers are plain bytes that can be
# gathered and viewed without unpacking bits or converting.
_DTYPES: dict[str, tuple[np.dtype, pa.DataType]] = {
    "bool": (np.dtype(np.uint8), pa.uint8()),
    "uint8": (np.dtype(np.uint8), pa.uint8()),
    "int8": (np.dtype(np.int8), pa.int8()),
    "uint16": (np.dtype(np.uint16), pa.uint16()),
    "int16": (np.dtype(np.int16), pa.int16()),
    "uint32": (np.dtype(np.uint32), pa.uint32()),
    "int32": (np.dtype(np.int32), pa.int32()),
    "uint64": (np.dtype(np.uint64), pa.uint64()),
    "int64": (np.dtype(np.int64), pa.int64()),
    "float16": (np.dtype(np.float16), pa.float16()),
    "bfloat16": (np.dtype(np.uint16), pa.uint16()),
    "float32": (np.dtype(np.float32), pa.float32()),
    "float64": (np.dtype(np.float64), pa.float64()),
}

DTYPES: tuple[str, ...] = tuple(_DTYPES)
"""The element types a tensor, ragged or scalar column can have."""

_MAP_VALUES = ("string", "bytes", "int64", "float64", "json")


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype whose bytes hold elements of chute dtype ``dtype``."""
    return _DTYPES[dtype][0]


def _check_dtype(dtype: str) -> str:
    if dtype not in _DTYPES:
        raise SchemaError(f"unsupported dtype {dtype!r}; chute columns hold one of: {', '.join(DTYPES)}")
    return dtype


# --------------------------------------------------------------------------- column types


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An array of the same ``shape`` and ``dtype`` in every sample."""

    dtype: str
    shape: tuple[int, ...]
    kind: ClassVar[str] = "tensor"

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.shape or any(d < 0 for d in self.shape):
            raise SchemaError(f"a tensor column needs a shape of one or more non-negative sizes, got {self.shape}")

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * storage_dtype(self.dtype).itemsize

    def describe(self) -> str:
        return f"{self.dtype} tensor of shape {self.shape}"


@dataclasses.dataclass(frozen=True)
class Ragged:
    """An array of ``dtype`` with ``ndim`` dimensions whose sizes vary per sample."""

    dtype: str
    ndim: int = 1
    kind: ClassVar[str] = "ragged"

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if self.ndim < 1:
            raise SchemaError(f"a ragged column needs ndim >= 1, got {self.ndim}")

    def describe(self) -> str:
        return f"{self.dtype} array of {self.ndim} dimension(s), any shape"


@dataclasses.dataclass(frozen=True)
class Scalar:
    """One number (or bool) per sample."""

    dtype: str
    kind: ClassVar[str] = "scalar"

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)

    @property
    def row_bytes(self) -> int:
        return storage_dtype(self.dtype).itemsize

    def describe(self) -> str:
        return f"{self.dtype} scalar"


@dataclasses.dataclass(frozen=True)
class Bytes:
    """A variable-length byte string per sample (an encoded image, a raw record)."""

    kind: ClassVar[str] = "bytes"

    def describe(self) -> str:
        return "bytes"


@dataclasses.dataclass(frozen=True)
class String:
    """A unicode string per sample."""

    kind: ClassVar[str] = "string"

    def describe(self) -> str:
        return "str"


@dataclasses.dataclass(frozen=True)
class Map:
    """A dict of string keys to values of one kind; keys may differ from sample to sample."""

    value: str = "string"
    kind: ClassVar[str] = "map"

    def __post_init__(self) -> None:
        if self.value not in _MAP_VALUES:
            raise SchemaError(f"map values must be one of {_MAP_VALUES}, got {self.value!r}")

    def describe(self) -> str:
        return f"dict of str to {self.value}"


@dataclasses.dataclass(frozen=True)
class Json:
    """Any JSON-serialisable value (nested lists and dicts), stored as JSON text."""

    kind: ClassVar[str] = "json"

    def describe(self) -> str:
        return "JSON value"


_PLAIN = (Tensor, Ragged, Scalar, Bytes, String, Map, Json)


@dataclasses.dataclass(frozen=True)
class Nullable:
    """A column of type ``value`` that holds ``None`` in some rows (a key some samples lack).

    A batch of it is what ``default_collate`` users expect: the batch of the
    inner type when no row of the batch is None, else a list with None where a
    row is missing (and each other row as the inner type gives it).
    """

    value: Union[Tensor, Ragged, Scalar, Bytes, String, Map]
    kind: ClassVar[str] = "nullable"

    def __post_init__(self) -> None:
        if not isinstance(self.value, _PLAIN):
            raise SchemaError(f"Nullable wraps a column type (Tensor, Ragged, Scalar, Bytes, String or Map), got {self.value!r}")
        if isinstance(self.value, Json):
            raise SchemaError("a JSON column holds None (JSON null) already: use chute.Json() without Nullable")

    def describe(self) -> str:
        return f"{self.value.describe()} or None"


ColumnType = Union[Tensor, Ragged, Scalar, Bytes, String, Map, Json, Nullable]
FIXED_SIZE = (Tensor, Scalar)
"""Column types whose rows are fixed-size byte ranges: gathered without Python objects."""

_KINDS: dict[str, type] = {t.kind: t for t in (*_PLAIN, Nullable)}


def column_to_json(name: str, ctype: ColumnType) -> dict[str, Any]:
    """The manifest's description of one column (a nullable one: its inner type's, plus ``"nullable": true``)."""
    if isinstance(ctype, Nullable):
        return {**column_to_json(name, ctype.value), "nullable": True}
    out: dict[str, Any] = {"name": name, "kind": ctype.kind}
    for field in dataclasses.fields(ctype):
        value = getattr(ctype, field.name)
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def column_from_json(entry: Mapping[str, Any]) -> tuple[str, ColumnType]:
    """Inverse of :func:`column_to_json`."""
    try:
        cls = _KINDS[entry["kind"]]
        if cls is Nullable:
            raise KeyError("kind")
        kwargs = {f.name: entry[f.name] for f in dataclasses.fields(cls)}
        ctype = cls(**kwargs)
        if entry.get("nullable", False) is True:
            ctype = Nullable(ctype)
        return str(entry["name"]), ctype
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"invalid column description {dict(entry)!r}: {exc}") from None


def spell(ctype: ColumnType) -> str:
    """The Python expression of a column type, as a user writes it: ``chute.Ragged("float32", 3)``."""
    if isinstance(ctype, Nullable):
        return f"chute.Nullable({spell(ctype.value)})"
    args = [repr(getattr(ctype, field.name)) for field in dataclasses.fields(ctype)]
    if isinstance(ctype, Ragged):
        args[1] = f"ndim={ctype.ndim}"
    return f"chute.{type(ctype).__name__}({', '.join(args)})"


# --------------------------------------------------------------------------- arrow mapping


def arrow_type(ctype: ColumnType) -> pa.DataType:
    """The Arrow storage type of a column (a nullable column's is its inner type's)."""
    if isinstance(ctype, Nullable):
        return arrow_type(ctype.value)
    if isinstance(ctype, Tensor):
        return pa.fixed_shape_tensor(_DTYPES[ctype.dtype][1], list(ctype.shape))
    if isinstance(ctype, Ragged):
        data = pa.large_list(_DTYPES[ctype.dtype][1])
        if ctype.ndim == 1:
            return data
        return pa.struct([("data", data), ("shape", pa.list_(pa.int32(), ctype.ndim))])
    if isinstance(ctype, Scalar):
        return pa.bool_() if ctype.dtype == "bool" else _DTYPES[ctype.dtype][1]
    if isinstance(ctype, Bytes):
        return pa.large_binary()
    if isinstance(ctype, (String, Json)):
        return pa.large_string()
    if isinstance(ctype, Map):
        values = {
            "string": pa.large_string(),
            "json": pa.large_string(),
            "bytes": pa.large_binary(),
            "int64": pa.int64(),
            "float64": pa.float64(),
        }[ctype.value]
        return pa.map_(pa.large_string(), values)
    raise SchemaError(f"not a chute column type: {ctype!r}")


@dataclasses.dataclass(frozen=True)
class Schema:
    """The ordered columns of a dataset."""

    columns: tuple[tuple[str, ColumnType], ...]

    @classmethod
    def from_dict(cls, columns: Mapping[str, ColumnType]) -> Schema:
        for name, ctype in columns.items():
            if not isinstance(name, str) or not name:
                raise SchemaError(f"column names must be non-empty strings, got {name!r}")
            if not isinstance(ctype, tuple(_KINDS.values())):
                raise SchemaError(
                    f"column {name!r}: {ctype!r} is not a column type; use chute.Tensor, Ragged, "
                    "Scalar, Bytes, String, Map, Json or Nullable"
                )
        return cls(tuple(columns.items()))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]

    def __getitem__(self, name: str) -> ColumnType:
        for column, ctype in self.columns:
            if column == name:
                return ctype
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(column == name for column, _ in self.columns)

    def __iter__(self):
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)

    def to_json(self) -> list[dict[str, Any]]:
        return [column_to_json(name, ctype) for name, ctype in self.columns]

    @classmethod
    def from_json(cls, entries: Sequence[Mapping[str, Any]]) -> Schema:
        return cls.from_dict(dict(column_from_json(entry) for entry in entries))

    def to_arrow(self) -> pa.Schema:
        fields = [
            pa.field(
                name,
                arrow_type(ctype),
                nullable=isinstance(ctype, Nullable),
                metadata={b"chute": json.dumps(column_to_json(name, ctype)).encode()},
            )
            for name, ctype in self.columns
        ]
        return pa.schema(fields)

    def __str__(self) -> str:
        return "\n".join(f"{name}: {ctype.describe()}" for name, ctype in self.columns)


# --------------------------------------------------------------------------- inference

_PY_NUMBER = (bool, int, float)


_NUMPY_NAMES = {np.dtype(name): name for name in _DTYPES if name != "bfloat16"}
_NUMPY_NAMES[np.dtype(np.bool_)] = "bool"


def _value_dtype(value: Any) -> str | None:
    """The chute dtype of a numpy/torch dtype, or None if chute cannot store it."""
    if isinstance(value, np.dtype):
        return _NUMPY_NAMES.get(value)
    name = str(value).removeprefix("torch.")
    return name if name in _DTYPES else None


def as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numpy array when it is array-like (ndarray, tensor, list of numbers).

    bfloat16 tensors come back as uint16 arrays holding the same bits (see
    :func:`array_dtype`). Returns None for anything that is not numeric array data.
    """
    module = type(value).__module__
    if isinstance(value, np.ndarray):
        return value
    if module.startswith("torch") and hasattr(value, "detach"):
        import torch

        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.uint16).numpy()
        return tensor.numpy()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, _PY_NUMBER) for v in value):
        if all(isinstance(v, bool) for v in value):
            return np.asarray(value, dtype=np.bool_)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return np.asarray(value, dtype=np.int64)
        return np.asarray(value, dtype=np.float64)
    return None


def array_dtype(value: Any, array: np.ndarray) -> str | None:
    """The chute dtype of an array-like value (torch bfloat16 is reported as bfloat16)."""
    if type(value).__module__.startswith("torch") and str(getattr(value, "dtype", "")) == "torch.bfloat16":
        return "bfloat16"
    return _value_dtype(array.dtype)


def is_int_value(value: Any) -> bool:
    """A Python or numpy integer (not a bool): what an int64 map value or JSON number may be."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number_value(value: Any) -> bool:
    """A Python or numpy integer or float (not a bool)."""
    return is_int_value(value) or isinstance(value, (float, np.floating))


def json_default(value: Any) -> Any:
    """``json.dumps``' ``default=``: numpy scalars (what arrays' reductions return, pickled dicts hold them
    everywhere) as the Python numbers and bools they stand for; anything else is not JSON."""
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _map_value_kind(values: list[Any]) -> str:
    if all(isinstance(v, str) for v in values):
        return "string"
    if all(isinstance(v, (bytes, bytearray, memoryview)) for v in values):
        return "bytes"
    if all(is_int_value(v) for v in values):
        return "int64"
    if all(is_number_value(v) for v in values):
        return "float64"
    return "json"


def _merge_map_values(a: str, b: str) -> str:
    if a == b:
        return a
    if {a, b} == {"int64", "float64"}:
        return "float64"
    return "json"


def _is_json_value(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False, default=json_default)
    except (TypeError, ValueError):
        return False
    return True


def describe_value(value: Any) -> str:
    """A short description of a sample value for error messages."""
    array = as_array(value)
    if array is not None and not isinstance(value, (list, tuple)):
        dtype = array_dtype(value, array) or str(array.dtype)
        return f"{dtype} array of shape {tuple(array.shape)}"
    if isinstance(value, (list, tuple)) and array is not None:
        return f"{type(value).__name__} of {len(value)} numbers"
    if isinstance(value, dict):
        return f"dict with {len(value)} keys"
    return f"{type(value).__name__} {_short_repr(value)}"


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def infer_column(name: str, values: Sequence[Any], first_position: int = 0) -> ColumnType:
    """Infer one column's type from the values it takes in a window of samples.

    An array column whose shape is the same in every sample of the window becomes a
    :class:`Tensor`; one whose shape varies becomes :class:`Ragged`. Dicts become a
    :class:`Map`, so differing keys are all kept.
    """
    first = values[0]

    def fail(position: int, found: Any, expected: str) -> SchemaError:
        return SchemaError(
            f"sample {first_position + position}, column {name!r}: expected {expected} "
            f"(as in sample {first_position}), found {describe_value(found)}; "
            "pass schema= to chute.write to declare the column's type"
        )

    if first is None:
        raise SchemaError(
            f"sample {first_position}, column {name!r}: value is None; chute columns are not "
            "nullable: drop the key from every sample or store a sentinel value"
        )
    if isinstance(first, (bytes, bytearray, memoryview)):
        for i, v in enumerate(values):
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise fail(i, v, "bytes")
        return Bytes()
    if isinstance(first, str):
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise fail(i, v, "str")
        return String()
    if isinstance(first, _PY_NUMBER) or isinstance(first, np.generic):
        dtypes = set()
        for i, v in enumerate(values):
            if isinstance(v, bool) or isinstance(v, np.bool_):
                dtypes.add("bool")
            elif isinstance(v, int):
                dtypes.add("int64")
            elif isinstance(v, float):
                dtypes.add("float64")
            elif isinstance(v, np.generic) and (found := _value_dtype(v.dtype)):
                dtypes.add(found)
            else:
                raise fail(i, v, "a number")
        if len(dtypes) == 1:
            return Scalar(dtypes.pop())
        if dtypes == {"int64", "float64"}:
            return Scalar("float64")
        raise SchemaError(
            f"column {name!r} mixes scalar types {sorted(dtypes)} in samples "
            f"{first_position}..{first_position + len(values) - 1}; convert them to one type "
            "or declare the column with schema="
        )
    if isinstance(first, dict):
        kind = None
        for i, v in enumerate(values):
            if not isinstance(v, dict):
                raise fail(i, v, "a dict")
            if not all(isinstance(k, str) for k in v):
                raise SchemaError(
                    f"sample {first_position + i}, column {name!r}: dict keys must be str, found "
                    f"{sorted({type(k).__name__ for k in v})}"
                )
            if v:
                vkind = _map_value_kind(list(v.values()))
                kind = vkind if kind is None else _merge_map_values(kind, vkind)
        return Map(kind or "string")
    array = as_array(first)
    if array is not None and array.ndim >= 1:
        dtype = array_dtype(first, array)
        if dtype is None:
            raise SchemaError(
                f"sample {first_position}, column {name!r}: arrays of dtype {array.dtype} cannot "
                f"be stored; use one of {', '.join(DTYPES)}"
            )
        shapes = set()
        for i, v in enumerate(values):
            a = as_array(v)
            if a is None or a.ndim != array.ndim or array_dtype(v, a) != dtype:
                raise fail(i, v, f"a {dtype} array with {array.ndim} dimension(s)")
            shapes.add(tuple(a.shape))
        if len(shapes) == 1:
            return Tensor(dtype, shapes.pop())
        return Ragged(dtype, array.ndim)
    if array is not None:  # 0-d array: a scalar
        return Scalar(array_dtype(first, array) or "float64")
    for i, v in enumerate(values):
        if not _is_json_value(v):
            raise SchemaError(
                f"sample {first_position + i}, column {name!r}: cannot store a value of type "
                f"{type(v).__name__}; chute stores arrays, tensors, numbers, bytes, str, dicts "
                "and JSON-serialisable lists"
            )
    return Json()


def infer_schema(samples: Sequence[Mapping[str, Any]], first_position: int = 0) -> Schema:
    """Infer a schema from a look-ahead window of samples (all must have the same keys)."""
    if not samples:
        raise SchemaError("cannot infer a schema from zero samples")
    names = list(samples[0].keys())
    expected = set(names)
    for i, sample in enumerate(samples):
        check_keys(sample, expected, first_position + i)
    return Schema.from_dict(
        {name: infer_column(name, [s[name] for s in samples], first_position) for name in names}
    )


def check_keys(sample: Any, expected: set[str], position: int) -> None:
    """Raise a SchemaError naming missing/extra keys if ``sample`` has other columns."""
    if not isinstance(sample, Mapping):
        raise SchemaError(
            f"sample {position} is a {type(sample).__name__}; chute.write takes an iterable of dicts "
            "mapping column names to values"
        )
    if sample.keys() != expected:
        missing = sorted(expected - sample.keys())
        extra = sorted(set(sample.keys()) - expected)
        parts = []
        if missing:
            parts.append(f"missing column(s) {missing}")
        if extra:
            parts.append(f"unexpected column(s) {extra}")
        raise SchemaError(
            f"sample {position} has {' and '.join(parts)}; every sample must have the columns "
            f"{sorted(expected)}. To store dicts whose keys vary, put the dict under one column "
            "(it becomes a map column)"
        )
