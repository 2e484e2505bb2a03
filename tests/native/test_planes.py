"""chute._native.planes: an RGB crop laid out as planes (CHW), identical to numpy's transposed copy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from chute import _native

from ._reference import SETTINGS


def reference(image: np.ndarray, x0: int, y0: int, h: int, w: int, flip: bool) -> np.ndarray:
    crop = image[y0:y0 + h, x0:x0 + w].transpose(2, 0, 1)
    return np.ascontiguousarray(crop[:, :, ::-1] if flip else crop)


@st.composite
def crops(draw):
    height, width = draw(st.integers(0, 70)), draw(st.integers(0, 70))  # widths around the 16-pixel step
    h, w = draw(st.integers(0, height)), draw(st.integers(0, width))
    y0, x0 = draw(st.integers(0, height - h)), draw(st.integers(0, width - w))
    return height, width, x0, y0, h, w, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(crops())
@example((1, 1, 0, 0, 1, 1, True, 0))
@example((3, 40, 3, 1, 2, 33, True, 7))  # two SIMD steps and a scalar tail, mirrored
@example((300, 300, 37, 11, 224, 224, False, 1))  # large enough to run without the GIL
def test_planes_equal_numpy_transposed_copy(args):
    height, width, x0, y0, h, w, flip, seed = args
    image = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = np.full((3, h, w), 77, np.uint8)
    _native.planes(image, height, width, x0, y0, out, h, w, flip)
    assert np.array_equal(out, reference(image, x0, y0, h, w, flip))


def test_planes_refuses_a_crop_outside_the_image_or_buffers_of_the_wrong_size():
    image = np.zeros((10, 20, 3), np.uint8)
    out = np.zeros((3, 5, 5), np.uint8)
    with pytest.raises(ValueError, match=r"the crop x 16\.\.21, y 0\.\.5 is outside the 20 x 10 image"):
        _native.planes(image, 10, 20, 16, 0, out, 5, 5)
    with pytest.raises(ValueError, match=r"image holds 600 bytes and out 75: an RGB image of 20 x 11 needs 660"):
        _native.planes(image, 11, 20, 0, 0, out, 5, 5)
    with pytest.raises(ValueError, match=r"a crop of 4 x 5 60"):
        _native.planes(image, 10, 20, 0, 0, out, 5, 4)
    with pytest.raises(ValueError, match="x0"):
        _native.planes(image, 10, 20, -1, 0, out, 5, 5)
    with pytest.raises(ValueError, match="image"):  # a view that is not C-contiguous
        _native.planes(image[:, ::2], 10, 10, 0, 0, out, 5, 5)
    with pytest.raises((ValueError, TypeError), match="out"):  # read-only
        _native.planes(image, 10, 20, 0, 0, b"\0" * 75, 5, 5)
    assert not out.any()  # nothing written by a refused call
