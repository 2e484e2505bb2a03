"""Writing one image of a plan into its slot of the batch: crop or resample, mirror, lay out CHW, normalise.

Each call writes straight into the batch's output block (``uint8[3, h, w]``,
or float with :class:`Normalize`). A resampled image is one native call
(``chute._native.resample``: Pillow's bilinear algorithm, the mirror, the
planes and the normalisation, through a table of 256 values per channel,
without the GIL); a crop at the source's scale is the native
interleaved-to-planes copy (``chute._native.planes``) and numpy ufuncs for the
normalisation. torch ops are kept out of the per-image path except a float16
cast cut into pieces below torch's intra-op grain (see
``chute.pipeline.collate.copy_into`` for why loader threads avoid torch's
thread pool).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import numpy as np
import torch

from chute._native import planes, resample

#: ImageNet's channel means and standard deviations (of pixels scaled to [0, 1]), as torchvision uses them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: torch runs an op on one thread below this many elements (``at::internal::GRAIN_SIZE``).
_GRAIN = 32768


@dataclasses.dataclass(frozen=True)
class Normalize:
    """Output ``(pixel / 255 - mean) / std`` per channel as ``dtype`` (float32 or float16) instead of uint8.

    ``mean`` and ``std`` are for pixels scaled to [0, 1], as in torchvision
    (default: ImageNet's). Cost: one pass over the output's pixels; float16 adds
    a cast (figures: docs/benchmarks.md, "Design figures").
    """

    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.dtype not in (torch.float32, torch.float16):
            raise ValueError(f"Normalize dtype must be torch.float32 or torch.float16, got {self.dtype}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"Normalize needs 3 means and 3 positive standard deviations, got {self.mean!r} and {self.std!r}")
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, offset)`` as float32 ``[3, 1, 1]``: ``out = pixel * scale + offset``."""
        std = np.asarray(self.std, dtype=np.float64)
        scale = 1.0 / (255.0 * std)
        offset = -np.asarray(self.mean, dtype=np.float64) / std
        return scale.astype(np.float32)[:, None, None], offset.astype(np.float32)[:, None, None]

    def table(self) -> np.ndarray:
        """The output for each pixel value, per channel: ``[3, 256]`` of float32, or float16's bits as uint16.

        The same float32 operations as :meth:`coefficients` applied to the 256 values (then rounded to
        float16 to nearest, as torch's cast does), so a lookup gives what the arithmetic gives.
        """
        scale, offset = self.coefficients()
        values = np.arange(256, dtype=np.uint8)[None, :] * scale[:, :, 0]
        values += offset[:, :, 0]
        return values if self.dtype == torch.float32 else values.astype(np.float16).view(np.uint16)


class Renderer:
    """Writes images into output slots (see the module docstring); one per transform, thread-safe."""

    def __init__(self, normalize: Normalize | None) -> None:
        self.normalize = normalize
        self._coefficients = normalize.coefficients() if normalize is not None else None
        self._table = normalize.table() if normalize is not None else None
        self._local = threading.local()  # a float32 scratch image per thread, for float16 output

    @property
    def table(self) -> np.ndarray | None:
        """:meth:`Normalize.table`, or None for uint8 output: what ``chute._native.resample`` takes as ``lut``."""
        return self._table

    def __getstate__(self) -> dict:
        return {"normalize": self.normalize}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["normalize"])

    def render(self, pixels: np.ndarray, box: Sequence[float], out: tuple[int, int], flip: bool, integral: bool, dst: np.ndarray,
               chw: bool = False) -> None:
        """Write ``pixels`` (``uint8[h, w, 3]``, or ``[3, h, w]`` with ``chw``) cropped to ``box`` (``x0, y0, x1, y1``),
        at ``out``, into ``dst`` (``[3, *out]``)."""
        if integral:
            x0, y0, x1, y1 = map(int, box)
            if not chw:
                self._planes(pixels, x0, y0, y1 - y0, x1 - x0, flip, dst)
                return
            crop = pixels[:, y0:y1, x0:x1]
            self._write(crop[:, :, ::-1] if flip else crop, dst)
            return
        if chw:
            pixels = np.ascontiguousarray(pixels.transpose(1, 2, 0))
        elif not pixels.flags.c_contiguous:
            pixels = np.ascontiguousarray(pixels)
        target = dst if dst.flags.c_contiguous else np.empty(dst.shape, dst.dtype)
        h, w = pixels.shape[:2]
        resample(pixels, h, w, box.tolist() if isinstance(box, np.ndarray) else box, target, int(out[0]), int(out[1]), flip, self._table)
        if target is not dst:
            np.copyto(dst, target)

    def _planes(self, rgb: np.ndarray, x0: int, y0: int, h: int, w: int, flip: bool, dst: np.ndarray) -> None:
        """Write the ``h`` x ``w`` crop at ``(x0, y0)`` of ``rgb`` (``[H, W, 3]``) into ``dst``: laid out as planes
        by the native kernel (SSSE3; several times faster than numpy's copy of the transposed view: docs/benchmarks.md),
        into ``dst`` itself for uint8 output, else into a per-thread uint8 scratch that normalising reads."""
        if not rgb.flags.c_contiguous:
            rgb = np.ascontiguousarray(rgb)
        target = dst
        if self._coefficients is not None or not dst.flags.c_contiguous:
            scratch: np.ndarray | None = getattr(self._local, "planes", None)
            if scratch is None or scratch.shape != (3, h, w):
                scratch = self._local.planes = np.empty((3, h, w), np.uint8)
            target = scratch
        planes(rgb, rgb.shape[0], rgb.shape[1], x0, y0, target, h, w, flip)
        if target is not dst:
            self._write(target, dst)

    def _write(self, crop: np.ndarray, dst: np.ndarray) -> None:
        if self._coefficients is None:
            np.copyto(dst, crop, casting="no")
            return
        scale, offset = self._coefficients
        if dst.dtype == np.float32:
            np.multiply(crop, scale, out=dst)
            np.add(dst, offset, out=dst)
            return
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.shape != dst.shape:
            scratch = self._local.scratch = np.empty(dst.shape, np.float32)
        np.multiply(crop, scale, out=scratch)
        np.add(scratch, offset, out=scratch)
        half_cast(dst, scratch)


def half_cast(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` from float32 to float16 with torch's vectorised cast, on this thread alone.

    numpy's float16 cast is scalar (docs/benchmarks.md, "Design figures"); torch's is
    vectorised but would use its intra-op threads on an image, so it is fed
    pieces below the grain it splits at.
    """
    flat_dst = torch.from_numpy(dst.reshape(-1))
    flat_src = torch.from_numpy(src.reshape(-1))
    for start in range(0, flat_dst.numel(), _GRAIN):
        flat_dst[start:start + _GRAIN].copy_(flat_src[start:start + _GRAIN])
