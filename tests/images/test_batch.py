"""A batch's JPEGs in one native call (chute._jpeg.headers, then decode_batch): the same bytes, the same
failures and the same skipped samples as decoding them one by one (the path other images still take)."""

from __future__ import annotations

import functools
import re
import threading

import numpy as np
import pytest
import torch

import chute.images.transform as transform_module
from chute.images import CenterCrop, Decode, HorizontalFlip, Normalize, RandomCrop, RandomResizedCrop, Resize
from chute.images.codec import BUFFER_FLOOR, SHRINK, WINDOW, Decoder
from chute.pipeline.transform import BatchContext, TransformError
from tests.images._data import encode, jpeg, jpeg_bomb, pixels, png_bomb

pytest.importorskip("simplejpeg")
native = pytest.importorskip("chute._jpeg", reason="built only where libjpeg-turbo's headers were present at install")

OPTIONS = [
    {"subsampling": 0},  # 4:4:4
    {"subsampling": 1},  # 4:2:2
    {"subsampling": 2},  # 4:2:0
    {"subsampling": 2, "progressive": True},
    {"mode": "L"},  # grey: comes out RGB
    {"subsampling": 1, "progressive": True},
]

OPS = [
    (RandomCrop(48),),
    (RandomCrop(48), HorizontalFlip()),
    (CenterCrop(40), HorizontalFlip(), Normalize()),
    (RandomCrop(32), HorizontalFlip(), Normalize(dtype=torch.float16)),
    (RandomResizedCrop(56), HorizontalFlip()),
    (RandomResizedCrop(24, scale=(0.3, 1.0)), HorizontalFlip(), Normalize()),  # DCT scales 2, 4 and 8 on the large images
    (RandomResizedCrop(17), HorizontalFlip(), Normalize(dtype=torch.float16)),
    (Resize(30), CenterCrop(24), HorizontalFlip()),
    (Resize((19, 41)), Normalize()),
]


def images(count: int, seed: int = 0) -> list[bytes]:
    """JPEGs of many sizes (a few pixels to 700 a side) and every subsampling, grey and progressive."""
    return list(_images(count, seed))


@functools.cache
def _images(count: int, seed: int) -> tuple[bytes, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        h, w = (int(rng.integers(2, 40)), int(rng.integers(2, 40))) if i % 7 == 3 else (int(rng.integers(40, 700)), int(rng.integers(40, 700)))
        options = dict(OPTIONS[i % len(OPTIONS)])
        out.append(encode(pixels(i, h, w), mode=options.pop("mode", None), **options))
    return tuple(out)


def decode(transform: Decode, column: list, batched: bool, monkeypatch, on_error: str = "raise", seed: int = 5):
    """``(block, skipped)`` of one batch through the batch path or image by image (``batched=False``)."""
    with monkeypatch.context() as patch:
        if not batched:
            patch.setattr(transform_module, "batch_decoder", lambda decoder: None)
        ctx = BatchContext(np.arange(len(column)), 0, seed, None, on_error=on_error)
        got = transform.transform_batch({"jpg": column, "label": torch.arange(len(column))}, ctx)
    if got is None:
        return None, sorted(ctx.skipped)
    return got, sorted(ctx.skipped)


def same(a: dict | None, b: dict | None) -> bool:
    if a is None or b is None:
        return a is b
    block_a, block_b = a["jpg"].numpy(), b["jpg"].numpy()
    return (block_a.dtype == block_b.dtype and block_a.shape == block_b.shape
            and np.array_equal(block_a.view(np.uint8), block_b.view(np.uint8)) and torch.equal(a["label"], b["label"]))


@pytest.mark.parametrize("ops", OPS, ids=lambda ops: "+".join(type(op).__name__ for op in ops))
@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "full"])
def test_the_batch_call_writes_the_bytes_the_per_image_path_writes(ops, scaled, monkeypatch):
    column = images(36)
    transform = Decode("jpg", *ops, scaled=scaled)
    for seed in (1, 2):
        batched, _ = decode(transform, column, True, monkeypatch, seed=seed)
        each, _ = decode(transform, column, False, monkeypatch, seed=seed)
        assert same(batched, each), (ops, scaled, seed)


def test_the_scaled_decodes_of_the_comparison_cover_every_dct_scale():
    from chute.images.plan import dct_scale

    column = images(36)
    transform = Decode("jpg", RandomResizedCrop(24, scale=(0.3, 1.0)))
    sizes = np.array([Decoder().header(data)[:2] for data in column])
    plan = transform.plan(sizes, BatchContext(np.arange(len(column)), 0, 1, None))
    assert set(dct_scale(sizes, plan.box, plan.out).tolist()) == {1, 2, 4, 8}


def test_a_batch_of_jpegs_takes_two_native_calls_and_no_per_image_decode(monkeypatch):
    calls = []
    for name in ("headers", "decode_batch"):
        real = getattr(native, name)
        monkeypatch.setattr(native, name, lambda *a, real=real, name=name: (calls.append(name), real(*a))[1])

    def refused(*args, **kwargs):
        raise AssertionError("a per-image decode")

    for name in ("header", "decode", "decode_region"):
        monkeypatch.setattr(Decoder, name, refused)
    transform = Decode("jpg", RandomCrop(48), HorizontalFlip())
    ctx = BatchContext(np.arange(16), 0, 3, None)
    out = transform.transform_batch({"jpg": images(16)}, ctx)
    assert out is not None and out["jpg"].shape == (16, 3, 48, 48)
    assert calls == ["headers", "decode_batch"]


def broken(seed: int) -> tuple[list[bytes], dict[int, str]]:
    """A batch of good JPEGs with corrupt, cut, huge-header and non-JPEG images mixed in; what each broken one is."""
    rng = np.random.default_rng(seed)
    column = images(24, seed)
    kinds: dict[int, str] = {}
    for j in rng.choice(len(column), 12, replace=False).tolist():
        data = bytearray(column[j])
        kind = ["cut", "flipped", "cut-header", "bomb", "bomb-progressive", "png-bomb", "not-an-image", "empty", "png", "zeroed"][
            int(rng.integers(0, 10))]
        if kind == "cut":
            data = data[: int(rng.integers(len(data) // 4, len(data) - 2))]
        elif kind == "flipped":
            for at in rng.integers(2, len(data), 6).tolist():
                data[at] ^= int(rng.integers(1, 256))
        elif kind == "cut-header":
            data = data[: int(rng.integers(3, 200))]
        elif kind == "bomb":
            data = bytearray(jpeg_bomb())
        elif kind == "bomb-progressive":
            data = bytearray(jpeg_bomb(progressive=True))
        elif kind == "png-bomb":
            data = bytearray(png_bomb())
        elif kind == "not-an-image":
            data = bytearray(b"\xff\xd8\xff not a jpeg after all")
        elif kind == "empty":
            data = bytearray()
        elif kind == "png":
            data = bytearray(encode(pixels(j, 50, 70), "PNG"))
        else:  # the entropy-coded data zeroed from some point on
            at = int(rng.integers(len(data) // 2, len(data) - 2))
            data[at:-2] = bytes(len(data) - 2 - at)
        column[j] = bytes(data)
        kinds[j] = kind
    return column, kinds


@pytest.mark.parametrize("seed", range(12))
def test_broken_images_in_a_batch_fail_or_are_skipped_as_image_by_image(seed, monkeypatch):
    column, kinds = broken(seed)
    transform = Decode("jpg", RandomResizedCrop(40, scale=(0.2, 1.0)), HorizontalFlip(), Normalize())
    batched, skipped = decode(transform, column, True, monkeypatch, on_error="skip")
    each, skipped_each = decode(transform, column, False, monkeypatch, on_error="skip")
    assert skipped == skipped_each, kinds
    assert same(batched, each)
    if skipped:  # the error of the first: the same message, cause and all
        with pytest.raises(TransformError) as caught:
            decode(transform, column, True, monkeypatch)
        with pytest.raises(TransformError) as caught_each:
            decode(transform, column, False, monkeypatch)
        address = re.compile(r"0x[0-9a-f]+")  # Pillow's messages name its file object
        assert address.sub("0x", str(caught.value)) == address.sub("0x", str(caught_each.value))
        assert type(caught.value.__cause__) is type(caught_each.value.__cause__)


def test_a_bomb_among_jpegs_is_refused_by_its_header_with_the_limits_message(monkeypatch):
    column = images(8)
    column[5] = jpeg_bomb()
    transform = Decode("jpg", RandomCrop(32))
    with pytest.raises(TransformError, match=r"the image in column 'jpg' is too large for sample 5.*more than max_pixels"):
        decode(transform, column, True, monkeypatch)
    batched, skipped = decode(transform, column, True, monkeypatch, on_error="skip")
    assert skipped == [5] and batched is not None and batched["jpg"].shape[0] == 7


def test_the_batch_scratch_is_given_back_after_an_outlier():
    transform = Decode("jpg", RandomCrop(32))
    small = [jpeg(i, 64, 80) for i in range(8)]
    outlier = small[:7] + [jpeg(9, 1200, 1600)]

    def run(column):
        assert transform.transform_batch({"jpg": column}, BatchContext(np.arange(8), 0, 0, None)) is not None

    run(small)
    assert transform.decoder.buffer_nbytes == BUFFER_FLOOR
    run(outlier)
    grown = transform.decoder.buffer_nbytes
    assert grown == 1200 * 1600 * 3 > SHRINK * BUFFER_FLOOR
    for _ in range(2 * WINDOW // 8):  # the outlier's window ends, then a whole window of small images: given back
        run(small)
    assert transform.decoder.buffer_nbytes == BUFFER_FLOOR
    seen = {}
    thread = threading.Thread(target=lambda: (run(outlier), seen.setdefault("n", transform.decoder.buffer_nbytes)))
    thread.start()
    thread.join(60)
    assert seen["n"] == grown and transform.decoder.buffer_nbytes == BUFFER_FLOOR  # per thread


def test_an_arrow_column_and_a_column_of_buffers_take_the_batch_path(monkeypatch):
    pa = pytest.importorskip("pyarrow")
    column = images(12)
    transform = Decode("jpg", RandomResizedCrop(32), HorizontalFlip())
    each, _ = decode(transform, column, False, monkeypatch)
    for other in (pa.array(column, pa.binary()), pa.array(column, pa.large_binary()), [bytearray(x) for x in column],
                  [np.frombuffer(x, np.uint8) for x in column]):
        ctx = BatchContext(np.arange(12), 0, 5, None)
        got = transform.transform_batch({"jpg": other, "label": torch.arange(12)}, ctx)
        assert same(got, each)


def test_decode_batch_refuses_jobs_and_buffers_that_do_not_fit():
    data = jpeg(1, 64, 80)
    jobs = np.array([[1, 1, 0, 0, 80, 64, 0, 0]], dtype=np.int64)
    boxes = np.array([[0.0, 0.0, 80.0, 64.0]])
    scratch = np.empty(64 * 80 * 3, np.uint8)
    out = np.empty((1, 3, 32, 32), np.uint8)
    assert native.decode_batch([data], jobs, boxes, scratch, out, 32, 32) == []
    with pytest.raises(ValueError, match="out holds 3072 bytes, 6144 expected"):
        native.decode_batch([data], jobs, boxes, scratch, out, 32, 64)
    with pytest.raises(ValueError, match="jobs holds"):
        native.decode_batch([data, data], jobs, boxes, scratch, np.empty((2, 3, 32, 32), np.uint8), 32, 32)
    many = 11_000  # slots of 3 x 2**24 x 2**24 bytes: more than an address space holds
    with pytest.raises(ValueError, match="do not fit in memory"):
        native.decode_batch([data] * many, np.zeros((many, 8), np.int64), np.zeros((many, 4)), scratch, out, 1 << 24, 1 << 24)
    for bad in ([1, 3, 0, 0, 80, 64, 0, 0], [1, 1, 5, 0, 5, 64, 0, 0], [1, 1, -1, 0, 80, 64, 0, 0]):
        with pytest.raises(ValueError, match="scale of 1, 2, 4 or 8 and a non-empty region"):
            native.decode_batch([data], np.array([bad], dtype=np.int64), boxes, scratch, out, 32, 32)
    # per image, not raised: a region outside the image, a scratch too small, a box outside the pixels, an image over the limit
    cases = [
        ([1, 1, 0, 0, 81, 64, 0, 0], boxes, scratch, 0, "outside the scaled image"),
        (jobs, boxes, np.empty(100, np.uint8), 0, "too small"),
        (jobs, np.array([[0.0, 0.0, 81.0, 64.0]]), scratch, 0, "box is empty or outside"),
        ([1, 1, 0, 0, 80, 64, 0, 1], np.array([[70.0, 0.0, 102.0, 32.0]]), scratch, 0, "crop is outside"),
        (jobs, boxes, scratch, 64 * 80 - 1, "more than max_pixels"),
    ]
    for job, box, buffer, limit, message in cases:
        failures = native.decode_batch([data], np.array(job, dtype=np.int64).reshape(1, 8), box, buffer, out, 32, 32, None, limit)
        assert len(failures) == 1 and failures[0][0] == 0 and message in failures[0][1], failures


def test_headers_tell_apart_what_the_batch_call_decodes():
    good, grey = jpeg(1, 30, 50), encode(pixels(2, 20, 10), mode="L")
    cmyk = encode(pixels(3, 16, 16), mode="CMYK")
    column = [good, grey, cmyk, encode(pixels(4, 9, 9), "PNG"), good[:40], b"", None, jpeg_bomb()]
    found = np.full((len(column), 3), -1, dtype=np.int64)
    native.headers(column, found)
    assert found.tolist() == [[30, 50, 1], [20, 10, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [20000, 30000, 1]]
