"""gather_map, take_dicts and dicts_from_values against pyarrow on multi-shard map columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from chute import _native

from ._reference import SETTINGS, batches, map_source, offsets_of

texts = st.text(st.characters(codec="utf-8"), max_size=8)
keys = st.one_of(texts, st.sampled_from(["a", "b", "ключ"]))  # small pool: repeated keys are likely

VALUE_KINDS = {
    "str": (pa.large_string(), texts),
    "bytes": (pa.large_binary(), st.binary(max_size=8)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "float64": (pa.float64(), st.floats(allow_nan=False)),
}


@st.composite
def map_columns(draw, kind: str, duplicates: bool = True):
    """A map<large_string, V> column cut into shards (some sliced), and a batch of indices."""
    value_type, values = VALUE_KINDS[kind]
    map_type = pa.map_(pa.large_string(), value_type)
    if duplicates:
        entries = st.lists(st.tuples(keys, values), max_size=6)
    else:
        entries = st.dictionaries(keys, values, max_size=6).map(lambda d: list(d.items()))
    arrays = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.lists(entries, max_size=8))
        before, after = draw(st.lists(entries, max_size=2)), draw(st.lists(entries, max_size=2))
        arrays.append(pa.array(before + rows + after, map_type).slice(len(before), len(rows)))
    layout = [len(a) for a in arrays]
    return map_type, arrays, layout, draw(batches(layout))


def wrap(map_type: pa.MapType, n: int, gathered: tuple[bytes, ...]) -> pa.Array:
    """gather_map's buffers as a MapArray of the column's type, with no conversion."""
    entry_offsets, key_offsets, key_data, value_offsets, value_data = gathered
    entries = len(key_offsets) // 8 - 1
    keys_ = pa.Array.from_buffers(pa.large_string(), entries, [None, pa.py_buffer(key_offsets), pa.py_buffer(key_data)])
    if value_offsets:
        value_buffers = [None, pa.py_buffer(value_offsets), pa.py_buffer(value_data)]
    else:
        value_buffers = [None, pa.py_buffer(value_data)]
    values_ = pa.Array.from_buffers(map_type.item_type, entries, value_buffers)
    struct = pa.StructArray.from_arrays([keys_, values_], fields=[map_type.key_field, map_type.item_field])
    return pa.Array.from_buffers(map_type, n, [None, pa.py_buffer(entry_offsets)], children=[struct])


def concat(arrays, map_type):
    return pa.chunked_array(arrays, map_type).combine_chunks()


@SETTINGS
@given(st.sampled_from(sorted(VALUE_KINDS)).flatmap(map_columns))
def test_gather_map_wraps_into_the_map_array_pyarrow_take_gives(case):
    map_type, arrays, layout, indices = case
    gathered = _native.gather_map(indices, offsets_of(layout), [map_source(a) for a in arrays])
    result = wrap(map_type, len(indices), gathered)
    result.validate(full=True)
    assert result.type == map_type
    assert result.equals(concat(arrays, map_type).take(indices))
    fixed = not pa.types.is_large_string(map_type.item_type) and not pa.types.is_large_binary(map_type.item_type)
    assert (gathered[3] == b"") == fixed


@SETTINGS
@given(st.sampled_from(sorted(VALUE_KINDS)).flatmap(lambda kind: st.tuples(st.just(kind), map_columns(kind))))
def test_take_dicts_keeps_entry_order_and_the_last_duplicate(args):
    kind, (map_type, arrays, layout, indices) = args
    got = _native.take_dicts(indices, offsets_of(layout), [map_source(a) for a in arrays], kind)
    expected = []
    for pairs in concat(arrays, map_type).take(indices).to_pylist():
        row = {}
        for key, value in pairs:
            row[key] = value
        expected.append(row)
    assert got == expected
    assert [list(d) for d in got] == [list(d) for d in expected]  # key order too


@SETTINGS
@given(st.sampled_from(sorted(VALUE_KINDS)).flatmap(lambda kind: st.tuples(st.just(kind), map_columns(kind, duplicates=False))))
def test_take_dicts_equals_pyarrow_strict_dicts(args):
    kind, (map_type, arrays, layout, indices) = args
    got = _native.take_dicts(indices, offsets_of(layout), [map_source(a) for a in arrays], kind)
    assert got == _strict_dicts(concat(arrays, map_type).take(indices))


def _strict_dicts(array) -> list:
    """pyarrow's ``to_pylist(maps_as_pydicts="strict")`` (pyarrow >= 16); at older pyarrow (the declared
    minimum) the same built from the pairs: this test's maps have no duplicate keys."""
    try:
        return array.to_pylist(maps_as_pydicts="strict")
    except TypeError:
        return [None if pairs is None else dict(pairs) for pairs in array.to_pylist()]


@SETTINGS
@given(map_columns("str"))
def test_dicts_from_values_rebuilds_rows_from_decoded_values(case):
    map_type, arrays, layout, indices = case
    gathered = _native.gather_map(indices, offsets_of(layout), [map_source(a) for a in arrays])
    values = [("decoded", v) for v in wrap(map_type, len(indices), gathered).values.field(1).to_pylist()]
    got = _native.dicts_from_values(gathered[0], gathered[1], gathered[2], values)
    expected = []
    for pairs in concat(arrays, map_type).take(indices).to_pylist():
        row = {}
        for key, value in pairs:
            row[key] = ("decoded", value)
        expected.append(row)
    assert got == expected


def test_w1_rows_come_back_as_written():
    """W1: ten 5-digit string keys to 5-digit string values per sample."""
    rng = np.random.default_rng(0)
    rows = [{str(k): str(v) for k, v in zip(rng.integers(10000, 100000, 10), rng.integers(10000, 100000, 10))} for _ in range(300)]
    map_type = pa.map_(pa.large_string(), pa.large_string())
    arrays = [pa.array([list(r.items()) for r in rows[a:b]], map_type) for a, b in ((0, 100), (100, 250), (250, 300))]
    indices = rng.permutation(300).astype(np.int64)
    got = _native.take_dicts(indices, np.array([0, 100, 250, 300]), [map_source(a) for a in arrays], "str")
    assert got == [rows[i] for i in indices]
    assert all(list(g) == list(rows[i]) for g, i in zip(got, indices))


def test_map_errors():
    map_type = pa.map_(pa.large_string(), pa.large_string())
    array = pa.array([[("a", "b")], []], map_type)
    offsets = np.array([0, 2, 4], np.int64)
    with pytest.raises(_native.Unmapped) as raised:
        _native.take_dicts(np.array([3, 0], np.int64), offsets, [map_source(array), None], "str")
    assert raised.value.shard == 1
    with pytest.raises(ValueError, match="shard 0: value_offsets must be None for fixed-size values"):
        _native.take_dicts(np.array([0], np.int64), offsets, [map_source(array), None], "int64")
    with pytest.raises(ValueError, match="kind must be 'str', 'bytes', 'int64' or 'float64'"):
        _native.take_dicts(np.array([0], np.int64), offsets, [map_source(array), None], "list")
    with pytest.raises(ValueError, match=r"sources\[0\] must be a tuple of 5 buffers"):
        _native.gather_map(np.array([0], np.int64), offsets, [map_source(array)[:4], None])
    with pytest.raises(ValueError, match=r"sources\[0\]\[1\] must be a C-contiguous buffer"):
        _native.gather_map(np.array([0], np.int64), offsets, [(map_source(array)[0], None, b"", None, b""), None])


def test_dicts_from_values_validates_its_inputs():
    eo, ko, kd = np.array([0, 1, 2], np.int32), np.array([0, 1, 2], np.int64), b"ab"
    assert _native.dicts_from_values(eo, ko, kd, [1, 2]) == [{"a": 1}, {"b": 2}]
    with pytest.raises(ValueError, match="values holds 3 objects for 2 map entries"):
        _native.dicts_from_values(eo, ko, kd, [1, 2, 3])
    with pytest.raises(ValueError, match="values must be a list"):
        _native.dicts_from_values(eo, ko, kd, (1, 2))
    with pytest.raises(ValueError, match=r"entry_offsets\[1\] = 3"):
        _native.dicts_from_values(np.array([0, 3, 2], np.int32), ko, kd, [1, 2])
    with pytest.raises(ValueError, match="key_offsets holds 2 entries, needs 3 for 2 keys"):
        _native.dicts_from_values(eo, ko[:2], kd, [1, 2])
    with pytest.raises(ValueError, match="key_offsets 1, 3 of entry 1 are negative, decreasing or beyond key_data"):
        _native.dicts_from_values(eo, np.array([0, 1, 3], np.int64), kd, [1, 2])
    with pytest.raises(ValueError, match="a key of row 1 is not valid UTF-8"):
        _native.dicts_from_values(eo, ko, b"a\xff", [1, 2])
    assert _native.dicts_from_values(np.zeros(1, np.int32), np.zeros(1, np.int64), b"", []) == []


def test_an_empty_batch_of_fixed_or_variable_values():
    for value_type, fixed in ((pa.large_string(), False), (pa.int64(), True)):
        map_type = pa.map_(pa.large_string(), value_type)
        array = pa.array([[("a", "1" if not fixed else 1)]], map_type)
        gathered = _native.gather_map(np.zeros(0, np.int64), np.array([0, 1]), [map_source(array)])
        assert wrap(map_type, 0, gathered).to_pylist() == []
        assert (gathered[3] == b"") == fixed
