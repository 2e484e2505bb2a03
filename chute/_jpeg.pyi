"""chute._jpeg: partial JPEG decoding with the system's libjpeg-turbo.

Built at install time where libjpeg-turbo's headers are present (an optional
extension: without them the install goes on and chute.images decodes whole
images with simplejpeg; ``chute.images.codec.partial_decoder()`` says which).
"""

import sys
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
