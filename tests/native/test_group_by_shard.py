"""chute._native.group_by_shard: each batch's rows stably grouped by shard, identical to the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from chute import _native
from chute.order import _group_by_shard_numpy

from ._reference import SETTINGS


def _offsets(sizes):
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(np.asarray(sizes, np.int64), out=offsets[1:])
    return offsets


def _grouped(rows, offsets):
    out = np.full_like(rows, -7)
    _native.group_by_shard(rows, rows.shape[1], offsets, out)
    return out


@SETTINGS
@given(
    st.lists(st.integers(0, 40), min_size=0, max_size=60),  # shard sizes (empty shards too)
    st.integers(1, 300),  # width
    st.integers(0, 5),  # rows
    st.integers(0, 2**32 - 1),
)
@example([], 3, 2, 0)  # no shard: every value is past the end
@example([5], 1, 3, 1)
@example([10, 10], 256, 2, 2)
def test_rows_are_grouped_as_numpy_groups_them(sizes, width, count, seed):
    offsets = _offsets(sizes)
    rng = np.random.default_rng(seed)
    rows = rng.integers(-3, int(offsets[-1]) + 4, (count, width)).astype(np.int64)  # values outside every shard too
    assert np.array_equal(_grouped(rows, offsets), _group_by_shard_numpy(rows, offsets))


@pytest.mark.parametrize("shards, shard_rows", [(5, 40_000), (4000, 50), (3, 1)])
def test_wide_spans_and_many_shards(shards, shard_rows):
    """Rows that cover more shards than the counting sort spans (merge-sorted), few shards, tiny shards."""
    offsets = _offsets([shard_rows] * shards)
    rows = np.random.default_rng(shards).integers(0, int(offsets[-1]), (64, 256))
    assert np.array_equal(_grouped(rows, offsets), _group_by_shard_numpy(rows, offsets))
    in_order = np.sort(rows, axis=1)  # already grouped: copied as it is
    assert np.array_equal(_grouped(in_order, offsets), in_order)


def test_group_by_shard_refuses_bad_arguments():
    offsets = _offsets([4, 4])
    rows = np.arange(8, dtype=np.int64)
    out = np.empty(8, np.int64)
    with pytest.raises(ValueError, match=r"width must be in \[1, 4294967295\], got 0"):
        _native.group_by_shard(rows, 0, offsets, out)
    with pytest.raises(ValueError, match="rows does not hold a whole number of rows of width values"):
        _native.group_by_shard(rows, 3, offsets, out)
    with pytest.raises(ValueError, match="out does not hold as many values as rows"):
        _native.group_by_shard(rows, 4, offsets, np.empty(4, np.int64))
    with pytest.raises(ValueError, match="offsets must hold S"):
        _native.group_by_shard(rows, 4, np.empty(0, np.int64), out)
    with pytest.raises(ValueError, match="out overlaps rows"):
        _native.group_by_shard(rows, 4, offsets, rows)
    with pytest.raises(ValueError, match="rows must be an int64 buffer"):
        _native.group_by_shard(rows.astype(np.float64), 4, offsets, out)
    with pytest.raises(ValueError, match="out must be a C-contiguous writable buffer"):
        _native.group_by_shard(rows, 4, offsets, np.frombuffer(bytes(64), np.int64))
