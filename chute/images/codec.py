"""Decoding images: JPEG through simplejpeg (libjpeg-turbo, GIL released), anything else through Pillow.

simplejpeg decodes into a buffer it is given, so each loader thread keeps one
(:class:`Decoder`) and reuses it for every image: no allocation, no page
faults per image. Its default is libjpeg-turbo's accurate integer DCT and
smooth chroma upsampling, the same as Pillow's, so the pixels are Pillow's
(tests/images/test_codec.py bounds the difference). ``fast=True`` switches to
the fast DCT and upsampling (a few levels off on edges) and lets the decoder
scale down by 1/2, 1/4 or 1/8 in the DCT when the output is that much smaller
than the source box (what Pillow's ``draft`` does). In accurate mode the
caller may ask for a decode at 1/2, 1/4 or 1/8 (``scale``): ``Decode`` does when
the crop keeps the output's resolution at that scale (docs/images.md gives the
pixel difference this makes).

A JPEG of which only a box is needed is decoded in part when chute's own
libjpeg-turbo binding was built (``chute._jpeg``: at install time, where the
system's libjpeg-turbo headers are present; otherwise the whole image is
decoded with simplejpeg): the rows above the box are only entropy-decoded, those
below it not read at all, and the inverse DCT and colour conversion run on the
iMCU columns the box touches (:meth:`Decoder.decode_region`). Its pixels are a
full decode's, except a cut edge's outermost column (smooth chroma upsampling
lacks its neighbour there), which the caller keeps out of the box.

Other formats (PNG, WebP, BMP, GIF, TIFF) and JPEGs simplejpeg does not
handle (CMYK, YCCK) go through Pillow, which holds the GIL for part of the
work. Everything comes out as RGB: grey and palette images are expanded,
alpha is dropped. EXIF orientation is not applied (as torchvision's folder
loaders do not).
"""

from __future__ import annotations

import functools
import importlib
import io
import threading
from types import ModuleType
from typing import Any

import numpy as np

from chute.errors import ChuteError

JPEG_MAGIC = b"\xff\xd8\xff"
_PILLOW_JPEG = ("CMYK", "YCCK")  # colour spaces simplejpeg cannot turn into RGB the way Pillow does


class MissingCodecError(ChuteError):
    """An image codec (the ``chute[images]`` extra) is not installed."""


def simplejpeg() -> Any:
    try:
        import simplejpeg as module
    except ImportError:
        raise MissingCodecError(
            "chute.images decodes JPEG with simplejpeg, which is not installed: pip install 'chute[images]'"
        ) from None
    return module


def pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingCodecError("chute.images decodes non-JPEG images with Pillow, which is not installed: pip install 'chute[images]'") from None
    return Image


@functools.cache
def partial_decoder() -> ModuleType | None:
    """``chute._jpeg`` (partial JPEG decoding), or None where it was not built (no libjpeg-turbo headers at install)."""
    try:
        return importlib.import_module("chute._jpeg")
    except ImportError:
        return None


def is_jpeg(data: Any) -> bool:
    return bytes(memoryview(data)[:3]) == JPEG_MAGIC


def image_size(data: Any) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header (about 1 us for a JPEG)."""
    if is_jpeg(data):
        h, w, colour, _ = simplejpeg().decode_jpeg_header(data)
        return int(h), int(w)
    with pillow().open(io.BytesIO(data)) as img:
        return img.height, img.width


def decode_pillow(data: Any) -> np.ndarray:
    """Pillow's RGB decode of ``data`` (a new ``uint8[h, w, 3]`` array): the reference pixels."""
    with pillow().open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


class Decoder:
    """Decodes into buffers that belong to the calling thread (one per thread, grown as needed)."""

    def __init__(self, fast: bool = False) -> None:
        self.fast = fast
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"fast": self.fast}  # buffers stay with their threads

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

    def _buffer(self, nbytes: int) -> np.ndarray:
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.nbytes < nbytes:
            buffer = self._local.buffer = np.empty(max(nbytes, 1 << 18), dtype=np.uint8)
        return buffer

    def decode(self, data: Any, min_size: tuple[int, int] = (0, 0), scale: int = 1) -> np.ndarray:
        """``uint8[h, w, 3]`` RGB pixels of ``data``, valid until this thread's next call.

        ``scale`` (2, 4 or 8): a JPEG comes out at ``ceil(size / scale)``,
        scaled in the inverse DCT (accurate mode; other formats ignore it).
        With ``fast``, a JPEG may come out scaled down by 1/2, 1/4 or 1/8, never
        below ``min_size`` ``(height, width)``. The caller scales its box by
        the shape it gets.
        """
        if is_jpeg(data):
            codec = simplejpeg()
            h, w, colour, _ = codec.decode_jpeg_header(data)
            if colour not in _PILLOW_JPEG:
                buffer = self._buffer(h * w * 3)
                if self.fast and min(min_size) > 0:
                    return codec.decode_jpeg(
                        data, buffer=buffer, fastdct=True, fastupsample=True,
                        min_height=int(min_size[0]), min_width=int(min_size[1]),
                    )
                if self.fast:
                    return codec.decode_jpeg(data, buffer=buffer, fastdct=True, fastupsample=True)
                if scale > 1:  # exactly 1/scale: no smaller size (min_*), no bigger one (min_factor)
                    return codec.decode_jpeg(
                        data, buffer=buffer, min_height=-(-h // scale), min_width=-(-w // scale), min_factor=scale,
                    )
                return codec.decode_jpeg(data, buffer=buffer)
        return decode_pillow(data)

    def decode_region(self, data: Any, scale: int, x0: int, y0: int, x1: int, y1: int) -> tuple[np.ndarray, int, int] | None:
        """Rows ``[y0, y1)`` and at least columns ``[x0, x1)`` of the JPEG ``data`` decoded at 1/``scale``
        (1, 2, 4 or 8; coordinates in the scaled image), as ``(pixels, left, top)``: ``uint8[h, w, 3]``, valid
        until this thread's next call, whose pixel ``(0, 0)`` is ``(left, top)`` of the scaled image.

        The columns are widened to whole iMCUs on the left; where a side is cut (not the image's edge), its
        outermost column is not a full decode's (smooth chroma upsampling lacks the neighbour): ask for one
        column more than is needed on such a side. None where partial decoding does not apply: not a JPEG,
        ``fast`` mode, no ``chute._jpeg``, or a colour space only Pillow turns into RGB.
        """
        module = partial_decoder()
        if module is None or self.fast or not is_jpeg(data):
            return None
        h, w, colour, _ = simplejpeg().decode_jpeg_header(data)
        if colour in _PILLOW_JPEG:
            return None
        buffer = self._buffer(-(-h // scale) * -(-w // scale) * 3)
        left, top, width, rows = module.decode_region(data, buffer, scale, x0, y0, x1, y1)
        return buffer[:rows * width * 3].reshape(rows, width, 3), left, top
