"""chute._native.feistel: the order's permutation, identical to the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from chute import _native
from chute.order import _permutation_numpy, permutation

from ._reference import SETTINGS


@SETTINGS
@given(st.integers(0, 5000), st.integers(0, 2**64 - 1))
@example(0, 0)
@example(1, 5)
@example(2, 2**64 - 1)
@example(4097, 3)  # just above a power of 4
def test_permutation_equals_the_numpy_reference(n, key):
    native = permutation(n, key)
    assert native.dtype == np.int64
    assert np.array_equal(native, _permutation_numpy(n, key))


@pytest.mark.parametrize("n", [(1 << 20) + 1, 3_000_001])
def test_permutation_across_the_numpy_reference_chunks(n):
    """Domains larger than the numpy code's 2**20-position chunks."""
    native = permutation(n, 12345)
    assert np.array_equal(native, _permutation_numpy(n, 12345))
    assert np.array_equal(np.sort(native), np.arange(n))


def test_feistel_refuses_bad_arguments():
    out = np.empty(10, np.int64)
    keys = [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match=r"half must be in \[1, 31\], got 0"):
        _native.feistel(10, 0, keys, out)
    with pytest.raises(ValueError, match=r"half = 1 covers 4\*\*half = 4 values, fewer than n = 10"):
        _native.feistel(10, 1, keys, out)
    with pytest.raises(ValueError, match="round_keys must be a sequence of 6 ints"):
        _native.feistel(10, 2, keys[:5], out)
    with pytest.raises(ValueError, match="round_keys must be a sequence of 6 ints"):
        _native.feistel(10, 2, keys[:5] + [2**64], out)
    with pytest.raises(ValueError, match="round_keys must be a sequence of 6 ints"):
        _native.feistel(10, 2, keys[:5] + [-1], out)
    with pytest.raises(ValueError, match="out holds 9 int64, needs n = 10"):
        _native.feistel(10, 2, keys, out[:9])
    with pytest.raises(ValueError, match="out must be an int64 buffer"):
        _native.feistel(10, 2, keys, np.empty(10, np.uint64))
    with pytest.raises(ValueError, match=r"n must be in \[0, "):
        _native.feistel(-1, 2, keys, out)
