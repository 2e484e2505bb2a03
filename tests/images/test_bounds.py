"""Images from outside are bounded: a header's pixel count is checked against ``max_pixels`` on every decode
path before anything of its size is allocated (a decompression bomb is refused, or skipped with
``on_error="skip"``), and a thread's decode buffer is given back after an outlier."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import chute
from chute.images import MAX_PIXELS, DecodeCrop, ImageTooLargeError
from chute.images.codec import BUFFER_FLOOR, SHRINK, WINDOW, Decoder, decode_pillow, image_size
from chute.pipeline.transform import TransformError
from tests.images._data import encode, jpeg, jpeg_bomb, pixels, png_bomb

pytest.importorskip("simplejpeg")
PIL = pytest.importorskip("PIL.Image")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOMB_MIB = 30000 * 20000 * 3 / 2**20  # what a whole decode of the bombs would allocate: 1,716 MiB


@pytest.fixture(scope="module")
def probe() -> dict:
    """tests/images/_probe.py in a fresh process: per decode path, the outcome and the growth of the peak
    address space (VmPeak) while it handled the bomb."""
    run = subprocess.run([sys.executable, "-m", "tests.images._probe"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_the_bombs_are_tiny_files_that_claim_600_million_pixels(monkeypatch):
    assert 500 < len(jpeg_bomb()) < 900  # the file: 675 bytes
    monkeypatch.setattr(PIL, "MAX_IMAGE_PIXELS", None)  # Pillow's own limit off, to read the PNG's header
    for data in (jpeg_bomb(), jpeg_bomb(progressive=True), png_bomb()):
        assert len(data) < 1000 and image_size(data) == (20000, 30000)
    with pytest.raises(ImageTooLargeError, match="600,000,000 pixels, more than max_pixels=89,478,485"):
        image_size(png_bomb(), MAX_PIXELS)


def test_the_probe_sees_an_allocation_of_an_images_size(probe):
    # the control: a whole decode of a JPEG of 8000 x 8000 (under the limit) grows a 183 MiB buffer, and the
    # peak shows it; so a bomb's 1.7 GB could not pass unseen
    assert probe["control/small"]["grew_mib"] > 64


@pytest.mark.parametrize("case", ["whole/jpeg", "whole/progressive", "pillow/png"])
def test_a_bomb_is_refused_from_its_header_before_any_large_allocation(probe, case):
    # whole: simplejpeg's decode (every install); pillow: PNG with Pillow's own limit turned off (chute's holds)
    grew, (kind, message) = probe[case]["grew_mib"], probe[case]["outcome"]
    assert kind == "ImageTooLargeError"
    assert "30000 x 20000 = 600,000,000 pixels, more than max_pixels=89,478,485" in message
    assert "pass a larger max_pixels" in message
    assert grew < 64, f"{case}: the peak address space grew by {grew:.0f} MiB (a whole decode: {BOMB_MIB:.0f})"


@pytest.mark.parametrize("case", ["partial/jpeg", "partial/progressive", "partial_c/progressive", "partial_c_small_out/progressive"])
def test_a_bomb_is_refused_before_any_large_allocation_by_the_partial_decoder(probe, case):
    pytest.importorskip("chute._jpeg")
    grew, (kind, message) = probe[case]["grew_mib"], probe[case]["outcome"]
    if case == "partial_c/progressive":  # chute._jpeg itself, called directly: before libjpeg allocates
        assert kind == "ValueError" and "claims 30000 x 20000 pixels, more than max_pixels = 89478485" in message
    elif case == "partial_c_small_out/progressive":  # no limit given, but the caller's buffer is checked first
        assert kind == "ValueError" and "the output buffer is too small for the region" in message
    else:
        assert kind == "ImageTooLargeError" and "more than max_pixels=89,478,485" in message
    assert grew < 64, f"{case}: the peak address space grew by {grew:.0f} MiB (a whole decode: {BOMB_MIB:.0f})"


@pytest.mark.parametrize("case", ["transform/jpeg", "transform/png"])
def test_a_bomb_in_a_batch_is_skipped_without_any_large_allocation(probe, case):
    grew, (kind, value) = probe[case]["grew_mib"], probe[case]["outcome"]
    assert (kind, value) == ("returned", [2, [1]])  # two images delivered, the bomb (position 1) skipped
    assert grew < 64


def test_pillows_refusal_of_a_bomb_is_reported_as_chutes_limit():
    # Pillow's own limit (twice PIL.Image.MAX_IMAGE_PIXELS) refuses the PNG as it opens it: the error is chute's
    with pytest.raises(ImageTooLargeError, match="more than max_pixels=89,478,485 pixels") as caught:
        decode_pillow(png_bomb())
    assert "pass a larger max_pixels" in str(caught.value)


def test_an_image_over_chutes_limit_but_under_pillows_refusal_is_refused(recwarn):
    # 100 million pixels: Pillow only warns (its refusal starts at twice its limit) and would decode 286 MiB;
    # chute's limit holds, for PNG and for JPEG
    for data in (png_bomb(10000, 10000), jpeg_bomb(10000, 10000)):
        with pytest.raises(ImageTooLargeError, match="10000 x 10000 = 100,000,000 pixels, more than max_pixels=89,478,485"):
            Decoder().decode(data)


def test_the_limit_is_settable_and_checked():
    assert MAX_PIXELS == 89_478_485 == PIL.MAX_IMAGE_PIXELS  # Pillow's convention, chute's own constant
    data = jpeg(1, 64, 80)
    assert Decoder(max_pixels=64 * 80).decode(data).shape == (64, 80, 3)
    with pytest.raises(ImageTooLargeError, match="80 x 64 = 5,120 pixels, more than max_pixels=5,119"):
        Decoder(max_pixels=64 * 80 - 1).decode(data)
    with pytest.raises(ImageTooLargeError, match="more than max_pixels=5,119"):
        decode_pillow(encode(pixels(1, 64, 80), "PNG"), max_pixels=5119)
    for bad in (0, -1, True, 1.5, "100"):
        with pytest.raises(ValueError, match="max_pixels must be a positive int"):
            DecodeCrop("jpg", 32, max_pixels=bad)
    crop = DecodeCrop("jpg", 32, max_pixels=None)
    assert crop.max_pixels is None and "max_pixels=None" in repr(crop)
    assert pickle.loads(pickle.dumps(crop)).decoder.max_pixels is None  # worker processes keep the setting
    assert "max_pixels" not in repr(DecodeCrop("jpg", 32))


def test_a_bomb_in_a_dataset_names_its_sample_or_is_skipped(tmp_path, recwarn):
    bombs = {5: jpeg_bomb(), 11: png_bomb(), 17: png_bomb(10000, 10000), 23: jpeg_bomb(progressive=True)}

    def sample(i):
        return {"jpg": bombs.get(i, jpeg(i)), "label": i}

    ds = chute.write((sample(i) for i in range(30)), tmp_path / "bombs")
    with pytest.raises(TransformError, match=r"the image in column 'jpg' is too large for sample 5 \(shard .*, row 5\)") as caught:
        list(chute.Loader(ds, 10, transform=DecodeCrop("jpg", 32)))
    message = str(caught.value)
    assert "30000 x 20000 = 600,000,000 pixels, more than max_pixels=89,478,485" in message
    assert "pass a larger max_pixels" in message and "on_error='skip'" in message
    loader = chute.Loader(ds, 10, transform=DecodeCrop("jpg", 32), on_error="skip")
    labels = [int(x) for batch in loader for x in batch["label"]]
    assert labels == [i for i in range(30) if i not in bombs]
    assert sorted(loader.skipped) == sorted(bombs)
    # a lower limit refuses ordinary images too: the setting is what counts
    loader = chute.Loader(ds, 10, transform=DecodeCrop("jpg", 32, max_pixels=64 * 80 - 1), on_error="skip")
    assert [batch for batch in loader] == [] and len(loader.skipped) == 30


def test_a_threads_buffer_is_given_back_after_an_outlier():
    decoder = Decoder()
    big, small = jpeg(1, 1200, 1600), jpeg(2, 64, 80)
    decoder.decode(small)
    assert decoder.buffer_nbytes == BUFFER_FLOOR  # small images never grow it
    decoder.decode(big)
    grown = decoder.buffer_nbytes
    assert grown == 1200 * 1600 * 3 > SHRINK * BUFFER_FLOOR
    for _ in range(WINDOW - 2):  # the window of the outlier: kept
        decoder.decode(small)
    assert decoder.buffer_nbytes == grown
    for _ in range(WINDOW):  # a whole window of small images: given back
        decoder.decode(small)
    assert decoder.buffer_nbytes == BUFFER_FLOOR
    other = {}
    thread = threading.Thread(target=lambda: other.setdefault("n", (decoder.decode(big), decoder.buffer_nbytes)[1]))
    thread.start()
    thread.join(30)
    assert other["n"] == grown and decoder.buffer_nbytes == BUFFER_FLOOR  # per thread


def test_a_buffer_within_the_usual_spread_of_sizes_is_kept_and_reused():
    decoder = Decoder()
    sizes = [(300, 400), (480, 640), (200, 300), (375, 500)] * (2 * WINDOW // 4 + 1)
    images = {size: jpeg(i, *size) for i, size in enumerate(set(sizes))}
    first = decoder.decode(images[(480, 640)])
    for size in sizes:
        assert np.shares_memory(decoder.decode(images[size]), first)  # never reallocated
