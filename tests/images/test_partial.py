"""Partial JPEG decoding (chute._jpeg, libjpeg-turbo): a region's pixels are a full decode's, and
``Decode`` crops through it give what decoding the whole image gives."""

from __future__ import annotations

import numpy as np
import pytest

from chute.images import Decode, HorizontalFlip, Normalize, RandomResizedCrop
from chute.images.codec import Decoder
from chute.pipeline.transform import BatchContext
from tests.images._data import encode, pixels

simplejpeg = pytest.importorskip("simplejpeg")
jpeg_module = pytest.importorskip("chute._jpeg", reason="built only where libjpeg-turbo's headers were present at install")


def full(data: bytes, scale: int) -> np.ndarray:
    h, w, _, _ = simplejpeg.decode_jpeg_header(data)
    if scale == 1:
        return simplejpeg.decode_jpeg(data)
    return simplejpeg.decode_jpeg(data, min_height=-(-h // scale), min_width=-(-w // scale), min_factor=scale)


@pytest.mark.parametrize("options", [
    {"subsampling": 0},  # 4:4:4
    {"subsampling": 1},  # 4:2:2
    {"subsampling": 2},  # 4:2:0
    {"subsampling": 2, "progressive": True},
    {"mode": "L"},  # grey: comes out RGB
])
def test_a_region_is_the_full_decodes_pixels_but_a_cut_sides_outer_column(options):
    mode = options.pop("mode", None)
    data = encode(pixels(4, 150, 203), mode=mode, **options)
    rng = np.random.default_rng(0)
    decoder = Decoder()
    for scale in (1, 2, 4, 8):
        whole = full(data, scale)
        height, width = whole.shape[:2]
        for _ in range(12):
            x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
            x1, y1 = int(rng.integers(x0 + 1, width + 1)), int(rng.integers(y0 + 1, height + 1))
            got = decoder.decode_region(data, scale, x0, y0, x1, y1)
            assert got is not None
            region, left, top = got
            assert top == y0 and left <= x0 and region.shape[0] == y1 - y0 and left + region.shape[1] == x1
            lo = 1 if left > 0 else 0  # a cut side's outermost column is not a full decode's
            hi = region.shape[1] - (1 if x1 < width else 0)
            assert np.array_equal(region[:, lo:hi], whole[y0:y1, left + lo:left + hi]), (scale, x0, y0, x1, y1)


def test_decode_crops_through_partial_decoding_equal_whole_decodes_to_one_level():
    sizes = [(375, 500), (500, 375), (333, 500), (500, 500)]
    images = [encode(pixels(i, *sizes[i % 4])) for i in range(16)]
    rows = np.arange(16)
    ops = (RandomResizedCrop(224, scale=(0.08, 1.0)), HorizontalFlip(), Normalize())
    partial, whole = Decode("jpg", *ops), Decode("jpg", *ops, scaled=False)

    def run(transform):
        return transform.transform_batch({"jpg": images}, BatchContext(rows, 0, 11, None))["jpg"].numpy()

    scale, _ = Normalize().coefficients()
    levels = np.abs(run(partial) - run(whole)) / scale  # back in levels of 255
    # the box moves into the region's coordinates in single precision: a weight may round apart
    assert levels.max() <= 1.01 and levels.mean() < 0.01


def test_corrupt_or_cut_jpeg_data_is_an_error_naming_what_libjpeg_found():
    data = encode(pixels(5, 120, 160))
    decoder = Decoder()
    with pytest.raises(ValueError, match="(?i)premature end|data ended"):
        decoder.decode_region(data[: len(data) // 2], 1, 0, 60, 160, 120)
    with pytest.raises(ValueError, match="JPEG"):  # the header parse says what it could not find
        decoder.decode_region(b"\xff\xd8\xff" + b"\x00" * 200, 1, 0, 0, 10, 10)
    with pytest.raises(ValueError, match="the region is empty or outside the scaled image"):
        decoder.decode_region(data, 2, 0, 0, 81, 10)  # 160 / 2 = 80 columns
    with pytest.raises(ValueError, match="scale must be 1, 2, 4 or 8"):
        jpeg_module.decode_region(data, bytearray(100), 3, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="the output buffer is too small"):
        jpeg_module.decode_region(data, bytearray(100), 1, 0, 0, 160, 120)


def test_no_partial_decoding_for_fast_mode_or_other_formats():
    assert Decoder(fast=True).decode_region(encode(pixels(1)), 1, 0, 0, 8, 8) is None
    assert Decoder().decode_region(encode(pixels(1), "PNG"), 1, 0, 0, 8, 8) is None
