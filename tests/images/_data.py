"""Small generated images for the image tests: photo-like JPEGs (gradients, shapes, noise) and other formats."""

from __future__ import annotations

import io

import numpy as np


def pixels(i: int, h: int = 64, w: int = 80) -> np.ndarray:
    """``uint8[h, w, 3]``: smooth gradients, a bright box and noise (compresses like a photo)."""
    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy, xx = yy / h, xx / w
    a, b, c = rng.uniform(-100, 100, 3)
    img = np.stack([128 + a * xx, 128 + b * yy, 128 + c * xx * yy], axis=-1) + rng.normal(0, 8, (h, w, 3))
    y0, x0 = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
    img[y0:y0 + h // 4, x0:x0 + w // 4] = rng.uniform(0, 255, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(array: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **options) -> bytes:
    from PIL import Image

    img = Image.fromarray(array)
    if mode is not None:
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}), **options)
    return out.getvalue()


def jpeg(i: int, h: int = 64, w: int = 80) -> bytes:
    return encode(pixels(i, h, w))


def jpeg_bomb(height: int = 20000, width: int = 30000, progressive: bool = False) -> bytes:
    """A JPEG of a few hundred bytes whose header claims ``height x width`` pixels (an 8 x 8 image's data,
    its frame header rewritten): what a decompression bomb looks like to a decoder that trusts the header."""
    data = bytearray(encode(pixels(0, 8, 8), progressive=progressive))
    marker = data.find(b"\xff\xc2" if progressive else b"\xff\xc0")  # start of frame: length, precision, height, width
    assert marker > 0
    data[marker + 5:marker + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def png_bomb(height: int = 20000, width: int = 30000) -> bytes:
    """A PNG of a few dozen bytes whose header (IHDR) claims ``height x width`` RGB pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
