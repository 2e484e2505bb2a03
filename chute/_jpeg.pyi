"""chute._jpeg: partial JPEG decoding, and a batch of JPEGs decoded into its block in one call, with the system's libjpeg-turbo.

Built at install time where libjpeg-turbo's headers are present (an optional
extension: without them the install goes on and chute.images decodes whole
images with simplejpeg; ``chute.images.codec.partial_decoder()`` says which).
"""

import sys
from collections.abc import Sequence
from typing import Any, TypeAlias

if sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:  # anything with the buffer protocol
    Buffer: TypeAlias = Any

def decode_region(
    data: Buffer, out: Buffer, scale: int, x0: int, y0: int, x1: int, y1: int, max_pixels: int = 0, /
) -> tuple[int, int, int, int]:
    """Decode the JPEG ``data`` at 1/``scale`` (1, 2, 4 or 8) as RGB, only rows ``[y0, y1)`` and at least
    columns ``[x0, x1)`` of the scaled image, into ``out`` as rows of ``width`` pixels; returns
    ``(left, top, width, height)``: where the block lies in the scaled image (columns widened to whole
    iMCUs on the left, so ``left <= x0`` and ``left + width == x1``; ``top == y0``). The rows above are
    only entropy-decoded, those below not read. ValueError with libjpeg's message for data it cannot
    decode (a warning about corrupt data included), for a region outside the image or larger than
    ``out``, or for an image whose header claims more than ``max_pixels`` pixels (0: no limit): these
    are checked before libjpeg allocates its buffers."""

def headers(images: Sequence[Buffer], out: Buffer, /) -> None:
    """The headers of a batch of encoded images in one call, the GIL released once: ``out`` (int64
    ``[len(images), 3]``) gets ``(height, width, 1)`` per JPEG that :func:`decode_batch` decodes (grey,
    YCbCr or RGB) and ``(0, 0, 0)`` for any other image (not a JPEG, CMYK or YCCK, a header libjpeg cannot
    read or warns about). Nothing of an image's size is allocated; the caller checks sizes against its limit."""

def decode_batch(
    images: Sequence[Buffer], jobs: Buffer, boxes: Buffer, scratch: Buffer, out: Buffer, out_height: int, out_width: int,
    lut: Buffer | None = None, max_pixels: int = 0, /,
) -> list[tuple[int, str]]:
    """Decode a batch of JPEGs and write each into its slot of ``out`` in one call, the GIL released once.

    Per image ``j`` (``jobs``: int64 ``[n, 8]``: do, scale, x0, y0, x1, y1, flip, whole): if ``do``, decode
    rows ``[y0, y1)`` and at least columns ``[x0, x1)`` of the image at 1/``scale`` into ``scratch`` (as
    :func:`decode_region`), then take ``boxes[j]`` (float64 ``[n, 4]``, in the scaled image), mirrored with
    ``flip``: copied as planes where ``whole``, else resampled (``chute._native.resample``'s arithmetic),
    into ``out[j]`` (uint8 ``[n, 3, out_height, out_width]``, or float32/float16 through ``lut``).
    ValueError for jobs or buffers that do not fit; ``[(j, message), ...]`` for the images that failed
    (libjpeg's message, a box outside the decoded pixels, an image over ``max_pixels``; 0: no limit)."""
