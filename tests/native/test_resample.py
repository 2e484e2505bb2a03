"""chute._native.resample: a box of an RGB image resampled (bilinear, antialiased), mirrored, as planes,
normalised through a table: equal to a numpy implementation of the same arithmetic (within one level of
Pillow's resize of the same box: tests/images/test_decode.py, where Pillow is installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, strategies as st

from chute import _native
from chute.images import Normalize

from ._reference import SETTINGS

BITS = 22


def weights(in_size: int, in0: float, in1: float, out_size: int) -> list[tuple[int, np.ndarray]]:
    """Per output pixel: the first input pixel and the fixed-point weights (Pillow's bilinear, float32 box)."""
    in0, in1 = np.float32(in0), np.float32(in1)
    scale = float(np.float32(in1 - in0)) / out_size
    filterscale = max(scale, 1.0)
    support = filterscale
    rows = []
    for xx in range(out_size):
        center = float(in0) + (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = np.array([max(0.0, 1.0 - abs((x + xmin - center + 0.5) / filterscale)) for x in range(max(xmax, 0))])
        if w.sum() != 0:
            w = w / w.sum()
        rows.append((xmin, np.floor(0.5 + w * (1 << BITS)).astype(np.int64)))
    return rows


def clip8(acc: np.ndarray) -> np.ndarray:
    return np.clip(acc >> BITS, 0, 255).astype(np.uint8)


def reference(image: np.ndarray, box: tuple[float, ...], oh: int, ow: int, flip: bool) -> np.ndarray:
    """The horizontal pass (8-bit result) over the rows the vertical pass reads, then the vertical pass;
    a pass whose box is the whole side at the same size is left out. Planes, mirrored."""
    height, width = image.shape[:2]
    x0, y0, x1, y1 = (np.float32(v) for v in box)
    need_h = ow != width or x0 != 0 or x1 != width
    need_v = oh != height or y0 != 0 or y1 != height
    vert = weights(height, y0, y1, oh)
    first, last = vert[0][0], vert[-1][0] + len(vert[-1][1])
    rows = image[first:last].astype(np.int64)
    if need_h:
        out = np.empty((last - first, ow, 3), np.uint8)
        for xx, (xmin, k) in enumerate(weights(width, x0, x1, ow)):
            out[:, xx] = clip8((1 << (BITS - 1)) + np.einsum("yxc,x->yc", rows[:, xmin:xmin + len(k)], k))
        rows = out.astype(np.int64)
    if need_v:
        out = np.empty((oh, rows.shape[1], 3), np.uint8)
        for yy, (ymin, k) in enumerate(vert):
            out[yy] = clip8((1 << (BITS - 1)) + np.einsum("yxc,y->xc", rows[ymin - first:ymin - first + len(k)], k))
        rows = out
    planes = rows.astype(np.uint8).transpose(2, 0, 1)
    return np.ascontiguousarray(planes[:, :, ::-1] if flip else planes)


@st.composite
def jobs(draw):
    height, width = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    x0 = draw(st.floats(0, width - 0.05)) if draw(st.booleans()) else float(draw(st.integers(0, width - 1)))
    y0 = draw(st.floats(0, height - 0.05)) if draw(st.booleans()) else float(draw(st.integers(0, height - 1)))
    x1 = draw(st.floats(x0 + 0.05, width)) if draw(st.booleans()) else float(width)
    y1 = draw(st.floats(y0 + 0.05, height)) if draw(st.booleans()) else float(height)
    oh, ow = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    return height, width, (x0, y0, x1, y1), oh, ow, draw(st.booleans()), draw(st.integers(0, 2**32 - 1))


@SETTINGS
@given(jobs())
@example((1, 1, (0.0, 0.0, 1.0, 1.0), 3, 2, True, 0))  # one pixel, enlarged
@example((30, 30, (0.0, 0.0, 30.0, 30.0), 30, 30, False, 1))  # the whole image at its size: no pass at all
@example((25, 40, (0.0, 0.0, 40.0, 25.0), 25, 13, True, 2))  # horizontal pass only
@example((40, 25, (0.0, 3.5, 25.0, 40.0), 7, 25, False, 3))  # vertical pass only
@example((375, 500, (10.5, 20.25, 300.7, 333.3), 224, 224, True, 4))  # an ImageNet crop
def test_resample_equals_the_numpy_arithmetic(args):
    height, width, box, oh, ow, flip, seed = args
    image = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = np.full((3, oh, ow), 77, np.uint8)
    _native.resample(image, height, width, box, out, oh, ow, flip)
    assert np.array_equal(out, reference(image, box, oh, ow, flip))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_table_gives_what_the_normalisation_arithmetic_gives(dtype):
    normalize = Normalize(dtype=dtype)
    image = np.random.default_rng(1).integers(0, 256, (90, 120, 3), dtype=np.uint8)
    box, oh, ow = (3.25, 7.5, 101.0, 88.75), 48, 64
    plain = np.empty((3, oh, ow), np.uint8)
    _native.resample(image, 90, 120, box, plain, oh, ow, True)
    scale, offset = normalize.coefficients()
    expected = torch.from_numpy(plain * scale + offset).to(dtype)
    out = torch.empty((3, oh, ow), dtype=dtype)
    _native.resample(image, 90, 120, box, out.numpy(), oh, ow, True, normalize.table())
    assert torch.equal(out, expected)


def test_resample_refuses_a_box_outside_the_image_and_buffers_of_the_wrong_size():
    image = np.zeros((10, 20, 3), np.uint8)
    out = np.zeros((3, 5, 5), np.uint8)
    with pytest.raises(ValueError, match=r"the box \(\(0, 0, 21, 10\)\) is empty or outside the 20 x 10 image"):
        _native.resample(image, 10, 20, (0, 0, 21, 10), out, 5, 5)
    with pytest.raises(ValueError, match="is empty or outside"):
        _native.resample(image, 10, 20, (4, 0, 4, 10), out, 5, 5)
    with pytest.raises(ValueError, match="box must be 4 numbers"):
        _native.resample(image, 10, 20, (0, 0, 20), out, 5, 5)
    with pytest.raises(ValueError, match=r"image holds 600 bytes and out 75: an RGB image of 20 x 11 needs 660"):
        _native.resample(image, 11, 20, (0, 0, 20, 10), out, 5, 5)
    with pytest.raises(ValueError, match=r"the output 300"):  # float32 through a table: 4 bytes a value
        _native.resample(image, 10, 20, (0, 0, 20, 10), out, 5, 5, False, Normalize().table())
    with pytest.raises(ValueError, match=r"lut holds 12 bytes"):
        _native.resample(image, 10, 20, (0, 0, 20, 10), out, 5, 5, False, np.zeros(3, np.float32))
    with pytest.raises((ValueError, TypeError), match="out"):  # read-only
        _native.resample(image, 10, 20, (0, 0, 20, 10), b"\0" * 75, 5, 5)
    assert not out.any()  # nothing written by a refused call
    assert math.isclose(Normalize().table()[0, 255], (1 - 0.485) / 0.229, rel_tol=1e-6)
