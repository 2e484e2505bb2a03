"""chute._native.gather: fixed-size rows from many shards, fuzzed against numpy fancy indexing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from chute import _native

from ._reference import SETTINGS, batches, layouts, offsets_of, shard_of

SENTINEL = 255  # shard bytes are drawn below it, so any copied byte shows

row_sizes = st.one_of(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(1, 4096),
    st.sampled_from([65536 + 3, 1 << 20]),  # above the GIL-release threshold with a few rows
)


def make_shards(rows: list[int], row_bytes: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, SENTINEL, (r, row_bytes), dtype=np.uint8) for r in rows]


def sentinel_out(n: int, row_bytes: int) -> np.ndarray:
    return np.full((n, row_bytes), SENTINEL, dtype=np.uint8)


@st.composite
def cases(draw):
    row_bytes = draw(row_sizes)
    layout = draw(layouts if row_bytes <= 4096 else st.lists(st.integers(0, 3), min_size=1, max_size=3))
    indices = draw(batches(layout, max_size=40 if row_bytes <= 4096 else 6))
    return layout, row_bytes, indices, draw(st.integers(0, 2**32))


@SETTINGS
@given(cases())
def test_rows_equal_numpy_fancy_indexing(case):
    layout, row_bytes, indices, seed = case
    shards = make_shards(layout, row_bytes, seed)
    whole = np.concatenate(shards) if shards else np.zeros((0, row_bytes), np.uint8)
    out = sentinel_out(len(indices), row_bytes)
    _native.gather(indices, offsets_of(layout), [(shards, out, row_bytes)])
    assert np.array_equal(out, whole[indices])


@SETTINGS
@given(layouts.flatmap(lambda layout: st.tuples(st.just(layout), batches(layout))), st.integers(0, 2**32))
def test_one_call_gathers_every_column(case, seed):
    """Columns of different dtypes and widths share one call; each gets its own rows."""
    layout, indices = case
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (r, 3, 4, 4), dtype=np.uint8) for r in layout]
    labels = [rng.integers(-(2**62), 2**62, r, dtype=np.int64) for r in layout]
    weights = [rng.random(r, dtype=np.float32) for r in layout]
    out_images = np.zeros((len(indices), 3, 4, 4), np.uint8)
    out_labels = np.zeros(len(indices), np.int64)
    out_weights = np.zeros(len(indices), np.float32)
    _native.gather(
        indices,
        offsets_of(layout),
        [(images, out_images, 48), (labels, out_labels, 8), (weights, out_weights, 4)],
    )
    assert np.array_equal(out_images, np.concatenate(images)[indices])
    assert np.array_equal(out_labels, np.concatenate(labels)[indices])
    assert np.array_equal(out_weights, np.concatenate(weights)[indices])


def test_sources_may_be_any_buffer():
    """bytes, bytearray, memoryview, pyarrow.Buffer and numpy arrays of any dtype are byte sources."""
    import pyarrow as pa

    rows = [b"abcd", b"efgh", b"ijkl", b"mnop"]
    sources = [b"".join(rows[:1]), bytearray(b"".join(rows[1:2])), memoryview(rows[2]), pa.py_buffer(rows[3])]
    out = bytearray(4 * 5)
    _native.gather(np.array([3, 2, 1, 0, 3]), np.arange(5, dtype=np.int64), [(sources, out, 4)])
    assert bytes(out) == b"mnopijklefghabcdmnop"


# ---------------------------------------------------------------------------- refusals, before any copy


@SETTINGS
@given(layouts, st.data())
def test_an_index_out_of_range_is_refused_before_any_copy(layout, data):
    total = sum(layout)
    good = data.draw(batches(layout, max_size=10))
    bad = data.draw(st.one_of(st.integers(-(2**63), -1), st.integers(total, 2**63 - 1)))
    at = data.draw(st.integers(0, len(good)))
    indices = np.insert(good, at, bad).astype(np.int64)
    shards = make_shards(layout, 3, 0)
    out = sentinel_out(len(indices), 3)
    with pytest.raises(IndexError, match=rf"index {bad} \(position {at} of the batch\) is out of range for {total} rows"):
        _native.gather(indices, offsets_of(layout), [(shards, out, 3)])
    assert (out == SENTINEL).all()


@SETTINGS
@given(layouts.filter(lambda layout: sum(layout) > 0), st.data())
def test_an_unmapped_shard_is_reported_lowest_first_before_any_copy(layout, data):
    indices = data.draw(batches(layout).filter(len))
    needed = sorted({shard_of(offsets_of(layout), x)[0] for x in indices})
    unmapped = set(data.draw(st.lists(st.sampled_from(range(len(layout))), min_size=1)))
    # Two columns: the lowest needed shard that is None in either is the one reported.
    first = make_shards(layout, 5, 1)
    second = make_shards(layout, 2, 2)
    for s in unmapped:
        (first if s % 2 else second)[s] = None
    outs = sentinel_out(len(indices), 5), sentinel_out(len(indices), 2)
    expected = [s for s in needed if s in unmapped]
    columns = [(first, outs[0], 5), (second, outs[1], 2)]
    if not expected:
        _native.gather(indices, offsets_of(layout), columns)
        return
    with pytest.raises(_native.Unmapped) as raised:
        _native.gather(indices, offsets_of(layout), columns)
    assert raised.value.shard == expected[0]
    assert isinstance(raised.value, LookupError)
    assert f"shard {expected[0]} is not mapped" in str(raised.value)
    assert (outs[0] == SENTINEL).all() and (outs[1] == SENTINEL).all()


@SETTINGS
@given(layouts.filter(lambda layout: sum(layout) > 0), st.data())
def test_a_short_source_is_a_corrupt_shard_before_any_copy(layout, data):
    row_bytes = data.draw(st.integers(1, 64))
    indices = data.draw(batches(layout).filter(len))
    offsets = offsets_of(layout)
    shards = [s.tobytes() for s in make_shards(layout, row_bytes, 3)]
    victim = shard_of(offsets, int(data.draw(st.sampled_from(list(indices)))))[0]
    cut = data.draw(st.integers(1, len(shards[victim])))
    shards[victim] = shards[victim][:-cut]
    out = sentinel_out(len(indices), row_bytes)
    with pytest.raises(_native.CorruptShard) as raised:
        _native.gather(indices, offsets, [(shards, out, row_bytes)])
    assert (raised.value.shard, raised.value.row) == (victim, -1)
    assert f"holds {len(shards[victim])} bytes, too few for {layout[victim]} rows of {row_bytes} bytes" in str(raised.value)
    assert (out == SENTINEL).all()


def test_extra_bytes_after_a_shards_rows_are_allowed():
    """A source may be longer than its rows (e.g. a padded buffer): only the rows are read."""
    out = bytearray(2)
    _native.gather(np.array([0, 1]), np.array([0, 1, 2]), [([b"ab", b"cdef"], out, 1)])
    assert bytes(out) == b"ac"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros(2, np.int32), [0, 2]), "indices must be an int64 buffer"),
        ((np.zeros(2, np.float64), [0, 2]), "indices must be an int64 buffer"),
        ((np.zeros((4, 2), np.int64)[:, 0], [0, 2]), "indices must be a C-contiguous buffer"),
        ((b"\x00" * 12, [0, 2]), "indices holds 12 bytes, not a whole number of int64"),
        ((np.zeros(2, np.int64), [1, 2]), r"offsets\[0\] must be 0, got 1"),
        ((np.zeros(2, np.int64), [0, 2, 1]), r"offsets must be non-decreasing: offsets\[1\] = 2 > offsets\[2\] = 1"),
        ((np.zeros(2, np.int64), []), "offsets must hold S \\+ 1 entries"),
    ],
)
def test_bad_indices_or_offsets_are_value_errors(args, message):
    indices, offsets = args
    offsets = np.asarray(offsets, dtype=np.int64)
    with pytest.raises(ValueError, match=message):
        _native.gather(indices, offsets, [])


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (([b"ab"], bytearray(3), 1), r"columns\[0\]: out holds 3 bytes, needs 2 rows x 1 bytes"),
        (([b"ab"], b"xx", 1), r"columns\[0\]: out must be a C-contiguous writable buffer"),
        (([b"ab"], bytearray(2), 0), r"columns\[0\]: row_bytes must be in \[1, "),
        (([b"ab"], bytearray(2), 1.0), r"columns\[0\]: row_bytes must be an int, got float"),
        (([b"ab", b""], bytearray(2), 1), r"columns\[0\]: sources has 2 items for 1 shards"),
        (("ab", bytearray(2), 1), r"columns\[0\]: sources must be a list with one item per shard"),
        (([3], bytearray(2), 1), r"columns\[0\]: sources\[0\] must be a C-contiguous buffer"),
        (([b"ab"], bytearray(2)), r"columns\[0\] must be a \(sources, out, row_bytes\) tuple"),
    ],
)
def test_bad_columns_are_value_errors(column, message):
    with pytest.raises(ValueError, match=message):
        _native.gather(np.array([0, 1]), np.array([0, 2]), [column])


def test_a_bad_column_is_refused_even_when_an_earlier_column_is_fine():
    good = bytearray(b"\xff\xff")
    with pytest.raises(ValueError, match=r"columns\[1\]"):
        _native.gather(np.array([0, 1]), np.array([0, 2]), [([b"ab"], good, 1), ([b"ab"], bytearray(1), 1)])
    assert good == b"\xff\xff"


def test_keywords_and_call_errors():
    out = bytearray(1)
    _native.gather(indices=np.array([1]), offsets=np.array([0, 2]), columns=[([b"ab"], out, 1)])
    assert out == b"b"
    with pytest.raises(TypeError, match="missing required argument 'columns'"):
        _native.gather(np.array([1]), np.array([0, 2]))
    with pytest.raises(TypeError, match="unexpected keyword argument 'cols'"):
        _native.gather(np.array([1]), np.array([0, 2]), cols=[])


def test_empty_batches_and_empty_datasets():
    _native.gather(np.zeros(0, np.int64), np.array([0], np.int64), [([], bytearray(0), 4)])
    _native.gather(np.zeros(0, np.int64), np.array([0, 3], np.int64), [([None], bytearray(0), 4)])
    with pytest.raises(IndexError, match="out of range for 0 rows"):
        _native.gather(np.array([0]), np.array([0], np.int64), [([], bytearray(4), 4)])


def test_many_shards_touched_in_one_batch():
    """Past the small-batch paths: hundreds of shards, indices grouped by shard and shuffled."""
    rng = np.random.default_rng(5)
    layout = list(rng.integers(0, 5, 600))
    shards = make_shards(layout, 3, 6)
    whole = np.concatenate(shards)
    for indices in (np.arange(len(whole)), rng.permutation(len(whole)), rng.integers(0, len(whole), 3000)):
        out = sentinel_out(len(indices), 3)
        _native.gather(indices.astype(np.int64), offsets_of(layout), [(shards, out, 3)])
        assert np.array_equal(out, whole[indices])
