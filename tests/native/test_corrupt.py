"""Corrupted shards: byte flips and truncations in offsets and data buffers.

Every outcome is judged by the pure-Python reference (tests/native/_reference.py): the
native call raises CorruptShard naming one of the (shard, row) pairs the reference
finds wrong, or, when the reference finds nothing wrong, returns exactly its result.
Never a crash, never a read out of bounds (the data after each buffer is not readable
by construction: bytes objects end where they end).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import event, given, strategies as st

from chute import _native

from ._reference import SETTINGS, Corrupt, batches, binary_source, flip_bytes, map_source, offsets_of, ref_binary, ref_map

texts = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def damage(draw, buffer) -> bytes:
    """``buffer`` with a few bytes replaced, or cut short, or both."""
    raw = bytes(buffer)
    count = draw(st.integers(1, 4))
    positions = draw(st.lists(st.integers(0, 1 << 20), min_size=count, max_size=count))
    values = draw(st.lists(st.integers(0, 255), min_size=count, max_size=count))
    if draw(st.booleans()):
        raw = flip_bytes(raw, positions, values)
    if draw(st.booleans()) or raw == bytes(buffer):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


def assert_judged(call, reference):
    """``call()`` and ``reference()`` agree: the same rows, or CorruptShard at a row the reference blames."""
    try:
        expected = reference()
    except Corrupt as corrupt:
        event("the reference finds the shard corrupt")
        with pytest.raises(_native.CorruptShard) as raised:
            call()
        assert (raised.value.shard, raised.value.row) in corrupt.problems, (str(raised.value), corrupt.problems)
        assert str(raised.value).startswith(f"shard {raised.value.shard}")
        return None
    event("the reference finds the shard valid")
    assert call() == expected
    return expected


def split(offsets: bytes, data: bytes, unit: int = 1) -> list[bytes]:
    o = np.frombuffer(offsets, np.int64)
    return [data[o[i] * unit : o[i + 1] * unit] for i in range(len(o) - 1)]


@st.composite
def binary_cases(draw):
    shards = draw(st.lists(st.lists(texts, max_size=8), min_size=1, max_size=4))
    sources = [tuple(bytes(b) for b in binary_source(pa.array(rows, pa.large_string()))) for rows in shards]
    layout = [len(rows) for rows in shards]
    indices = draw(batches(layout, max_size=20).filter(len)) if sum(layout) else np.zeros(0, np.int64)
    victim = draw(st.integers(0, len(shards) - 1))
    part = draw(st.integers(0, 1))
    damaged = list(sources[victim])
    damaged[part] = draw(damage(damaged[part]))
    sources[victim] = tuple(damaged)
    return offsets_of(layout), indices, sources


@SETTINGS
@given(binary_cases())
def test_damaged_binary_shards(case):
    offsets, indices, sources = case
    assert_judged(
        lambda: split(*_native.gather_binary(indices, offsets, sources)),
        lambda: ref_binary(indices, offsets, sources),
    )


@SETTINGS
@given(binary_cases())
def test_damaged_string_shards_as_objects(case):
    offsets, indices, sources = case

    def reference():
        rows = ref_binary(indices, offsets, sources)
        bad = set()
        for x, raw in zip(indices, rows):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                s = int(np.searchsorted(offsets, x, side="right")) - 1
                bad.add((s, int(x - offsets[s])))
        if bad:
            raise Corrupt(bad)
        return [raw.decode("utf-8") for raw in rows]

    assert_judged(lambda: _native.take_objects(indices, offsets, sources, "str"), reference)


@st.composite
def map_cases(draw, value_type=pa.large_string(), values=texts):
    map_type = pa.map_(pa.large_string(), value_type)
    shards = draw(st.lists(st.lists(st.lists(st.tuples(texts, values), max_size=4), max_size=6), min_size=1, max_size=3))
    sources = [
        tuple(None if b is None else bytes(b) for b in map_source(pa.array(rows, map_type))) for rows in shards
    ]
    layout = [len(rows) for rows in shards]
    indices = draw(batches(layout, max_size=12).filter(len)) if sum(layout) else np.zeros(0, np.int64)
    victim = draw(st.integers(0, len(shards) - 1))
    part = draw(st.sampled_from([0, 1, 2, 3, 4] if sources[victim][3] is not None else [0, 1, 2, 4]))
    damaged = list(sources[victim])
    damaged[part] = draw(damage(damaged[part]))
    sources[victim] = tuple(damaged)
    return offsets_of(layout), indices, sources


def map_rows(gathered: tuple[bytes, ...], value_size: int = 8) -> list[list[tuple[bytes, bytes]]]:
    entry_offsets, key_offsets, key_data, value_offsets, value_data = gathered
    keys = split(key_offsets, key_data)
    if value_offsets:
        values = split(value_offsets, value_data)
    else:
        values = [value_data[i : i + value_size] for i in range(0, len(value_data), value_size)]
    eo = np.frombuffer(entry_offsets, np.int32)
    return [list(zip(keys[eo[i] : eo[i + 1]], values[eo[i] : eo[i + 1]])) for i in range(len(eo) - 1)]


@SETTINGS
@given(st.one_of(map_cases(), map_cases(pa.int64(), st.integers(-(2**63), 2**63 - 1))))
def test_damaged_map_shards(case):
    """Variable (large_string) and fixed-size (int64) values."""
    offsets, indices, sources = case
    assert_judged(
        lambda: map_rows(_native.gather_map(indices, offsets, sources)),
        lambda: ref_map(indices, offsets, sources),
    )


@SETTINGS
@given(map_cases())
def test_damaged_map_shards_as_dicts(case):
    offsets, indices, sources = case

    def reference():
        rows = ref_map(indices, offsets, sources, text_values=True)
        dicts = []
        for entries in rows:
            row = {}
            for key, value in entries:
                row[key.decode()] = value.decode()
            dicts.append(row)
        return dicts

    assert_judged(lambda: _native.take_dicts(indices, offsets, sources, "str"), reference)


def test_corrupt_shard_messages_name_the_sizes():
    offsets = np.array([0, 2], np.int64)
    with pytest.raises(_native.CorruptShard, match=r"shard 0: value offsets hold 2 entries, need 3 for 2 rows"):
        _native.gather_binary(np.array([0], np.int64), offsets, [(np.array([0, 1], np.int64), b"ab")])
    with pytest.raises(_native.CorruptShard, match=r"shard 0, row 1: value offsets 2, 1 are negative or decreasing"):
        _native.gather_binary(np.array([1], np.int64), offsets, [(np.array([0, 2, 1], np.int64), b"ab")])
    with pytest.raises(
        _native.CorruptShard, match=r"shard 0, row 1: value offset 9 is beyond the data buffer \(2 bytes, items of 1 bytes\)"
    ):
        _native.gather_binary(np.array([1], np.int64), offsets, [(np.array([0, 1, 9], np.int64), b"ab")])
    entry_offsets = np.array([0, 1, 5], np.int32)
    source = (entry_offsets, np.array([0, 1], np.int64), b"k", np.array([0, 1], np.int64), b"v")
    with pytest.raises(
        _native.CorruptShard,
        match=r"shard 0, row 1: entry offsets 1, 5 are negative, decreasing or beyond the 1 keys and 1 values",
    ):
        _native.take_dicts(np.array([1], np.int64), offsets, [source], "str")
    source = (np.array([0, 1, 1], np.int32), np.array([0, 1], np.int64), b"\xff", np.array([0, 1], np.int64), b"v")
    with pytest.raises(_native.CorruptShard, match=r"shard 0, row 0: the key of map entry 0 is not valid UTF-8"):
        _native.gather_map(np.array([0], np.int64), offsets, [source])
    with pytest.raises(_native.CorruptShard, match=r"shard 0, row 0: a key is not valid UTF-8"):
        _native.take_dicts(np.array([0], np.int64), offsets, [source], "str")
    corrupt = _native.CorruptShard("x")
    assert isinstance(corrupt, ValueError)
