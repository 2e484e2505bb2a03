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

An image is bounded before anything of its size is allocated: every decode
path reads the header first and refuses (:class:`ImageTooLargeError`) an image
that claims more than ``max_pixels`` pixels (default :data:`MAX_PIXELS`,
Pillow's limit): a JPEG of a few hundred bytes can claim 30000 x 20000 pixels,
and a whole decode would grow a 1.8 GB buffer for it. A thread's buffer grows
to the largest image it decodes and is given back after an outlier
(:class:`_Scratch`), so one huge image does not pin its memory for the rest of
the run.
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

#: The default pixel limit of every decode (``max_pixels``): Pillow's (``PIL.Image.MAX_IMAGE_PIXELS``,
#: 1024 * 1024 * 1024 // 4 // 3, a 256 MiB RGB image; Pillow refuses twice that and warns above it).
MAX_PIXELS = 89_478_485

#: A thread's buffer is never smaller than this (decodes of small images then never reallocate) ...
BUFFER_FLOOR = 1 << 18
#: ... and is given back when it is more than SHRINK times the largest need of its last WINDOW decodes.
SHRINK = 4
WINDOW = 32


class MissingCodecError(ChuteError):
    """An image codec (the ``chute[images]`` extra) is not installed."""


class ImageTooLargeError(ChuteError):
    """An image's header claims more pixels than ``max_pixels``: refused before anything of its size is allocated."""


def check_max_pixels(max_pixels: int | None) -> int | None:
    """``max_pixels`` as given, checked: a positive int, or None for no limit."""
    if max_pixels is None:
        return None
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels must be a positive int (or None for no limit), got {max_pixels!r}")
    return max_pixels


def check_pixels(height: int, width: int, max_pixels: int | None) -> None:
    """Refuse (:class:`ImageTooLargeError`) an image of ``height x width`` pixels over ``max_pixels``."""
    if max_pixels is not None and height * width > max_pixels:
        raise ImageTooLargeError(
            f"the image's header claims {width} x {height} = {height * width:,} pixels, more than max_pixels="
            f"{max_pixels:,} (a decompression bomb, or larger images than expected): pass a larger max_pixels "
            "(or None) to chute.images.Decode or DecodeCrop if such images belong in the dataset"
        )


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


def image_size(data: Any, max_pixels: int | None = None) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header (nothing is decoded); with ``max_pixels``,
    :class:`ImageTooLargeError` for an image that claims more pixels."""
    if is_jpeg(data):
        h, w, colour, _ = simplejpeg().decode_jpeg_header(data)
        size = int(h), int(w)
    else:
        with _open_pillow(data, max_pixels) as img:
            size = img.height, img.width
    check_pixels(*size, max_pixels)
    return size


def _open_pillow(data: Any, max_pixels: int | None) -> Any:
    """Pillow's image of ``data``, its header read (nothing decoded yet). Pillow refuses on its own an image
    over twice ``PIL.Image.MAX_IMAGE_PIXELS`` as it opens it: that is reported as chute's error too."""
    image = pillow()
    try:
        return image.open(io.BytesIO(data))
    except (image.DecompressionBombError, image.DecompressionBombWarning) as exc:  # the warning: under -W error
        pillows = (image.MAX_IMAGE_PIXELS or 0) * (2 if isinstance(exc, image.DecompressionBombError) else 1)
        if max_pixels is not None and max_pixels <= pillows:
            raise ImageTooLargeError(
                f"the image's header claims more than max_pixels={max_pixels:,} pixels (Pillow: {exc}): pass a "
                "larger max_pixels (or None) to chute.images.Decode or DecodeCrop if such images belong in the dataset"
            ) from None
        raise ImageTooLargeError(
            f"Pillow refuses the image ({exc}), which chute's max_pixels={max_pixels} allows: raise "
            "PIL.Image.MAX_IMAGE_PIXELS as well (or set it to None) to decode such images"
        ) from None


def decode_pillow(data: Any, max_pixels: int | None = MAX_PIXELS) -> np.ndarray:
    """Pillow's RGB decode of ``data`` (a new ``uint8[h, w, 3]`` array): the reference pixels.

    :class:`ImageTooLargeError` for an image whose header claims more than ``max_pixels`` pixels
    (None: no limit of chute's), before Pillow decodes anything.
    """
    with _open_pillow(data, max_pixels) as img:
        check_pixels(img.height, img.width, max_pixels)
        return np.asarray(img.convert("RGB"))


class _Scratch:
    """One thread's decode buffer: grown to the largest image it decodes, given back after an outlier.

    Every :data:`WINDOW` decodes, a buffer more than :data:`SHRINK` times the largest need of those
    decodes is replaced by one of that need: one huge image does not pin its memory in every thread for
    the rest of the run, and the usual spread of sizes never reallocates.
    """

    __slots__ = ("buffer", "largest", "calls")

    def __init__(self) -> None:
        self.buffer: np.ndarray | None = None
        self.largest = 0  # the largest need of this window's decodes
        self.calls = 0

    def take(self, nbytes: int, decodes: int = 1) -> np.ndarray:
        """A buffer of at least ``nbytes``, for ``decodes`` decodes (a batch's, all at most ``nbytes``)."""
        need = max(int(nbytes), BUFFER_FLOOR)
        self.largest = max(self.largest, need)
        self.calls += decodes
        if self.calls >= WINDOW:
            if self.buffer is not None and self.buffer.nbytes > SHRINK * self.largest:
                self.buffer = np.empty(self.largest, dtype=np.uint8)  # the outlier's buffer goes back
            self.largest = self.calls = 0
        if self.buffer is None or self.buffer.nbytes < need:
            self.buffer = np.empty(need, dtype=np.uint8)
        return self.buffer


class Decoder:
    """Decodes into buffers that belong to the calling thread (one per thread, grown as needed, given back
    after an outlier), refusing images over ``max_pixels`` from their header (:class:`ImageTooLargeError`)."""

    def __init__(self, fast: bool = False, max_pixels: int | None = MAX_PIXELS) -> None:
        self.fast = fast
        self.max_pixels = check_max_pixels(max_pixels)
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"fast": self.fast, "max_pixels": self.max_pixels}  # buffers stay with their threads

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)

    @property
    def partial(self) -> bool:
        """Whether :meth:`decode_region` can decode part of a JPEG (``chute._jpeg`` built, not ``fast``)."""
        return not self.fast and partial_decoder() is not None

    def _scratch(self) -> _Scratch:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _Scratch()
        return scratch

    def _buffer(self, nbytes: int) -> np.ndarray:
        return self._scratch().take(nbytes)

    def batch_buffer(self, nbytes: int, decodes: int) -> np.ndarray:
        """The calling thread's buffer for ``decodes`` decodes of at most ``nbytes`` each, one after another
        in one native call (``chute._jpeg.decode_batch``): counted as that many decodes for giving back
        an outlier's buffer (:class:`_Scratch`)."""
        return self._scratch().take(nbytes, decodes)

    @property
    def buffer_nbytes(self) -> int:
        """The bytes of the calling thread's buffer (0 before its first decode)."""
        buffer = self._scratch().buffer
        return 0 if buffer is None else buffer.nbytes

    def header(self, data: Any) -> tuple[int, int, str | None]:
        """``(height, width, colour)`` of an encoded image from its header: ``colour`` a JPEG's colour space
        (simplejpeg's name), None for another format. :class:`ImageTooLargeError` over ``max_pixels``.

        :meth:`decode` and :meth:`decode_region` take it back (``header=``) instead of reading the header again.
        """
        if is_jpeg(data):
            h, w, colour, _ = simplejpeg().decode_jpeg_header(data)
            check_pixels(h, w, self.max_pixels)
            return int(h), int(w), colour
        with _open_pillow(data, self.max_pixels) as img:
            h, w = img.height, img.width
        check_pixels(h, w, self.max_pixels)
        return h, w, None

    def decode(self, data: Any, min_size: tuple[int, int] = (0, 0), scale: int = 1,
               header: tuple[int, int, str | None] | None = None) -> np.ndarray:
        """``uint8[h, w, 3]`` RGB pixels of ``data``, valid until this thread's next call.

        ``scale`` (2, 4 or 8): a JPEG comes out at ``ceil(size / scale)``,
        scaled in the inverse DCT (accurate mode; other formats ignore it).
        With ``fast``, a JPEG may come out scaled down by 1/2, 1/4 or 1/8, never
        below ``min_size`` ``(height, width)``. The caller scales its box by
        the shape it gets. ``header``: what :meth:`header` gave for ``data``.
        """
        if header is None:
            header = self.header(data) if is_jpeg(data) else (0, 0, None)
        h, w, colour = header
        if colour is not None and colour not in _PILLOW_JPEG:
            codec = simplejpeg()
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
        return decode_pillow(data, self.max_pixels)

    def decode_region(self, data: Any, scale: int, x0: int, y0: int, x1: int, y1: int,
                      header: tuple[int, int, str | None] | None = None) -> tuple[np.ndarray, int, int] | None:
        """Rows ``[y0, y1)`` and at least columns ``[x0, x1)`` of the JPEG ``data`` decoded at 1/``scale``
        (1, 2, 4 or 8; coordinates in the scaled image), as ``(pixels, left, top)``: ``uint8[h, w, 3]``, valid
        until this thread's next call, whose pixel ``(0, 0)`` is ``(left, top)`` of the scaled image.

        The columns are widened to whole iMCUs on the left; where a side is cut (not the image's edge), its
        outermost column is not a full decode's (smooth chroma upsampling lacks the neighbour): ask for one
        column more than is needed on such a side. None where partial decoding does not apply: not a JPEG,
        ``fast`` mode, no ``chute._jpeg``, or a colour space only Pillow turns into RGB. ``header``: what
        :meth:`header` gave for ``data``.
        """
        module = partial_decoder()
        if module is None or self.fast:
            return None
        if header is None:
            if not is_jpeg(data):
                return None
            header = self.header(data)  # before the buffer grows (chute._jpeg checks again, before libjpeg allocates)
        h, w, colour = header
        if colour is None or colour in _PILLOW_JPEG:
            return None
        buffer = self._buffer(-(-h // scale) * -(-w // scale) * 3)
        limit = 0 if self.max_pixels is None else min(self.max_pixels, 2**64 - 1)  # 0: none (a C unsigned long long)
        left, top, width, rows = module.decode_region(data, buffer, scale, x0, y0, x1, y1, limit)
        return buffer[:rows * width * 3].reshape(rows, width, 3), left, top
