"""gather_binary, take_objects and join_json against pyarrow and json on multi-shard columns."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from chute import _native

from ._reference import SETTINGS, batches, binary_source, offsets_of

texts = st.text(st.characters(codec="utf-8"), max_size=12)
blobs = st.binary(max_size=12)


@st.composite
def columns(draw, values, arrow_type):
    """A column cut into shards (some of them slices of a longer array), and a batch of indices."""
    shards = draw(st.lists(st.lists(values, max_size=12), min_size=1, max_size=5))
    arrays = []
    for rows in shards:
        # A shard may be a slice of a longer array: its value offsets do not start at 0.
        before, after = draw(st.lists(values, max_size=2)), draw(st.lists(values, max_size=2))
        arrays.append(pa.array(before + rows + after, arrow_type).slice(len(before), len(rows)))
    layout = [len(a) for a in arrays]
    return arrays, layout, draw(batches(layout))


def concat(arrays, arrow_type):
    return pa.chunked_array(arrays, arrow_type).combine_chunks()


@SETTINGS
@given(
    st.one_of(
        st.tuples(st.just(("str", str, pa.large_string())), columns(texts, pa.large_string())),
        st.tuples(st.just(("bytes", bytes, pa.large_binary())), columns(blobs, pa.large_binary())),
    )
)
def test_take_objects_equals_pyarrow(args):
    (kind, python_type, arrow_type), (arrays, layout, indices) = args
    got = _native.take_objects(indices, offsets_of(layout), [binary_source(a) for a in arrays], kind)
    assert got == concat(arrays, arrow_type).take(indices).to_pylist()
    assert all(type(v) is python_type for v in got)


@SETTINGS
@given(columns(texts, pa.large_string()))
def test_gather_binary_equals_pyarrow_take(case):
    arrays, layout, indices = case
    new_offsets, data = _native.gather_binary(indices, offsets_of(layout), [binary_source(a) for a in arrays])
    gathered = pa.Array.from_buffers(pa.large_string(), len(indices), [None, pa.py_buffer(new_offsets), pa.py_buffer(data)])
    gathered.validate(full=True)
    assert gathered.equals(concat(arrays, pa.large_string()).take(indices))
    assert np.frombuffer(new_offsets, np.int64)[0] == 0


@SETTINGS
@given(
    st.sampled_from([(pa.int8(), 1), (pa.int16(), 2), (pa.float32(), 4), (pa.int64(), 8)]),
    st.lists(st.lists(st.lists(st.integers(0, 100), max_size=6), max_size=8), min_size=1, max_size=4),
    st.data(),
)
def test_gather_binary_counts_list_offsets_in_items(item, shards, data):
    """large_list<T>: offsets count items of item_size bytes; the result wraps into the same list type."""
    value_type, item_size = item
    list_type = pa.large_list(value_type)
    arrays = [pa.array(rows, list_type) for rows in shards]
    layout = [len(a) for a in arrays]
    indices = data.draw(batches(layout))
    sources = [(a.buffers()[1], a.buffers()[3]) for a in arrays]
    new_offsets, values = _native.gather_binary(indices, offsets_of(layout), sources, item_size=item_size)
    n_items = int(np.frombuffer(new_offsets, np.int64)[-1])
    flat = pa.Array.from_buffers(value_type, n_items, [None, pa.py_buffer(values)])
    gathered = pa.LargeListArray.from_arrays(pa.array(np.frombuffer(new_offsets, np.int64)), flat)
    assert gathered.to_pylist() == concat(arrays, list_type).take(indices).to_pylist()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(st.lists(st.lists(json_values, max_size=8), min_size=1, max_size=4), st.data())
def test_join_json_decodes_like_per_row_json_loads(shards, data):
    arrays = [pa.array([json.dumps(v, ensure_ascii=False) for v in rows], pa.large_string()) for rows in shards]
    layout = [len(a) for a in arrays]
    indices = data.draw(batches(layout))
    new_offsets, texts_ = _native.gather_binary(indices, offsets_of(layout), [binary_source(a) for a in arrays])
    joined = _native.join_json(new_offsets, texts_)
    rows = concat(arrays, pa.large_string()).take(indices).to_pylist()
    assert json.loads(joined) == [json.loads(r) for r in rows]
    assert joined == b"[" + b",".join(r.encode() for r in rows) + b"]"


def test_join_json_of_an_empty_batch():
    assert _native.join_json(np.zeros(1, np.int64), b"") == b"[]"
    assert _native.join_json(np.array([2, 2, 5], np.int64), b"xx[1]") == b"[,[1]]"  # only concatenates


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([], "offsets must hold n \\+ 1 entries for n rows, got none"),
        ([-1, 2], r"offsets\[0\] = -1 is negative, decreasing or beyond the data \(3 bytes\)"),
        ([0, 2, 1], r"offsets\[2\] = 1 is negative, decreasing"),
        ([0, 4], r"offsets\[1\] = 4 is negative, decreasing or beyond the data \(3 bytes\)"),
    ],
)
def test_join_json_refuses_bad_offsets(offsets, message):
    with pytest.raises(ValueError, match=message):
        _native.join_json(np.array(offsets, np.int64), b"abc")


def test_take_objects_ascii_fast_path_and_multibyte_text():
    rows = ["", "a", "abcdefgh", "abcdefghijklmnopq", "é", "日本語テキスト", "😀 emoji", "x" * 1000 + "é"]
    array = pa.array(rows, pa.large_string())
    got = _native.take_objects(np.arange(len(rows), dtype=np.int64), np.array([0, len(rows)]), [binary_source(array)], "str")
    assert got == rows


@pytest.mark.parametrize("bad", [b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"ok\x80"])
def test_take_objects_refuses_invalid_utf8_naming_shard_and_row(bad):
    good = pa.array(["a", "b"], pa.large_string())
    sources = [binary_source(good), (np.array([0, 1, 3, 3 + len(bad)], np.int64), b"xyz" + bad)]
    offsets = np.array([0, 2, 5], np.int64)
    with pytest.raises(_native.CorruptShard, match=r"shard 1, row 2: the value is not valid UTF-8") as raised:
        _native.take_objects(np.array([0, 3, 4], np.int64), offsets, sources, "str")
    assert (raised.value.shard, raised.value.row) == (1, 2)
    assert _native.take_objects(np.array([0, 4], np.int64), offsets, sources, "bytes") == [b"a", bad]


def test_take_objects_refuses_a_bad_kind():
    with pytest.raises(ValueError, match="kind must be 'str' or 'bytes', got 'int64'"):
        _native.take_objects(np.zeros(0, np.int64), np.array([0]), [], "int64")


def test_binary_unmapped_and_index_errors():
    array = pa.array(["a", "b"], pa.large_string())
    with pytest.raises(_native.Unmapped) as raised:
        _native.gather_binary(np.array([2, 0], np.int64), np.array([0, 2, 4]), [binary_source(array), None])
    assert raised.value.shard == 1
    with pytest.raises(IndexError, match="index 4 "):
        _native.take_objects(np.array([4], np.int64), np.array([0, 2, 4]), [binary_source(array), None], "str")
    with pytest.raises(ValueError, match=r"sources\[0\] must be a tuple of 2 buffers"):
        _native.gather_binary(np.array([0], np.int64), np.array([0, 2]), [array.buffers()[2]])
    with pytest.raises(ValueError, match="item_size must be in"):
        _native.gather_binary(np.array([0], np.int64), np.array([0, 2]), [binary_source(array)], item_size=0)
