"""Run as a script (tests/images/test_bounds.py): each decode path of a bomb, and how much it grew the peak
of this process's address space (VmPeak), as JSON. A fresh process, so that the peak is this run's; every
path decodes a normal image first, so what it loads and allocates once is not counted. Any allocation of the
image's claimed size (1.8 GB for 30000 x 20000 RGB), touched or not, raises the peak by that much."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np


def peak_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1])
    raise RuntimeError("no VmPeak in /proc/self/status")


def main() -> None:
    import PIL.Image

    from chute.images import DecodeCrop
    from chute.images.codec import Decoder, decode_pillow
    from chute.pipeline.transform import BatchContext
    from tests.images._data import encode, jpeg, jpeg_bomb, pixels, png_bomb

    warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning for the PNG under its own limit
    good, png = jpeg(1, 64, 80), encode(pixels(2), "PNG")
    bombs = {"jpeg": jpeg_bomb(), "progressive": jpeg_bomb(progressive=True), "png": png_bomb(),
             "small": jpeg_bomb(8000, 8000)}  # 64 million pixels: under the limit, 183 MiB whole
    region = np.empty(64 * 64 * 3, np.uint8)

    def transform(images: list[bytes]) -> object:
        """A batch through DecodeCrop with on_error="skip": [images delivered, positions skipped]."""
        ctx = BatchContext(np.arange(len(images)), 0, 0, None, on_error="skip")
        out = DecodeCrop("jpg", 32).transform_batch({"jpg": images}, ctx)
        return [0 if out is None else len(out["jpg"]), ctx.skipped]

    paths = {
        # simplejpeg's whole decode, chute._jpeg's partial decode (through the Decoder, then directly),
        # Pillow (with Pillow's own limit off: chute's is the only guard), the batch transform
        "whole": lambda d, b: Decoder().decode(b),
        "partial": lambda d, b: Decoder().decode_region(b, 1, 0, 0, 64, 48),
        "partial_c": lambda d, b: _jpeg.decode_region(b, region, 1, 0, 0, 64, 64, 89_478_485),
        # no limit, but a buffer too small for the region: refused before libjpeg allocates the progressive
        # JPEG's coefficients (those of the whole image)
        "partial_c_small_out": lambda d, b: _jpeg.decode_region(b, region[:64], 1, 0, 0, 64, 64),
        "pillow": lambda d, b: decode_pillow(b),
        "transform": lambda d, b: transform([d, b, d]),
        # the control: the whole decode of an image under the limit shows its buffer in the peak
        "control": lambda d, b: Decoder().decode(b),
    }
    cases = [("whole", "jpeg"), ("whole", "progressive"), ("partial", "jpeg"), ("partial", "progressive"),
             ("partial_c", "progressive"), ("partial_c_small_out", "progressive"), ("pillow", "png"), ("transform", "jpeg"), ("transform", "png"),
             ("control", "small")]
    try:
        from chute import _jpeg
    except ImportError:  # not built (no libjpeg-turbo headers at install): no partial decoding to probe
        cases = [case for case in cases if not case[0].startswith("partial")]
    PIL.Image.MAX_IMAGE_PIXELS = None
    results = {}
    for path, kind in cases:
        fn = paths[path]
        try:  # warm up: imports, buffers, arenas (the small buffer refuses even a normal image's region)
            fn(good if kind != "png" else png, good if kind != "png" else png)
        except ValueError:
            assert path == "partial_c_small_out"
        before = peak_kib()
        try:
            outcome = ["returned", fn(good if kind != "png" else png, bombs[kind])]
        except Exception as exc:  # noqa: BLE001 (the outcome is what the test checks)
            outcome = [type(exc).__name__, str(exc)]
        results[f"{path}/{kind}"] = {"grew_mib": (peak_kib() - before) / 1024, "outcome": outcome}
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    main()
