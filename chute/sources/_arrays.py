"""What the array sources (HDF5, Zarr) share: a tree of arrays becomes columns, read a block of rows at a time.

A file or store holds arrays in nested groups. The arrays whose first axes
have the same length are the columns (sample ``i`` is row ``i`` of each);
the length that most arrays share wins (ties: the longer one), and the others
are listed in the dataset's metadata as skipped, with the reason. A group's
arrays are named with dots (``/sim/fields/u`` is column ``sim.fields.u``).

============================================  =====================================
array                                         column
============================================  =====================================
numbers (bool, ints, floats), 1-D             scalar of that dtype
numbers, N-D                                  tensor of shape ``shape[1:]``
strings (UTF-8 or ASCII, fixed or variable)   str (1-D only)
fixed-length bytes, opaque                    bytes (1-D only)
variable-length arrays of numbers             ragged, 1 dimension (1-D only)
0-D, complex, compound, references            skipped (named in the metadata)
============================================  =====================================

Big-endian arrays are converted to native order. Attributes (of the file, the
groups and the arrays) are kept in the metadata where they are JSON values
(numbers, strings, small arrays as lists).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.format.schema import Bytes, ColumnType, Ragged, Scalar, String, Tensor, _value_dtype

BLOCK_BYTES = 16 * 2**20
"""About the bytes of one block of rows (a read task's work)."""
MAX_ATTRIBUTE_ITEMS = 4096
"""An array attribute longer than this is left out of the metadata."""


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One array of the source, as a backend describes it.

    ``kind``: ``number``, ``string`` (text), ``bytes`` or ``vlen`` (variable-length
    arrays of ``base``), or ``other`` (not stored: ``why`` says what it is).
    ``chunk_rows``: rows per stored chunk along the first axis (the whole array if
    not chunked); ``compressed``: the chunks are filtered (decoding costs CPU).
    """

    name: str
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    kind: str
    chunk_rows: int
    compressed: bool = False
    base: np.dtype | None = None
    why: str = ""


def column_name(path: str) -> str:
    """``/sim/fields/u`` (HDF5) or ``sim/fields/u`` (Zarr) -> ``sim.fields.u``."""
    return ".".join(part for part in path.split("/") if part)


def column_type(info: ArrayInfo) -> ColumnType | str:
    """The column type of ``info``, or why it cannot be a column."""
    if info.kind == "other":
        return info.why
    if len(info.shape) == 0:
        return "a 0-dimensional array (no first axis to index samples)"
    if info.kind in ("string", "bytes", "vlen") and len(info.shape) != 1:
        return f"{info.kind} values in {len(info.shape)} dimensions (only 1-D ones are columns)"
    if info.kind == "string":
        return String()
    if info.kind == "bytes":
        return Bytes()
    if info.kind == "vlen":
        dtype = _value_dtype(np.dtype(info.base).newbyteorder("="))
        return Ragged(dtype, 1) if dtype else f"variable-length arrays of {info.base}, which chute cannot store"
    dtype = _value_dtype(info.dtype.newbyteorder("="))
    if dtype is None:
        return f"dtype {info.dtype}, which chute cannot store"
    return Scalar(dtype) if len(info.shape) == 1 else Tensor(dtype, info.shape[1:])


@dataclasses.dataclass
class Layout:
    """The columns chosen from a source: their arrays and types, the rows, and what was left out and why."""

    rows: int
    arrays: list[ArrayInfo]
    types: dict[str, ColumnType]
    skipped: dict[str, str]

    @property
    def compressed(self) -> bool:
        return any(a.compressed for a in self.arrays)

    def block_rows(self) -> int:
        """Rows per block: whole chunks of the array with the longest chunks, about :data:`BLOCK_BYTES` in all."""
        row_bytes = sum(max(1, math.prod(a.shape[1:])) * max(1, a.dtype.itemsize) for a in self.arrays)
        chunk = max(max(1, a.chunk_rows) for a in self.arrays)
        return max(1, BLOCK_BYTES // max(1, row_bytes * chunk)) * chunk

    def spans(self) -> list[tuple[int, int]]:
        step = self.block_rows()
        return [(a, min(a + step, self.rows)) for a in range(0, self.rows, step)]


def choose(arrays: list[ArrayInfo], where: str, columns: list[str] | None = None) -> Layout:
    """The columns of ``arrays``: those named in ``columns`` (column names or paths), else the largest set
    sharing a first-axis length (see the module doc)."""
    types: dict[str, ColumnType] = {}
    skipped: dict[str, str] = {}
    usable: list[ArrayInfo] = []
    for info in arrays:
        ctype = column_type(info)
        if isinstance(ctype, str):
            skipped[info.name] = ctype
        else:
            types[info.name] = ctype
            usable.append(info)
    if columns is not None:
        wanted = [column_name(c) for c in columns]
        known = {a.name: a for a in arrays}
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise ChuteError(f"{where} has no array {unknown[0]!r}; its arrays are {sorted(known)}")
        refused = [c for c in wanted if c in skipped]
        if refused:
            raise ChuteError(f"{where}: array {refused[0]!r} cannot be a column: it holds {skipped[refused[0]]}")
        chosen = [known[c] for c in wanted]
        lengths = {a.name: a.shape[0] for a in chosen}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{n}: {k}" for n, k in lengths.items())
            raise ChuteError(f"{where}: the arrays' first axes differ ({listed}); the columns must have one row per sample")
        skipped.update({a.name: "not in columns=" for a in usable if a.name not in wanted})
        return Layout(chosen[0].shape[0], chosen, {a.name: types[a.name] for a in chosen}, skipped)
    if not usable:
        reasons = "; ".join(f"{n}: {r}" for n, r in skipped.items()) or "it holds no arrays"
        raise ChuteError(f"{where} holds no array chute can store as a column ({reasons})")
    counts = collections.Counter(a.shape[0] for a in usable)
    rows = max(counts, key=lambda n: (counts[n], n))
    chosen = [a for a in usable if a.shape[0] == rows]
    for a in usable:
        if a.shape[0] != rows:
            skipped[a.name] = f"a first axis of {a.shape[0]}, not the {rows} rows of the other arrays"
    return Layout(rows, chosen, {a.name: types[a.name] for a in chosen}, skipped)


def block_values(info: ArrayInfo, ctype: ColumnType, raw: Any, first_row: int, where: str) -> Any:
    """One column's values for a block (rows ``first_row...``) as :class:`chute.sources._blocks.BlockShards` takes them."""
    if isinstance(ctype, (Scalar, Tensor)):
        array = np.asarray(raw)
        return array.astype(array.dtype.newbyteorder("="), copy=False) if array.dtype.byteorder == ">" else array
    if isinstance(ctype, String):
        out = []
        for k, value in enumerate(np.asarray(raw, dtype=object).tolist()):
            if isinstance(value, bytes):
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise ChuteError(
                        f"{where}: array {info.name!r}, row {first_row + k} is not UTF-8 text; convert the source's "
                        "strings, or leave the array out with columns="
                    ) from None
            out.append(str(value))
        return out
    if isinstance(ctype, Bytes):
        array = np.asarray(raw)
        if array.dtype.kind == "V":
            return [row.tobytes() for row in array]
        return [bytes(value) for value in array.tolist()]
    assert isinstance(ctype, Ragged)
    dtype = np.dtype(info.base).newbyteorder("=")
    return [np.asarray(value).astype(dtype, copy=False).reshape(-1) for value in raw]


def attribute_value(value: Any) -> Any:
    """An attribute as a JSON value, or None when it has none (references, huge arrays, odd types)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return attribute_value(value.item())
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufSUO" or value.size > MAX_ATTRIBUTE_ITEMS:
            return None
        return attribute_value(value.tolist()) if value.ndim else attribute_value(value[()])
    if isinstance(value, (list, tuple)):
        items = [attribute_value(v) for v in value]
        return None if any(v is None for v in items) and items else items
    return None


def attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-valued attributes of one object (the others are left out)."""
    out = {}
    for key in attrs:
        try:
            value = attribute_value(attrs[key])
        except (OSError, TypeError, ValueError):  # an attribute of a type the library cannot read
            continue
        if value is not None:
            out[str(key)] = value
    return out
