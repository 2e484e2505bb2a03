"""The geometry of a batch of images, decided before any pixel is touched.

A :class:`Plan` says, for every image of a batch, which box of the source
image becomes the output (float pixel coordinates), the size of the output so
far and whether it is mirrored. The geometric operations (:class:`Resize`,
:class:`CenterCrop`, :class:`RandomCrop`, :class:`RandomResizedCrop`,
:class:`HorizontalFlip`) only change the plan, vectorised over the batch in
numpy: any chain of them costs one resample (or one copy, for a crop at the
source's scale) per image when the pixels are finally written. Their random
numbers are columns of ``BatchContext.random``: a function of
``(seed, epoch, dataset row)``, so a sample gets the same geometry whatever
thread or process builds its batch.

The operations follow torchvision's definitions (``transforms.v2``) of the
same names, so a model trained with those sees the same distribution of crops.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass
class Plan:
    """Per image of a batch: the source box (``x0, y0, x1, y1``, float pixels), the output ``(h, w)`` and a mirror flag."""

    box: np.ndarray  # float64 [n, 4]
    out: np.ndarray  # int64 [n, 2]: height, width
    flip: np.ndarray  # bool [n]

    @classmethod
    def whole(cls, sizes: np.ndarray) -> Plan:
        """Every image as it is: ``sizes`` is int ``[n, 2]`` of ``(height, width)``."""
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        n = len(sizes)
        box = np.zeros((n, 4), dtype=np.float64)
        box[:, 2], box[:, 3] = sizes[:, 1], sizes[:, 0]
        return cls(box, sizes.copy(), np.zeros(n, dtype=bool))

    def crop(self, top: np.ndarray, left: np.ndarray, height: np.ndarray | int, width: np.ndarray | int) -> Plan:
        """The window ``[top, top + height) x [left, left + width)`` of the current output (its pixel coordinates)."""
        scale_y = (self.box[:, 3] - self.box[:, 1]) / self.out[:, 0]
        scale_x = (self.box[:, 2] - self.box[:, 0]) / self.out[:, 1]
        x0 = self.box[:, 0] + left * scale_x
        y0 = self.box[:, 1] + top * scale_y
        n = len(self.box)
        box = np.empty((n, 4), dtype=np.float64)  # (filled column by column: np.stack costs more for a batch's few rows)
        box[:, 0], box[:, 1], box[:, 2], box[:, 3] = x0, y0, x0 + width * scale_x, y0 + height * scale_y
        out = np.empty((n, 2), dtype=np.int64)
        out[:, 0], out[:, 1] = height, width
        return Plan(box, out, self.flip)

    def resized(self, out: np.ndarray) -> Plan:
        """The same box, rendered at ``out`` (int ``[n, 2]``)."""
        return Plan(self.box, np.asarray(out, dtype=np.int64).reshape(-1, 2), self.flip)

    def integral(self) -> np.ndarray:
        """Images whose box is whole pixels at the source's scale: a copy renders them, no resample."""
        b = self.box
        whole = (b == np.round(b)).all(axis=1)
        return whole & (b[:, 2] - b[:, 0] == self.out[:, 1]) & (b[:, 3] - b[:, 1] == self.out[:, 0])


#: The reductions libjpeg-turbo's scaled inverse DCT decodes at faster than a full decode (it offers
#: other multiples of 1/8 too, but 5/8 to 7/8 are slower than a full decode: docs/benchmarks.md).
DCT_SCALES = (8, 4, 2)


def dct_scale(sizes: np.ndarray, box: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per image, the reduction ``d`` (1, 2, 4 or 8) to decode at: the largest whose 1/d-size image still
    has at least the output's pixels inside the box, in both directions (so the one resample still
    shrinks or keeps, never enlarges, what a full decode would have given it).

    ``sizes`` int ``[n, 2]`` (height, width), ``box`` float ``[n, 4]``, ``out`` int ``[n, 2]``: a
    :class:`Plan`'s. A decode at 1/d is ``ceil(size / d)`` pixels, so the box keeps at least 1/d of its
    pixels: a ratio of ``d`` between box and output is enough.
    """
    box = np.asarray(box, dtype=np.float64).reshape(-1, 4)
    out = np.asarray(out, dtype=np.float64).reshape(-1, 2)
    ratio = np.minimum((box[:, 3] - box[:, 1]) / out[:, 0], (box[:, 2] - box[:, 0]) / out[:, 1])
    scale = np.ones(len(ratio), dtype=np.int64)
    for d in DCT_SCALES[::-1]:
        scale[ratio >= d] = d
    return scale


def _pair(size: int | Sequence[int], what: str) -> tuple[int, int]:
    """``size`` as ``(height, width)``: an int is a square."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    elif isinstance(size, Sequence) and len(size) == 2 and all(isinstance(s, (int, np.integer)) for s in size):
        pair = (int(size[0]), int(size[1]))
    else:
        raise TypeError(f"{what} must be an int or a (height, width) pair of ints, got {size!r}")
    if min(pair) < 1:
        raise ValueError(f"{what} must be at least 1, got {size!r}")
    return pair


class Op:
    """A geometric operation: ``draws`` random numbers per image, ``apply(plan, u)`` -> the new plan."""

    draws = 0
    size: tuple[int, int] | None = None  # the output size it sets for every image, if it does

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Resize(Op):
    """Scale the image: an int makes the *shorter* side that long (aspect kept), ``(h, w)`` is exact.

    Cost: the one resample of the chain (Pillow's bilinear arithmetic with
    antialiasing, native, GIL released; figures: docs/benchmarks.md).
    """

    target: int | tuple[int, int]

    def __post_init__(self) -> None:
        if isinstance(self.target, (int, np.integer)):
            _pair(self.target, "Resize size")
        else:
            object.__setattr__(self, "target", _pair(self.target, "Resize size"))

    @property
    def size(self) -> tuple[int, int] | None:  # type: ignore[override]
        return None if isinstance(self.target, (int, np.integer)) else self.target

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        if not isinstance(self.target, (int, np.integer)):
            return plan.resized(np.tile(self.target, (len(plan.out), 1)))
        h, w = plan.out[:, 0], plan.out[:, 1]
        s = int(self.target)
        short = np.minimum(h, w)
        # torchvision: the long side is int(s * long / short), the short side exactly s
        new_h = np.where(h <= w, s, (s * h / short).astype(np.int64))
        new_w = np.where(h <= w, (s * w / short).astype(np.int64), s)
        return plan.resized(np.stack([new_h, new_w], axis=1))


def _enlarge(plan: Plan, crop: tuple[int, int]) -> Plan:
    """Scale up (aspect kept) the images smaller than ``crop``, so that the crop fits."""
    h, w = plan.out[:, 0].astype(np.float64), plan.out[:, 1].astype(np.float64)
    factor = np.maximum(1.0, np.maximum(crop[0] / h, crop[1] / w))
    if (factor == 1.0).all():
        return plan
    out = np.stack([np.maximum(crop[0], np.ceil(h * factor - 1e-9)), np.maximum(crop[1], np.ceil(w * factor - 1e-9))], axis=1)
    return plan.resized(np.where(factor[:, None] > 1.0, out, plan.out).astype(np.int64))


@dataclasses.dataclass(frozen=True)
class CenterCrop(Op):
    """The centre ``size`` (int: a square) of the image; an image smaller than that is first enlarged to fit.

    Cost: a copy of the output's pixels when nothing before it resampled; else
    nothing (it narrows the one resample).
    """

    crop: int | tuple[int, int]

    @property
    def size(self) -> tuple[int, int]:  # type: ignore[override]
        return _pair(self.crop, "CenterCrop size")

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        ch, cw = self.size
        plan = _enlarge(plan, (ch, cw))
        # torchvision: int(round((size - crop) / 2))
        top = np.round((plan.out[:, 0] - ch) / 2.0)
        left = np.round((plan.out[:, 1] - cw) / 2.0)
        return plan.crop(top, left, ch, cw)


@dataclasses.dataclass(frozen=True)
class RandomCrop(Op):
    """A ``size`` window (int: a square) at a uniformly random position; an image smaller than that is first enlarged.

    Cost: as :class:`CenterCrop`; one random number per image.
    """

    crop: int | tuple[int, int]
    draws = 2

    @property
    def size(self) -> tuple[int, int]:  # type: ignore[override]
        return _pair(self.crop, "RandomCrop size")

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        ch, cw = self.size
        plan = _enlarge(plan, (ch, cw))
        top = np.floor(u[:, 0] * (plan.out[:, 0] - ch + 1))
        left = np.floor(u[:, 1] * (plan.out[:, 1] - cw + 1))
        return plan.crop(top, left, ch, cw)


@dataclasses.dataclass(frozen=True)
class RandomResizedCrop(Op):
    """A random box of ``scale`` (share of the area) and ``ratio`` (width / height), resized to ``size``.

    torchvision's algorithm: up to 10 tries of a uniform area share and a
    log-uniform aspect ratio; when none fits, the central box of the largest
    ratio within ``ratio``. Cost: 40 random numbers per image (vectorised)
    and the one resample.
    """

    crop: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    draws = 40
    tries = 10

    def __post_init__(self) -> None:
        _pair(self.crop, "RandomResizedCrop size")
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"RandomResizedCrop scale must be (lo, hi) with 0 < lo <= hi <= 1, got {self.scale!r}")
        lo, hi = self.ratio
        if not 0 < lo <= hi:
            raise ValueError(f"RandomResizedCrop ratio must be (lo, hi) with 0 < lo <= hi, got {self.ratio!r}")

    @property
    def size(self) -> tuple[int, int]:  # type: ignore[override]
        return _pair(self.crop, "RandomResizedCrop size")

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        n = len(plan.out)
        height, width = plan.out[:, 0].astype(np.float64), plan.out[:, 1].astype(np.float64)
        area = (height * width)[:, None]
        t = self.tries
        target = area * (self.scale[0] + u[:, 0:t] * (self.scale[1] - self.scale[0]))
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lo + u[:, t:2 * t] * (hi - lo))
        w = np.round(np.sqrt(target * aspect))
        h = np.round(np.sqrt(target / aspect))
        fits = (w > 0) & (h > 0) & (w <= width[:, None]) & (h <= height[:, None])
        first = np.argmax(fits, axis=1)
        found = fits[np.arange(n), first]
        pick = lambda a: a[np.arange(n), first]  # noqa: E731
        h_ok, w_ok = pick(h), pick(w)
        top = np.floor(pick(u[:, 2 * t:3 * t]) * (height - h_ok + 1))
        left = np.floor(pick(u[:, 3 * t:4 * t]) * (width - w_ok + 1))
        # the fallback: the central box of the nearest allowed ratio
        in_ratio = width / height
        fw = np.where(in_ratio < self.ratio[0], width, np.where(in_ratio > self.ratio[1], np.round(height * self.ratio[1]), width))
        fh = np.where(in_ratio < self.ratio[0], np.round(width / self.ratio[0]), height)
        fh = np.where(in_ratio > self.ratio[1], height, fh)
        ftop, fleft = np.floor((height - fh) / 2), np.floor((width - fw) / 2)
        box = plan.crop(
            np.where(found, top, ftop), np.where(found, left, fleft), np.where(found, h_ok, fh), np.where(found, w_ok, fw)
        )
        return box.resized(np.tile(self.size, (n, 1)))


@dataclasses.dataclass(frozen=True)
class HorizontalFlip(Op):
    """Mirror the image left-right with probability ``p``. Cost: none (the copy that writes the output reads backwards)."""

    p: float = 0.5
    draws = 1

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise ValueError(f"HorizontalFlip p must be in [0, 1], got {self.p!r}")

    def apply(self, plan: Plan, u: np.ndarray) -> Plan:
        return Plan(plan.box, plan.out, plan.flip ^ (u[:, 0] < self.p))
