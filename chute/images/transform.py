"""The batch-level image transform: an image column decoded, cropped and laid out straight into the batch.

``Decode(column, *ops)`` is a ``transform=`` object for :class:`chute.Loader`
(``transform_batch(batch, ctx)``, chute.pipeline.transform): once per batch,
in the worker, it

1. reads each image's size (the JPEG header, about 1 us; stored pixels: their shape),
2. plans every image's geometry from the ops, vectorised, with the batch's
   random numbers ``ctx.random(k)`` (a function of ``(seed, epoch, row)``),
3. takes one output block ``[n, 3, h, w]`` from the Loader's pool
   (``ctx.take``: reused, pinned for a CUDA device),
4. for each image: decodes it, or only the region its box needs, into the
   thread's reused buffer (chute._jpeg or simplejpeg, GIL released), crops or
   resamples it, mirrors it, and writes it CHW (normalised, with
   :class:`Normalize`) into its slot of the block,

and returns the batch with the column replaced by the block. No per-image
tensor, no collate copy. The other columns pass through.

A column of stored pixels (``chute convert --decode``: ``uint8[3, h, w]``)
skips step 1's header and step 4's decode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from chute.images.codec import MAX_PIXELS, Decoder, ImageTooLargeError, image_size
from chute.images.plan import CenterCrop, HorizontalFlip, Op, Plan, RandomCrop, RandomResizedCrop, Resize, dct_scale
from chute.images.render import Normalize, Renderer

#: ``BatchContext.random``'s stream for image geometry (other transforms of the batch use other streams).
STREAM = 0x696D67


class Decode:
    """Decode the images of ``column`` and apply ``ops`` (geometry, then an optional :class:`Normalize` last).

    The ops must give every image the same size (end with a crop or a
    ``Resize((h, w))``); the column becomes ``uint8[n, 3, h, w]`` (or float
    with :class:`Normalize`). ``fast=True``: libjpeg-turbo's fast DCT and
    upsampling, and scaling down in the DCT when the output is at most half
    the source box (docs/images.md). ``scaled=True`` (the default, accurate
    mode): a JPEG whose crop box is at least 2, 4 or 8 times the output in
    both directions is decoded at 1/2, 1/4 or 1/8 in the DCT (:func:`dct_scale`),
    within the pixel tolerance docs/images.md states, and only the region
    around the box is decoded where ``chute._jpeg`` was built (within one level
    of a whole decode); ``scaled=False`` always decodes whole images in full.

    ``max_pixels`` (default :data:`~chute.images.codec.MAX_PIXELS`, Pillow's limit; None: no limit): an
    image whose header claims more pixels is refused before anything of its size is allocated, a
    :class:`~chute.pipeline.transform.TransformError` naming its sample, or skipped with the Loader's
    ``on_error="skip"``.
    """

    #: Its work per image (decode, resize, crop, normalize) runs in native code without the GIL, on all
    #: cores at once: the Loader's autotuner starts at one worker thread per core (docs/observe.md).
    gil_free = True

    def __init__(
        self, column: str, *ops: Op | Normalize, fast: bool = False, scaled: bool = True, max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        if not isinstance(column, str):
            raise TypeError(f"the image column must be a column name (str), got {column!r}")
        normalize = None
        geometry: list[Op] = []
        for i, op in enumerate(ops):
            if isinstance(op, Normalize):
                if i != len(ops) - 1:
                    raise ValueError("Normalize must be the last op: it sets the output's type, after the geometry")
                normalize = op
            elif isinstance(op, Op):
                geometry.append(op)
            else:
                raise TypeError(
                    f"op {i} of chute.images.Decode is a {type(op).__name__}; expected a chute.images op "
                    "(Resize, CenterCrop, RandomCrop, RandomResizedCrop, HorizontalFlip, Normalize)"
                )
        sized = [op.size for op in geometry if op.size is not None]
        last = max((i for i, op in enumerate(geometry) if op.size is not None), default=None)
        if last is None or any(isinstance(op, Resize) and op.size is None for op in geometry[last + 1:]):
            raise ValueError(
                "chute.images.Decode needs ops that give every image of a batch the same size: end the geometry with "
                "a crop (CenterCrop, RandomCrop, RandomResizedCrop) or Resize((height, width))"
            )
        self.column, self.ops, self.normalize, self.fast = column, tuple(geometry), normalize, bool(fast)
        self.scaled = bool(scaled)
        self.size: tuple[int, int] = sized[-1]
        self.draws = sum(op.draws for op in geometry)
        self.decoder = Decoder(self.fast, max_pixels)
        self.max_pixels = self.decoder.max_pixels
        self.renderer = Renderer(normalize)

    @property
    def dtype(self) -> torch.dtype:
        """The output's dtype: uint8, or :class:`Normalize`'s."""
        return torch.uint8 if self.normalize is None else self.normalize.dtype

    def __repr__(self) -> str:
        ops = ", ".join(repr(op) for op in (*self.ops, *(() if self.normalize is None else (self.normalize,))))
        limit = "" if self.max_pixels == MAX_PIXELS else f", max_pixels={self.max_pixels!r}"
        return f"chute.images.Decode({self.column!r}, {ops}{', fast=True' if self.fast else ''}{'' if self.scaled else ', scaled=False'}{limit})"

    # ------------------------------------------------------------------ the batch

    def plan(self, sizes: np.ndarray, ctx: Any) -> Plan:
        """The geometry of every image of the batch (pure: sizes and the batch's random numbers in, a plan out)."""
        plan = Plan.whole(sizes)
        u = ctx.random(self.draws, STREAM) if self.draws else np.zeros((len(plan.out), 0))
        at = 0
        for op in self.ops:
            plan = op.apply(plan, u[:, at:at + op.draws])
            at += op.draws
        return plan

    def transform_batch(self, batch: dict[str, Any], ctx: Any) -> dict[str, Any] | None:
        """The batch with ``column`` decoded into one block ``[n, 3, h, w]`` (see the module docstring)."""
        if self.column not in batch:
            raise KeyError(f"chute.images.Decode: the batch has no column {self.column!r} (its columns: {sorted(batch)})")
        images, stored = _images(batch[self.column])
        n = len(images)
        sizes = np.ones((n, 2), dtype=np.int64)
        for j in range(n):
            try:
                sizes[j] = images[j].shape[1:] if stored else image_size(images[j], self.max_pixels)
            except ImageTooLargeError as exc:
                ctx.fail(j, f"the image in column {self.column!r} is too large", exc)
            except Exception as exc:
                ctx.fail(j, f"cannot read the image header in column {self.column!r}", exc)
        plan = self.plan(sizes, ctx)
        integral = plan.integral()
        h, w = self.size
        out = ctx.take((n, 3, h, w), self.dtype)
        slots = out.numpy()
        render = self.renderer.render
        fast = self.fast and not stored
        scales = dct_scale(sizes, plan.box, plan.out) if self.scaled and not fast and not stored else None
        failed = set(ctx.skipped)
        for j in range(n):
            if j in failed:
                continue
            try:
                if stored:
                    pixels, box = images[j], plan.box[j]
                else:
                    pixels, box, rescaled = self._decode(images[j], sizes[j], plan.box[j], plan.out[j], None if scales is None else int(scales[j]))
                    integral[j] &= not rescaled
                render(pixels, box, (h, w), bool(plan.flip[j]), bool(integral[j]), slots[j], chw=stored)
            except Exception as exc:
                ctx.fail(j, f"cannot decode the image in column {self.column!r}", exc)
        batch = dict(batch)
        batch[self.column] = out
        if ctx.skipped:
            return _without(batch, sorted(set(ctx.skipped)), n)
        return batch

    def _decode(self, data: Any, size: np.ndarray, box: np.ndarray, out: np.ndarray, scale: int | None) -> tuple[np.ndarray, np.ndarray, bool]:
        """``(pixels, box, rescaled)``: the decoded pixels that hold ``box``, the box in their coordinates, and
        whether they are at another scale than the source (then no crop is a plain copy).

        ``scale`` (accurate mode): the DCT reduction; only the region around the box is decoded where that
        is possible (:func:`_region`). None: fast mode, or a whole decode.
        """
        if scale is not None:
            part = _region(size, box, out, scale)
            got = None if part is None else self.decoder.decode_region(data, scale, *part[1])
            if part is not None and got is not None:
                pixels, left, top = got
                return pixels, part[0] - np.array([left, top, left, top], dtype=np.float64), scale > 1
            pixels = self.decoder.decode(data, scale=scale)
        else:
            pixels = self.decoder.decode(data, _min_size(size, box, out) if self.fast else (0, 0))
        if pixels.shape[0] != size[0] or pixels.shape[1] != size[1]:  # scaled in the DCT
            return pixels, box * np.array([pixels.shape[1] / size[1], pixels.shape[0] / size[0]] * 2), True
        return pixels, box, False


def _images(column: Any) -> tuple[Sequence[Any] | np.ndarray, bool]:
    """``(images, stored)``: the encoded images of a column (bytes, or zero-copy views of an Arrow array), or stored pixels."""
    if isinstance(column, torch.Tensor):
        if column.dim() != 4 or column.shape[1] != 3 or column.dtype != torch.uint8:
            raise ValueError(
                f"chute.images.Decode: a tensor column must hold decoded images as uint8[n, 3, h, w] "
                f"(chute convert --decode), got {column.dtype} {tuple(column.shape)}"
            )
        return column.numpy(), True
    if hasattr(column, "buffers") and hasattr(column, "offset"):  # a pyarrow binary array (columnar=True)
        _, offsets, data = column.buffers()[:3]
        kind = np.int64 if str(column.type).startswith("large") else np.int32
        offsets = np.frombuffer(offsets, dtype=kind)[column.offset:column.offset + len(column) + 1]
        data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        return [data[offsets[j]:offsets[j + 1]] for j in range(len(column))], False
    return column, False


def _region(size: np.ndarray, box: np.ndarray, out: np.ndarray, scale: int) -> tuple[np.ndarray, tuple[int, int, int, int]] | None:
    """For a decode of part of an image at 1/``scale``: ``(box, (x0, y0, x1, y1))``, the box in the scaled
    image and the pixels to decode, or None when that is the whole image.

    The region is the box widened by what the resample reads around it (the bilinear filter's support,
    the box / output ratio when shrinking, plus one for rounding) and one column more on each side for
    the cut edge's column a partial decode does not give exactly (:meth:`Decoder.decode_region`).
    """
    h, w = -(-int(size[0]) // scale), -(-int(size[1]) // scale)
    sx, sy = w / int(size[1]), h / int(size[0])
    bx0, by0, bx1, by1 = float(box[0]) * sx, float(box[1]) * sy, float(box[2]) * sx, float(box[3]) * sy
    margin_x = math.ceil(max(1.0, (bx1 - bx0) / int(out[1]))) + 2
    margin_y = math.ceil(max(1.0, (by1 - by0) / int(out[0]))) + 1
    x0, y0 = max(0, math.floor(bx0) - margin_x), max(0, math.floor(by0) - margin_y)
    x1, y1 = min(w, math.ceil(bx1) + margin_x), min(h, math.ceil(by1) + margin_y)
    if x0 == 0 and y0 == 0 and x1 == w and y1 == h:
        return None
    scaled = np.array([bx0, by0, bx1, by1])
    return scaled, (x0, y0, x1, y1)


def _min_size(size: np.ndarray, box: np.ndarray, out: np.ndarray) -> tuple[int, int]:
    """The smallest whole-image size at which ``box`` still has ``out``'s pixels (for a decode scaled in the DCT)."""
    box_h, box_w = box[3] - box[1], box[2] - box[0]
    return int(np.ceil(size[0] * out[0] / box_h)), int(np.ceil(size[1] * out[1] / box_w))


def _without(batch: dict[str, Any], drop: list[int], n: int) -> dict[str, Any] | None:
    """The batch without the samples at positions ``drop`` (those whose image failed, with ``on_error='skip'``)."""
    if len(drop) == n:
        return None
    keep = np.setdiff1d(np.arange(n), drop)
    index = torch.from_numpy(keep)
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[name] = value.index_select(0, index)
        elif isinstance(value, list):
            out[name] = [value[j] for j in keep]
        elif hasattr(value, "take"):  # a pyarrow array
            out[name] = value.take(keep)
        else:
            out[name] = value
    return out


def DecodeCrop(  # noqa: N802 (a constructor in the shape users call it)
    column: str,
    size: int | tuple[int, int],
    *,
    random: bool = False,
    scale: tuple[float, float] | None = None,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    resize: int | None = None,
    flip: bool = False,
    normalize: Normalize | bool | None = None,
    fast: bool = False,
    scaled: bool = True,
    max_pixels: int | None = MAX_PIXELS,
) -> Decode:
    """The common image pipelines in one call: a :class:`Decode` of ``column`` to ``size``.

    * ``DecodeCrop("jpg", 224)``: the centre 224x224 (evaluation);
    * ``DecodeCrop("jpg", 224, resize=256)``: shorter side to 256, then the centre 224 (ImageNet evaluation);
    * ``DecodeCrop("jpg", 224, random=True)``: a random 224x224 window at the source's scale;
    * ``DecodeCrop("jpg", 224, scale=(0.08, 1.0))``: a random-resized crop (``ratio`` its aspect range; ImageNet training);
    * ``flip=True`` adds a random horizontal flip; ``normalize=True`` (ImageNet's mean and std, float32)
      or a :class:`Normalize` gives floats instead of uint8;
    * ``scaled=False`` decodes every JPEG whole and in full (see :class:`Decode`);
    * ``max_pixels``: the largest image accepted, in pixels from its header (default Pillow's limit,
      about 89.5 million; None: no limit); a larger one fails its sample (see :class:`Decode`).
    """
    ops: list[Any] = []
    if resize is not None:
        ops.append(Resize(resize))
    if scale is not None:
        # tuple(): a (lo, hi) pair, or the error RandomResizedCrop gives anything else
        ops.append(RandomResizedCrop(size, scale=cast("tuple[float, float]", tuple(scale)),
                                     ratio=cast("tuple[float, float]", tuple(ratio))))
    elif random:
        ops.append(RandomCrop(size))
    else:
        ops.append(CenterCrop(size))
    if flip:
        ops.append(HorizontalFlip())
    if normalize is True:
        ops.append(Normalize())
    elif isinstance(normalize, Normalize):
        ops.append(normalize)
    elif normalize not in (None, False):
        raise TypeError(f"normalize must be True, False or a chute.images.Normalize, got {normalize!r}")
    return Decode(column, *ops, fast=fast, scaled=scaled, max_pixels=max_pixels)
