"""Column types inferred over a whole source: dict samples become one column per key.

A converter can see every sample before it writes one: it feeds each sample
(a dict) to a :class:`Summary`, merges the summaries of its reader processes,
and asks :func:`plan` for the columns. Unlike the writer's look-ahead window,
nothing depends on which samples come first: an array whose shape changes in
the last file makes a ragged column, a key that some samples lack makes a
:class:`~chute.format.schema.Nullable` column.

A value that is a dict is either a *record* (the same fields in most samples:
an array, a label, an id, maybe nested or sometimes missing), flattened into
one column per key named ``parent.key``, or a *map* (keys that vary from
sample to sample, such as ten random string keys per sample, with string or
number values): one :class:`~chute.format.schema.Map` column. A dict is a map
when every value is a string, bytes or number and, on average, a key is present
in at most half of the dicts; otherwise it is a record.

A summary holds counts and first positions, never the values: its size does
not grow with the number of samples (a map's keys stop being tracked past
:data:`MAX_RECORD_KEYS`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from chute.errors import SchemaError
from chute.format.schema import (
    DTYPES,
    Bytes,
    ColumnType,
    Json,
    Map,
    Nullable,
    Ragged,
    Scalar,
    String,
    Tensor,
    _is_json_value,
    _map_value_kind,
    _merge_map_values,
    _value_dtype,
    array_dtype,
    as_array,
    is_number_value,
    spell,
)

MAX_RECORD_KEYS = 1024
"""A dict seen with more distinct keys than this is a map (its keys are no longer tracked)."""

_MAPPABLE = frozenset({"str", "bytes", "int", "float"})


class InferenceError(SchemaError):
    """The samples at one column do not fit one column type.

    ``column`` is the column's name, ``position`` the first sample that differs,
    ``fix`` the column type that would store every value (None when there is
    none), ``cast`` whether rounding floats to the column's dtype would do:
    converters turn them into a hint in the syntax of the interface in use.
    """

    def __init__(self, detail: str, column: str, position: int, fix: ColumnType | None = None, cast: bool = False) -> None:
        self.detail, self.column, self.position, self.fix, self.cast = detail, column, position, fix, cast
        super().__init__(f"{detail}; {self.write_hint()}" if self.write_hint() else detail)

    def write_hint(self) -> str:
        """What to do, in ``chute.write``'s terms (converters say it in theirs)."""
        if self.cast:
            return "round the values to the column's dtype before writing (e.g. array.astype(...))"
        if self.fix is not None:
            return f"declare the column with schema={{{self.column!r}: {spell(self.fix)}}}"
        return ""


@dataclasses.dataclass
class Node:
    """What was seen at one place of the samples (a key path): kinds, dtypes, shapes, sub-keys."""

    present: int = 0  # values that were not None
    nones: int = 0
    kinds: dict[str, int] = dataclasses.field(default_factory=dict)  # kind -> first position
    dtypes: dict[str, int] = dataclasses.field(default_factory=dict)  # array/scalar dtype -> first position
    ndims: dict[int, int] = dataclasses.field(default_factory=dict)  # array ndim -> first position
    shape: tuple[int, ...] | None = None  # of the first array
    shape_changed: int | None = None  # first position of another shape
    unsupported: int | None = None  # first position of a value chute cannot store
    int_range: tuple[int, int] | None = None  # python ints: min, max
    json_ok: bool = True  # every value so far is plain JSON (no arrays, bytes, numpy values)
    # dicts
    dicts: int = 0
    key_slots: int = 0  # keys summed over the dicts
    max_keys: int = 0
    bad_key: int | None = None  # first position of a non-str key
    map_value: str | None = None  # the Map value kind if every value fits a map
    mappable: bool = True
    keys: dict[str, Node] | None = dataclasses.field(default_factory=dict)  # None once too many
    str_keys: frozenset[str] = frozenset()  # keys of a dict already seen to be all str (a record's keys repeat)

    # ------------------------------------------------------------------ adding

    def add(self, value: Any, position: int) -> None:
        if value is None:
            self.nones += 1
            return
        self.present += 1
        kind = type(value)  # the common exact types first: a summary pass calls this for every value of every sample
        if kind is np.ndarray:
            self._add_ndarray(value, position)
        elif kind is dict:
            self._add_dict(value, position)
        elif kind is int:
            self._kind("int", position)
            self._dtype("int64", position)
            low, high = self.int_range or (value, value)
            self.int_range = (min(low, value), max(high, value))
        elif kind is float:
            self._kind("float", position)
            self._dtype("float64", position)
        elif kind is str:
            self._kind("str", position)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self.json_ok = False
            self._kind("bytes", position)
        elif isinstance(value, str):
            self._kind("str", position)
        elif isinstance(value, (bool, np.bool_)):
            self._kind("bool", position)
            self._dtype("bool", position)
        elif isinstance(value, int):
            self._kind("int", position)
            self._dtype("int64", position)
            low, high = self.int_range or (value, value)
            self.int_range = (min(low, value), max(high, value))
        elif isinstance(value, float):
            self._kind("float", position)
            self._dtype("float64", position)
        elif isinstance(value, (np.integer, np.floating)):  # a numpy scalar: a number of its own dtype
            dtype = _value_dtype(value.dtype)
            if dtype is None:
                self._unsupported(position)
            else:
                self._kind("number", position)
                self._dtype(dtype, position)
        elif isinstance(value, Mapping):
            self._add_dict(value, position)
        else:
            self._add_other(value, position)

    def _kind(self, kind: str, position: int) -> None:
        if kind not in self.kinds:
            self.kinds[kind] = position

    def _dtype(self, dtype: str, position: int) -> None:
        if dtype not in self.dtypes:
            self.dtypes[dtype] = position

    def _add_ndarray(self, value: np.ndarray, position: int) -> None:
        """A numpy array: what :meth:`_add_other` does for one, without its general conversions."""
        self.json_ok = False
        dtype = _value_dtype(value.dtype)
        if dtype is None:
            self._unsupported(position)
            return
        self._dtype(dtype, position)
        if value.ndim == 0:
            self._kind("number", position)
            return
        self._kind("array", position)
        if value.ndim not in self.ndims:
            self.ndims[value.ndim] = position
        if self.shape is None:
            self.shape = value.shape
        elif self.shape_changed is None and value.shape != self.shape:
            self.shape_changed = position

    def _unsupported(self, position: int) -> None:
        if self.unsupported is None:
            self.unsupported = position
        self._kind("unsupported", position)

    def _add_other(self, value: Any, position: int) -> None:
        if isinstance(value, (list, tuple)) and not value:
            self._kind("empty", position)  # an empty list: no items, no dtype; fits an array column or a JSON one
            return
        if not isinstance(value, (list, tuple)):
            self.json_ok = False
        array = as_array(value)
        dtype = array_dtype(value, array) if array is not None else None
        if array is not None and dtype is not None:
            if array.ndim == 0 or isinstance(value, np.generic):
                self._kind("number", position)
                self._dtype(dtype, position)
                return
            self._kind("array", position)
            self._dtype(dtype, position)
            if array.ndim not in self.ndims:
                self.ndims[array.ndim] = position
            if self.shape is None:
                self.shape = tuple(array.shape)
            elif self.shape_changed is None and tuple(array.shape) != self.shape:
                self.shape_changed = position
            return
        if array is None and _is_json_value(value):
            self._kind("json", position)
            return
        self._unsupported(position)

    def _add_dict(self, value: Mapping[str, Any], position: int) -> None:
        self._kind("dict", position)
        self.dicts += 1
        self.key_slots += len(value)
        self.max_keys = max(self.max_keys, len(value))
        if value.keys() != self.str_keys:
            if any(not isinstance(k, str) for k in value):
                if self.bad_key is None:
                    self.bad_key = position
                return
            self.str_keys = frozenset(value)
        self._map_items(value)
        if self.keys is not None:
            for key, item in value.items():
                node = self.keys.get(key)
                if node is None:
                    if len(self.keys) >= MAX_RECORD_KEYS and self.mappable:
                        self.keys = None  # a map: its keys vary too much to be columns
                        return
                    node = self.keys[key] = Node()
                node.add(item, position)

    def _map_items(self, value: Mapping[str, Any]) -> None:
        """What a dict's values say of it as a map: whether one can hold them, their map value kind, JSON."""
        if value and self.mappable:
            items = list(value.values())
            if all(type(v) in (str, bytes, int, float) or is_number_value(v) for v in items):
                kind = _map_value_kind(items)
            elif _is_json_value(items):
                kind = "json"
            else:
                kind = None
                self.mappable = False
            if kind is not None:
                self.map_value = kind if self.map_value is None else _merge_map_values(self.map_value, kind)
        if not (self.mappable and _is_json_value(list(value.values()))):
            self.json_ok = False

    # ------------------------------------------------------------------ adding alike values at once

    def alike(self, first: Any, values: Sequence[Any]) -> bool:
        """Whether each of ``values`` has the structure of ``first`` (just added here): the same exact types, dict
        keys, array dtypes and shapes all the way down, of the kinds :meth:`add_alike` takes. Reads only."""
        kind = type(first)
        if not set(map(type, values)) <= {kind}:
            return False
        if kind is np.ndarray:
            return {(v.dtype, v.shape) for v in values} <= {(first.dtype, first.shape)}
        if kind in _ALIKE_LEAVES:
            return True
        if kind is not dict or self.keys is None or self.bad_key is not None or first.keys() != self.str_keys:
            return False
        keys = first.keys()
        if not all(map(keys.__eq__, map(dict.keys, values))):
            return False
        return all(self.keys[k].alike(first[k], [v[k] for v in values]) for k in keys)

    def add_alike(self, first: Any, values: Sequence[Any]) -> None:
        """Add ``values`` that :meth:`alike` accepted: exactly what :meth:`add` of each would do, whose first
        positions ``first`` already recorded, so only the counts (and a map's per-dict checks) remain."""
        kind, n = type(first), len(values)
        if kind is type(None):
            self.nones += n
            return
        self.present += n
        if kind is int and values:
            low, high = self.int_range or (first, first)
            self.int_range = (min(low, min(values)), max(high, max(values)))
        elif kind is dict:
            self.dicts += n
            self.key_slots += n * len(first)
            if self.mappable or self.json_ok:  # (a record of arrays stops being either at its first dict)
                for value in values:
                    self._map_items(value)
            assert self.keys is not None  # alike() checked
            for k in first:
                self.keys[k].add_alike(first[k], [v[k] for v in values])

    # ------------------------------------------------------------------ merging

    def merge(self, other: Node) -> None:
        """Add what ``other`` saw (the summary of later or parallel samples)."""
        self.present += other.present
        self.nones += other.nones
        pairs: tuple[tuple[dict[Any, int], dict[Any, int]], ...] = (
            (self.kinds, other.kinds), (self.dtypes, other.dtypes), (self.ndims, other.ndims))
        for mine, theirs in pairs:
            for key, position in theirs.items():
                mine[key] = min(position, mine.get(key, position))
        if other.shape is not None:
            if self.shape is None:
                self.shape, self.shape_changed = other.shape, other.shape_changed
            else:
                changes = [p for p in (self.shape_changed, other.shape_changed) if p is not None]
                if other.shape != self.shape:  # other's first array differs from ours (parts merge in order)
                    changes.append(other.kinds["array"])
                self.shape_changed = min(changes) if changes else None
        self.unsupported = _first(self.unsupported, other.unsupported)
        self.bad_key = _first(self.bad_key, other.bad_key)
        if other.int_range is not None:
            low, high = self.int_range or other.int_range
            self.int_range = (min(low, other.int_range[0]), max(high, other.int_range[1]))
        self.dicts += other.dicts
        self.key_slots += other.key_slots
        self.max_keys = max(self.max_keys, other.max_keys)
        self.mappable = self.mappable and other.mappable
        self.json_ok = self.json_ok and other.json_ok
        if other.map_value is not None:
            self.map_value = other.map_value if self.map_value is None else _merge_map_values(self.map_value, other.map_value)
        if self.keys is None or other.keys is None:
            self.keys = None
            return
        for key, node in other.keys.items():
            if key in self.keys:
                self.keys[key].merge(node)
            else:
                self.keys[key] = node
        if len(self.keys) > MAX_RECORD_KEYS and self.mappable:
            self.keys = None

    # ------------------------------------------------------------------ deciding

    def is_record(self) -> bool:
        """Whether the dicts seen here are records (one column per key) rather than a map."""
        if self.keys is None:
            return False
        if not self.mappable or not self.keys:
            return True
        presence = self.key_slots / (self.dicts * len(self.keys))
        return presence > 0.5


def _first(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


#: The leaf types :meth:`Node.alike` compares by exact type alone (numpy arrays: also dtype and shape).
_ALIKE_LEAVES = frozenset({int, float, str, bytes, bool, type(None)})


class Summary:
    """The summary of dict samples, fed one at a time (``add``), a list at a time (``add_many``) or merged from
    parts (``merge``)."""

    def __init__(self) -> None:
        self.root = Node()
        self.samples = 0

    def add(self, sample: Mapping[str, Any], position: int) -> None:
        self.samples += 1
        self.root.add(sample, position)

    def add_many(self, samples: Sequence[Mapping[str, Any]], position: int) -> None:
        """``add`` of each of ``samples`` (the first at ``position``), with the same result; samples shaped like
        the first (the usual case: records of the same fields, types and array shapes) are counted at once."""
        if not samples:
            return
        first, rest = samples[0], samples[1:]
        self.add(first, position)
        if self.root.alike(first, rest):
            self.samples += len(rest)
            self.root.add_alike(first, rest)
            return
        for i, sample in enumerate(rest, start=position + 1):
            self.add(sample, i)

    def merge(self, other: Summary) -> None:
        self.samples += other.samples
        self.root.merge(other.root)


@dataclasses.dataclass(frozen=True)
class Column:
    """One planned column: its name, where its value is in a sample (a key path), its type."""

    name: str
    path: tuple[str, ...]
    ctype: ColumnType


def plan(summary: Summary, declared: Mapping[str, ColumnType] | None = None, hoist: str | None = None,
         reserved: Iterable[str] = ()) -> list[Column]:
    """The columns for the samples summarised in ``summary``.

    Each top-level key is a column, a record dict one column per key (dotted
    names, ``meta.width``). ``hoist`` names a top-level key whose record's keys
    become top-level columns themselves (the index converter's ``data``: a
    pickled dict's ``x`` is column ``x``, not ``data.x``), unless the name is taken
    (by another column or one of ``reserved``).
    ``declared`` types (by column name) are used as given.
    """
    declared = dict(declared or {})
    root = summary.root
    if root.keys is None:
        raise SchemaError("the samples have too many distinct keys to become columns")
    columns: list[Column] = []
    for key, node in root.keys.items():
        if key == hoist and key not in declared and "dict" in node.kinds and node.is_record() and set(node.kinds) == {"dict"}:
            continue
        _plan_node(key, (key,), node, root.dicts, declared, columns)
    if hoist is not None and hoist in root.keys and hoist not in declared:
        node = root.keys[hoist]
        if "dict" in node.kinds and set(node.kinds) == {"dict"} and node.is_record():
            taken = {c.name for c in columns} | set(reserved)
            for key, child in node.keys.items():  # type: ignore[union-attr]
                name = key if key not in taken else f"{hoist}.{key}"
                _plan_node(name, (hoist, key), child, root.dicts, declared, columns)
    names = [c.name for c in columns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaError(f"the samples give several columns named {duplicates} (a key with a dot in it?); rename the keys")
    unknown = sorted(set(declared) - set(names))
    if unknown:
        raise SchemaError(f"types are declared for {unknown}, which the samples do not have; their columns are {names}")
    return columns


def _plan_node(name: str, path: tuple[str, ...], node: Node, parents: int, declared: dict, out: list[Column]) -> None:
    if name in declared:
        out.append(Column(name, path, declared[name]))
        return
    if set(node.kinds) == {"dict"} and node.bad_key is None and node.is_record():
        for key, child in node.keys.items():  # type: ignore[union-attr]
            _plan_node(f"{name}.{key}", (*path, key), child, parents, declared, out)
        return
    out.append(Column(name, path, column_type(name, node, parents)))


def column_type(name: str, node: Node, samples: int) -> ColumnType:
    """The type of a column from what was seen at it (``samples``: how many samples there are)."""
    ctype = _plain_type(name, node)
    if node.present < samples and not isinstance(ctype, Json):
        return Nullable(ctype)
    return ctype


def _plain_type(name: str, node: Node) -> Tensor | Ragged | Scalar | Bytes | String | Map | Json:
    kinds = set(node.kinds)
    if not kinds:
        return Json()  # only None: JSON null
    if node.unsupported is not None:
        raise InferenceError(
            f"sample {node.unsupported}, column {name!r}: holds a value chute cannot store; chute stores arrays, "
            "tensors, numbers, bytes, str, dicts and JSON-serialisable lists",
            name, node.unsupported,
        )
    if kinds == {"bytes"}:
        return Bytes()
    if kinds == {"str"}:
        return String()
    if kinds == {"dict"}:
        if node.bad_key is not None:
            raise InferenceError(f"sample {node.bad_key}, column {name!r}: a dict with keys that are not str", name, node.bad_key)
        return Map(node.map_value or "string") if node.mappable else Json()
    if kinds <= {"bool", "int", "float", "number"}:
        return _scalar(name, node)
    if kinds <= {"json", "empty"}:  # lists of strings, nested lists, empty lists
        return Json()
    if kinds == {"array"}:
        return _array(name, node)
    if kinds == {"array", "empty"} and set(node.ndims) == {1}:  # 1-D arrays, some empty: one of another shape
        return Ragged(next(iter(node.dtypes)), 1) if len(node.dtypes) == 1 else _array(name, node)
    second = sorted(node.kinds.items(), key=lambda kv: kv[1])[1]
    raise _mixed(name, node, second, Json() if node.json_ok else None)


def _mixed(name: str, node: Node, second: tuple[str, int], fix: ColumnType | None) -> InferenceError:
    first_kind, first_position = min(node.kinds.items(), key=lambda kv: kv[1])
    kind, position = second
    return InferenceError(
        f"sample {position}, column {name!r}: holds {_KIND_WORDS.get(kind, kind)} where sample {first_position} "
        f"holds {_KIND_WORDS.get(first_kind, first_kind)}",
        name, position, fix,
    )


_KIND_WORDS = {"str": "a str", "bytes": "bytes", "int": "an int", "float": "a float", "bool": "a bool", "dict": "a dict",
               "json": "a list", "array": "an array", "number": "a number", "empty": "an empty list"}


def _scalar(name: str, node: Node) -> Scalar:
    dtypes = node.dtypes
    if len(dtypes) == 1:
        return Scalar(next(iter(dtypes)))
    if set(dtypes) == {"int64", "float64"}:
        return Scalar("float64")
    promoted = _promote(dtypes)
    ordered = sorted(dtypes.items(), key=lambda kv: kv[1])
    (first, p0), (other, p1) = ordered[0], ordered[1]
    raise InferenceError(
        f"sample {p1}, column {name!r}: a {other} number where sample {p0} holds a {first} number",
        name, p1, Scalar(promoted) if promoted else None,
    )


def _array(name: str, node: Node) -> Tensor | Ragged:
    if len(node.ndims) > 1:
        (n0, p0), (n1, p1) = sorted(node.ndims.items(), key=lambda kv: kv[1])[:2]
        raise InferenceError(
            f"sample {p1}, column {name!r}: an array of {n1} dimension(s) where sample {p0} holds one of {n0}; "
            "chute stores one number of dimensions per column: reshape the arrays",
            name, p1,
        )
    ndim = next(iter(node.ndims))
    assert node.shape is not None  # set by the first array seen, and this node has seen arrays
    if len(node.dtypes) > 1:
        promoted = _promote(node.dtypes)
        ordered = sorted(node.dtypes.items(), key=lambda kv: kv[1])
        (first, p0), (other, p1) = ordered[0], ordered[1]
        fix = None
        if promoted is not None:
            fix = Tensor(promoted, node.shape) if node.shape_changed is None else Ragged(promoted, ndim)
        raise InferenceError(
            f"sample {p1}, column {name!r}: a {other} array where sample {p0} holds a {first} array",
            name, p1, fix,
        )
    dtype = next(iter(node.dtypes))
    if node.shape_changed is None:
        return Tensor(dtype, node.shape)
    return Ragged(dtype, ndim)


def _promote(dtypes: Mapping[str, int]) -> str | None:
    """The dtype that holds every value of ``dtypes`` exactly (numpy's promotion), if chute has it."""
    if "bfloat16" in dtypes:
        return None
    numpy = [np.dtype(np.bool_) if d == "bool" else np.dtype(d) for d in dtypes]
    name = np.result_type(*numpy).name
    return name if name in DTYPES else None


def extract_columns(samples: Sequence[Mapping[str, Any]], columns: list[Column]) -> dict[str, list[Any]]:
    """:func:`extract` of each sample, column by column: each planned column's values, in order (the same values)."""
    out = {}
    for column in columns:
        values: list[Any] = list(samples)
        for key in column.path:  # a level of every sample at once: what extract does to each
            if set(map(type, values)) <= {dict}:
                values = list(map(dict.get, values, itertools.repeat(key)))
            else:
                values = [v.get(key) if isinstance(v, Mapping) else None for v in values]
        out[column.name] = values
    return out


def extract(sample: Mapping[str, Any], columns: list[Column]) -> dict[str, Any]:
    """The flat sample the writer takes: each planned column's value, None where the key is missing."""
    out = {}
    for column in columns:
        value: Any = sample
        for key in column.path:
            value = value.get(key) if type(value) is dict or isinstance(value, Mapping) else None
            if value is None:
                break
        out[column.name] = value
    return out

