"""A pass's first batch is cut from a prefix of its window's permutation: the same rows as the whole."""

from __future__ import annotations

import numpy as np
import pytest

from chute.order import PREFIX_ROWS, Order, permutation, permutation_prefix


@pytest.mark.parametrize("n", [2, 3, 5, 17, 64, 100, 1000, 4097, 174_312])
@pytest.mark.parametrize("count", [1, 7, 256, 5000])
def test_a_prefix_of_the_permutation_is_the_permutation_cut(n: int, count: int) -> None:
    for key in (0, 1, 12345):
        assert np.array_equal(permutation_prefix(n, key, count), permutation(n, key)[:count])


@pytest.mark.parametrize("start", [0, 3, 100, PREFIX_ROWS - 10])
def test_first_positions_of_a_fresh_order_equal_those_of_the_whole_window(start: int) -> None:
    shard_rows = (43_578, 43_578, 1, 43_578, 25_688, 0, 9)
    for epoch in range(3):
        fresh = Order(shard_rows, 256, shuffle=True, seed=7, window=4)  # nothing computed yet: prefix path
        whole = Order(shard_rows, 256, shuffle=True, seed=7, window=4).global_order(epoch)
        assert np.array_equal(fresh.positions(epoch, start, start + 256), whole[start : start + 256])
        assert np.array_equal(fresh.batch(epoch, 0, 0, 1, start), Order(shard_rows, 256, True, 7, 4).batch(epoch, 0, 0, 1, start))
