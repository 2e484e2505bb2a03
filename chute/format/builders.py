"""Column builders: collect one column's values for a shard and turn them into Arrow.

Each builder checks every value against its column type, so a sample that does not
fit the schema is reported at the position where it appears, naming the column,
what was expected and what was found.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import SchemaError
from chute.format.infer import InferenceError
from chute.format.schema import (
    Bytes,
    ColumnType,
    Json,
    Map,
    Nullable,
    Ragged,
    Scalar,
    String,
    Tensor,
    array_dtype,
    arrow_type,
    as_array,
    describe_value,
    is_int_value,
    is_number_value,
    json_default,
    storage_dtype,
)


class ColumnBuilder:
    """Collects the values of one column; ``append`` returns the bytes the value adds."""

    def __init__(self, name: str, ctype: ColumnType) -> None:
        self.name = name
        self.ctype = ctype
        self.type = arrow_type(ctype)

    def mismatch(self, position: int, value: Any, hint: str = "") -> SchemaError:
        message = (
            f"sample {position}, column {self.name!r}: expected {self.ctype.describe()}, "
            f"found {describe_value(value)}"
        )
        return SchemaError(message + (f"; {hint}" if hint else ""))

    def append(self, value: Any, position: int) -> int:
        raise NotImplementedError

    def sizes(self, values: Sequence[Any]) -> list[int] | None:
        """What :meth:`append` of each of ``values`` would return, if every value is of the kind this builder keeps
        as it is (then :meth:`extend` takes them at once); None: append them one by one."""
        return None

    def extend(self, values: Sequence[Any]) -> None:
        """Append ``values``, for which :meth:`sizes` answered."""
        raise NotImplementedError(f"{type(self).__name__} appends one value at a time")

    def finish(self) -> pa.Array:
        """The column's values as one Arrow array; the builder is empty afterwards."""
        raise NotImplementedError


def cast_exact(array: np.ndarray, dtype: str) -> np.ndarray | None:
    """``array`` as chute dtype ``dtype`` when every value survives the cast unchanged, else None.

    int64 values that fit in int32, float32 values as float64, integral floats as ints:
    a declared type takes them; 300 into int8 or 0.1 into float32 is refused.
    """
    if dtype == "bfloat16" or array.dtype.kind not in "biuf":
        return None
    target = np.dtype(np.bool_) if dtype == "bool" else storage_dtype(dtype)
    with np.errstate(all="ignore"):
        out = array.astype(target)
        back = out.astype(array.dtype)
    same = np.array_equal(back, array, equal_nan=array.dtype.kind == "f" and target.kind == "f")
    return out.astype(storage_dtype(dtype), copy=False) if same else None


def _cast_refused(builder: ColumnBuilder, position: int, value: Any, found: str) -> InferenceError:
    """A value of dtype ``found`` that does not cast exactly into the builder's column."""
    message = builder.mismatch(position, value, "").args[0].rstrip("; ")
    want = builder.ctype.dtype  # type: ignore[union-attr]
    floats = found.startswith("float") and want.startswith(("float", "bfloat"))
    why = f"its values are not all exactly {want}" if found != want else ""
    fix = None
    if not floats:
        fix = Tensor(found, builder.ctype.shape) if isinstance(builder.ctype, Tensor) else (
            Ragged(found, builder.ctype.ndim) if isinstance(builder.ctype, Ragged) else Scalar(found))
    return InferenceError(f"{message}{'; ' + why if why else ''}", builder.name, position, fix, cast=floats)


class TensorBuilder(ColumnBuilder):
    """Copies each row into one growing contiguous buffer: the shard's single data buffer."""

    ctype: Tensor

    def __init__(self, name: str, ctype: Tensor) -> None:
        super().__init__(name, ctype)
        self.storage = storage_dtype(ctype.dtype)
        self.buffer = np.empty((16, *ctype.shape), dtype=self.storage)
        self.rows = 0

    def append(self, value: Any, position: int) -> int:
        array = as_array(value)
        if array is None:
            raise self.mismatch(position, value)
        found = array_dtype(value, array)
        if found != self.ctype.dtype:
            array = cast_exact(array, self.ctype.dtype) if found is not None else None
            if array is None:
                raise _cast_refused(self, position, value, found or "?")
        if array.shape != self.ctype.shape:
            fix = Ragged(self.ctype.dtype, array.ndim) if array.ndim == len(self.ctype.shape) else None
            raise InferenceError(
                self.mismatch(position, value).args[0] + (
                    "; this column's shape varies between samples" if fix else ""), self.name, position, fix)
        if self.rows == len(self.buffer):
            grown = np.empty((2 * len(self.buffer), *self.ctype.shape), dtype=self.storage)
            grown[: self.rows] = self.buffer
            self.buffer = grown
        self.buffer[self.rows] = array
        self.rows += 1
        return self.ctype.row_bytes

    def finish(self) -> pa.Array:
        flat = self.buffer[: self.rows].reshape(-1)
        storage = pa.FixedSizeListArray.from_arrays(pa.array(flat), int(np.prod(self.ctype.shape)))
        self.buffer = np.empty((16, *self.ctype.shape), dtype=self.storage)
        self.rows = 0
        return pa.ExtensionArray.from_storage(self.type, storage)


class ScalarBuilder(ColumnBuilder):
    ctype: Scalar

    def __init__(self, name: str, ctype: Scalar) -> None:
        super().__init__(name, ctype)
        self.values: list[Any] = []
        self.is_bool = ctype.dtype == "bool"
        self.is_float = ctype.dtype.startswith(("float", "bfloat"))

    def append(self, value: Any, position: int) -> int:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, np.generic):
            found = array_dtype(value, np.asarray(value))
            if found != self.ctype.dtype:
                cast = cast_exact(np.asarray(value), self.ctype.dtype) if found is not None else None
                if cast is None:
                    raise _cast_refused(self, position, value, found or "?")
                value = cast
            value = value.item()
        elif self.is_bool:
            if not isinstance(value, bool):
                raise self.mismatch(position, value)
        elif isinstance(value, bool) or not isinstance(value, (float, int) if self.is_float else int):
            raise self.mismatch(position, value)
        elif self.is_float and self.ctype.dtype != "float64" and cast_exact(np.asarray(value, np.float64), self.ctype.dtype) is None:
            raise _cast_refused(self, position, value, "float64")
        elif not self.is_float and self.ctype.dtype not in ("int64", "uint64") and not (
                (bounds := np.iinfo(storage_dtype(self.ctype.dtype))).min <= value <= bounds.max):
            raise _cast_refused(self, position, value, "int64")
        self.values.append(value)
        return self.ctype.row_bytes

    def finish(self) -> pa.Array:
        values, self.values = self.values, []
        if self.is_bool:
            return pa.array(values, type=pa.bool_())
        try:
            array = np.array(values, dtype=storage_dtype(self.ctype.dtype))
        except OverflowError as exc:
            raise SchemaError(
                f"column {self.name!r}: a value does not fit in {self.ctype.dtype} ({exc}); declare it as int64"
            ) from None
        return pa.array(array, type=self.type)


class RaggedBuilder(ColumnBuilder):
    ctype: Ragged

    def __init__(self, name: str, ctype: Ragged) -> None:
        super().__init__(name, ctype)
        self.parts: list[np.ndarray] = []
        self.shapes: list[tuple[int, ...]] = []

    def append(self, value: Any, position: int) -> int:
        array = as_array(value)
        if array is None and isinstance(value, (list, tuple)) and not value:
            array = np.empty((0,), dtype=storage_dtype(self.ctype.dtype))  # an empty token list
        elif array is None:
            raise self.mismatch(position, value)
        elif (found := array_dtype(value, array)) != self.ctype.dtype:
            cast = cast_exact(array, self.ctype.dtype) if found is not None else None
            if cast is None:
                raise _cast_refused(self, position, value, found or "?")
            array = cast
        if array.ndim != self.ctype.ndim:
            raise InferenceError(self.mismatch(position, value).args[0], self.name, position,
                                 Ragged(self.ctype.dtype, array.ndim))
        self.parts.append(np.ascontiguousarray(array, dtype=storage_dtype(self.ctype.dtype)).reshape(-1))
        self.shapes.append(array.shape)
        return array.nbytes + 8

    def finish(self) -> pa.Array:
        parts, shapes = self.parts, self.shapes
        self.parts, self.shapes = [], []
        dtype = storage_dtype(self.ctype.dtype)
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        flat = np.concatenate(parts) if parts else np.empty((0,), dtype=dtype)
        data = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))
        if self.ctype.ndim == 1:
            return data
        shape = pa.FixedSizeListArray.from_arrays(
            pa.array(np.asarray(shapes, dtype=np.int32).reshape(-1)), self.ctype.ndim
        )
        return pa.StructArray.from_arrays([data, shape], names=["data", "shape"])


class BytesBuilder(ColumnBuilder):
    ctype: Bytes

    def __init__(self, name: str, ctype: Bytes) -> None:
        super().__init__(name, ctype)
        self.values: list[bytes] = []

    def append(self, value: Any, position: int) -> int:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise self.mismatch(position, value)
        self.values.append(bytes(value) if not isinstance(value, bytes) else value)
        return len(value) + 8

    def sizes(self, values: Sequence[Any]) -> list[int] | None:
        return [len(v) + 8 for v in values] if set(map(type, values)) <= {bytes} else None

    def extend(self, values: Sequence[Any]) -> None:
        self.values.extend(values)

    def finish(self) -> pa.Array:
        values, self.values = self.values, []
        return pa.array(values, type=self.type)


class StringBuilder(ColumnBuilder):
    ctype: String | Json

    def __init__(self, name: str, ctype: String | Json) -> None:
        super().__init__(name, ctype)
        self.values: list[str] = []

    def encode(self, value: Any, position: int) -> str:
        if not isinstance(value, str):
            raise self.mismatch(position, value)
        return value

    def append(self, value: Any, position: int) -> int:
        text = self.encode(value, position)
        self.values.append(text)
        return len(text) + 8

    def sizes(self, values: Sequence[Any]) -> list[int] | None:
        return [len(v) + 8 for v in values] if set(map(type, values)) <= {str} else None

    def extend(self, values: Sequence[Any]) -> None:
        self.values.extend(values)

    def finish(self) -> pa.Array:
        values, self.values = self.values, []
        return pa.array(values, type=self.type)


class JsonBuilder(StringBuilder):
    def sizes(self, values: Sequence[Any]) -> list[int] | None:
        return None  # each value is encoded first

    def encode(self, value: Any, position: int) -> str:
        return encode_json(value, f"sample {position}, column {self.name!r}")


def encode_json(value: Any, where: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=json_default)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{where}: value is not JSON-serialisable ({exc})") from None


class MapBuilder(ColumnBuilder):
    ctype: Map

    def __init__(self, name: str, ctype: Map) -> None:
        super().__init__(name, ctype)
        self.rows: list[list[tuple[str, Any]]] = []
        self.check = {
            "string": lambda v: isinstance(v, str),
            "bytes": lambda v: isinstance(v, (bytes, bytearray, memoryview)),
            "int64": is_int_value,
            "float64": is_number_value,
            "json": lambda v: True,
        }[ctype.value]

    def append(self, value: Any, position: int) -> int:
        if not isinstance(value, dict):
            raise self.mismatch(position, value)
        size = 16
        items = []
        for key, item in value.items():
            if not isinstance(key, str):
                raise self.mismatch(position, value, f"key {key!r} is not a str")
            if not self.check(item):
                raise SchemaError(
                    f"sample {position}, column {self.name!r}: key {key!r} holds "
                    f"{describe_value(item)}, but the column's values are {self.ctype.value}; "
                    "declare it as chute.Map('json') with schema= to store mixed values"
                )
            if self.ctype.value == "json":
                item = encode_json(item, f"sample {position}, column {self.name!r}, key {key!r}")
            elif self.ctype.value == "float64":
                item = float(item)
            elif self.ctype.value == "int64":
                item = int(item)  # a numpy integer too
            items.append((key, item))
            size += len(key) + (len(item) if isinstance(item, (str, bytes)) else 8)
        self.rows.append(items)
        return size

    def finish(self) -> pa.Array:
        rows, self.rows = self.rows, []
        return pa.array(rows, type=self.type)


def _blank(ctype: ColumnType) -> Any:
    """The value a nullable column stores under a null: zeros, or empty."""
    if isinstance(ctype, Tensor):
        return np.zeros(ctype.shape, dtype=np.bool_ if ctype.dtype == "bool" else storage_dtype(ctype.dtype))
    if isinstance(ctype, Scalar):
        return False if ctype.dtype == "bool" else 0
    if isinstance(ctype, Ragged):
        return np.zeros((0,) * ctype.ndim, dtype=storage_dtype(ctype.dtype))
    return {Bytes: b"", String: "", Map: {}}[type(ctype)]


class NullableBuilder(ColumnBuilder):
    """A column of the inner type whose None rows become Arrow nulls (over a zeroed or empty value)."""

    ctype: Nullable

    def __init__(self, name: str, ctype: Nullable) -> None:
        super().__init__(name, ctype)
        self.inner = make_builder(name, ctype.value)
        self.blank = _blank(ctype.value)
        if isinstance(ctype.value, Tensor) and ctype.value.dtype == "bfloat16":
            self.blank = np.zeros(ctype.value.shape, dtype=np.uint16)
        self.valid: list[bool] = []

    def append(self, value: Any, position: int) -> int:
        if value is None:
            self.valid.append(False)
            if isinstance(self.ctype.value, (Tensor, Ragged)) and self.ctype.value.dtype == "bfloat16":
                import torch

                return self.inner.append(torch.from_numpy(self.blank).view(torch.bfloat16), position)
            return self.inner.append(self.blank, position)
        self.valid.append(True)
        return self.inner.append(value, position)

    def finish(self) -> pa.Array:
        valid, self.valid = np.asarray(self.valid, dtype=bool), []
        array = self.inner.finish()
        return array if valid.all() else with_nulls(array, valid)


def with_nulls(array: pa.Array, valid: np.ndarray) -> pa.Array:
    """``array`` (offset 0) with the rows where ``valid`` is False made null (its buffers unchanged)."""
    if isinstance(array, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(array.type, with_nulls(array.storage, valid))
    kind = array.type
    if pa.types.is_struct(kind):
        children = [array.field(i) for i in range(kind.num_fields)]
    elif kind.num_fields:
        children = [array.values]
    else:
        children = None
    mask = pa.py_buffer(np.packbits(valid.astype(np.uint8), bitorder="little").tobytes())
    buffers = array.buffers()[: kind.num_buffers]
    return pa.Array.from_buffers(kind, len(array), [mask, *buffers[1:]], null_count=int((~valid).sum()), children=children)


def make_builder(name: str, ctype: ColumnType) -> ColumnBuilder:
    builders: dict[type, type[ColumnBuilder]] = {
        Nullable: NullableBuilder,
        Tensor: TensorBuilder,
        Scalar: ScalarBuilder,
        Ragged: RaggedBuilder,
        Bytes: BytesBuilder,
        String: StringBuilder,
        Json: JsonBuilder,
        Map: MapBuilder,
    }
    return builders[type(ctype)](name, ctype)
