"""Decoding: simplejpeg's pixels are Pillow's (accurate mode), fast mode within a stated bound, other formats via Pillow."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from chute.images.codec import Decoder, decode_pillow, image_size
from tests.images._data import encode, jpeg, pixels

pytest.importorskip("simplejpeg")


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # 4:4:4, 4:2:2, 4:2:0
def test_accurate_jpeg_decode_is_pillows_to_one_level(subsampling):
    data = encode(pixels(3, 120, 160), subsampling=subsampling)
    ours = Decoder().decode(data).astype(np.int16)
    theirs = decode_pillow(data).astype(np.int16)
    assert ours.shape == theirs.shape == (120, 160, 3)
    assert np.abs(ours - theirs).max() <= 1  # the same libjpeg-turbo algorithm: identical here, 1 allowed across versions


def test_fast_mode_stays_within_its_documented_bound():
    for i in range(5, 10):
        data = jpeg(i, 128, 128)
        fast = Decoder(fast=True).decode(data).astype(np.int16)
        exact = decode_pillow(data).astype(np.int16)
        diff = np.abs(fast - exact)
        # docs/images.md: under 2 levels on average, 99% of values within 16; sharp colour edges go further
        assert diff.mean() < 2.0 and np.quantile(diff, 0.99) <= 16 and diff.max() <= 64


def test_fast_mode_scales_in_the_dct_but_never_below_the_size_asked():
    data = jpeg(6, 256, 320)
    out = Decoder(fast=True).decode(data, min_size=(100, 100))
    assert out.shape == (128, 160, 3)  # 1/2 is the smallest scale that keeps 100 x 100
    assert Decoder(fast=True).decode(data, min_size=(256, 320)).shape == (256, 320, 3)


def test_grey_cmyk_png_and_webp_come_out_as_pillows_rgb():
    grey = encode(pixels(1), mode="L")
    cmyk = encode(pixels(2), mode="CMYK")
    png = encode(pixels(3), fmt="PNG")
    rgba_png = encode(np.dstack([pixels(4), np.full((64, 80), 7, np.uint8)]), fmt="PNG")
    webp = encode(pixels(5), fmt="WEBP", lossless=True)
    decoder = Decoder()
    for data in (grey, cmyk, png, rgba_png, webp):
        out = decoder.decode(data)
        assert out.shape == (64, 80, 3) and out.dtype == np.uint8
        assert np.abs(out.astype(np.int16) - decode_pillow(data)).max() <= 1
        assert image_size(data) == (64, 80)
    assert np.array_equal(decoder.decode(png), pixels(3))  # lossless: the very pixels


def test_each_thread_decodes_into_its_own_reused_buffer():
    decoder = Decoder()
    a, b = jpeg(1), jpeg(2, 32, 40)
    first = decoder.decode(a)
    second = decoder.decode(b)
    assert np.shares_memory(first, second)  # the same buffer, reused
    other = {}
    thread = threading.Thread(target=lambda: other.setdefault("x", decoder.decode(a)))
    thread.start()
    thread.join(30)
    assert not np.shares_memory(other["x"], second)
    assert np.array_equal(other["x"], decode_pillow(a))
    copy = pickle.loads(pickle.dumps(decoder))  # for worker processes: no buffer travels
    assert np.array_equal(copy.decode(a), decode_pillow(a))


def test_a_missing_simplejpeg_is_named_with_the_extra_to_install():
    code = (
        "import sys; sys.modules['simplejpeg'] = None\n"
        "from chute.images.codec import Decoder\n"
        "from tests.images._data import jpeg\n"
        "try:\n    Decoder().decode(jpeg(1))\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("MissingCodecError") and "pip install 'chute[images]'" in out


def test_without_the_partial_decoder_crops_decode_whole_images(monkeypatch):
    # where chute._jpeg was not built (no libjpeg-turbo headers at install): the same crops, whole decodes
    from chute.images import DecodeCrop, codec
    from chute.pipeline.transform import BatchContext

    images = [encode(pixels(i, 300, 400)) for i in range(6)]
    ctx = lambda: BatchContext(np.arange(6), 0, 3, None)  # noqa: E731
    # 160 px from at most 400 x 300: no box is twice the output, so no DCT scale either
    whole = DecodeCrop("jpg", 160, scale=(0.1, 0.9), scaled=False).transform_batch({"jpg": images}, ctx())["jpg"]
    monkeypatch.setattr(codec, "partial_decoder", lambda: None)
    assert Decoder().decode_region(images[0], 1, 0, 0, 8, 8) is None
    got = DecodeCrop("jpg", 160, scale=(0.1, 0.9)).transform_batch({"jpg": images}, ctx())["jpg"]
    assert torch.equal(got, whole)
