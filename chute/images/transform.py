"""The batch-level image transform: an image column decoded, cropped and laid out straight into the batch.

``Decode(column, *ops)`` is a ``transform=`` object for :class:`chute.Loader`
(``transform_batch(batch, ctx)``, chute.pipeline.transform): once per batch,
in the worker, it

1. reads each image's size (the JPEG header, nothing decoded; stored pixels: their shape),
2. plans every image's geometry from the ops, vectorised, with the batch's
   random numbers ``ctx.random(k)`` (a function of ``(seed, epoch, row)``),
3. takes one output block ``[n, 3, h, w]`` from the Loader's pool
   (``ctx.take``: reused, pinned for a CUDA device),
4. for each image: decodes it, or only the region its box needs, into the
   thread's reused buffer (chute._jpeg or simplejpeg, GIL released), crops or
   resamples it, mirrors it, and writes it CHW (normalised, with
   :class:`Normalize`) into its slot of the block: for the batch's JPEGs, where
   chute._jpeg was built, all of them in one native call (and step 1's headers
   in another), the GIL released once each,

and returns the batch with the column replaced by the block. No per-image
tensor, no collate copy. The other columns pass through.

A column of stored pixels (``chute convert --decode``: ``uint8[3, h, w]``)
skips step 1's header and step 4's decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, cast

import numpy as np
import torch

from chute.images.codec import MAX_PIXELS, Decoder, ImageTooLargeError, partial_decoder
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
        """The batch with ``column`` decoded into one block ``[n, 3, h, w]`` (see the module docstring).

        Where ``chute._jpeg`` was built (accurate mode), the batch's JPEGs take two native calls in all,
        each with the GIL released once: their headers (:func:`chute._jpeg.headers`), then, after the
        geometry is planned in numpy, every decode and its crop or resample into the block
        (:func:`chute._jpeg.decode_batch`). A loader thread that released and took back the GIL three
        times per image, with Python between, was often descheduled holding it on a busy machine, and
        the training loop waited for it. Anything else (stored pixels, fast mode, other formats, a
        JPEG the batch call refused) goes image by image, and a failure gives the same error either way.
        """
        if self.column not in batch:
            raise KeyError(f"chute.images.Decode: the batch has no column {self.column!r} (its columns: {sorted(batch)})")
        images, stored = _images(batch[self.column])
        n = len(images)
        sizes = np.ones((n, 2), dtype=np.int64)
        headers: list[tuple[int, int, str | None] | None] = [None] * n
        native = None if stored or n == 0 else batch_decoder(self.decoder)
        batched = np.zeros(n, dtype=bool)
        if native is not None:
            found = np.empty((n, 3), dtype=np.int64)
            native.headers(images, found)
            batched = found[:, 2] == 1
            if self.max_pixels is not None:  # over the limit: refused image by image below, with its error
                batched &= found[:, 0] * found[:, 1] <= self.max_pixels
            sizes[batched] = found[batched, :2]
        header = self.decoder.header
        for j in np.flatnonzero(~batched).tolist():
            self._header(j, images, stored, sizes, headers, header, ctx)
        plan = self.plan(sizes, ctx)
        integral = plan.integral()
        h, w = self.size
        out = ctx.take((n, 3, h, w), self.dtype)
        slots = out.numpy()
        fast = self.fast and not stored
        scales = dct_scale(sizes, plan.box, plan.out) if self.scaled and not fast and not stored else None
        failed = set(ctx.skipped)
        done: set[int] = set()
        if native is not None and slots.flags.c_contiguous:
            todo = batched.copy()
            todo[list(failed)] = False
            if todo.any():
                done = self._decode_batch(native, images, todo, sizes, plan, integral, scales, slots)
        if len(done) + len(failed) < n:
            self._decode_each(images, stored, sizes, headers, plan, integral, scales, slots, failed | done, ctx)
        batch = dict(batch)
        batch[self.column] = out
        if ctx.skipped:
            return _without(batch, sorted(set(ctx.skipped)), n)
        return batch

    def _header(
        self, j: int, images: Any, stored: bool, sizes: np.ndarray, headers: list[tuple[int, int, str | None] | None], header: Any,
        ctx: Any,
    ) -> bool:
        """Image ``j``'s size into ``sizes[j]`` (and its header into ``headers[j]``); False where it failed (``ctx.fail``)."""
        try:
            if stored:
                sizes[j] = images[j].shape[1:]
            else:
                headers[j] = found = header(images[j])
                sizes[j, 0], sizes[j, 1] = found[0], found[1]
            return True
        except ImageTooLargeError as exc:
            ctx.fail(j, f"the image in column {self.column!r} is too large", exc)
        except Exception as exc:
            ctx.fail(j, f"cannot read the image header in column {self.column!r}", exc)
        return False

    def _decode_batch(
        self, native: Any, images: Any, todo: np.ndarray, sizes: np.ndarray, plan: Plan, integral: np.ndarray,
        scales: np.ndarray | None, slots: np.ndarray,
    ) -> set[int]:
        """Decode the images ``todo`` (JPEGs whose headers ``chute._jpeg.headers`` read) into their slots in one
        native call; the positions it wrote. Each image is decoded as the per-image path decodes it: at
        its DCT scale, the region around its box (:func:`_bounds`) or the whole image, then copied or
        resampled with the same kernels; those that fail are left to the per-image path, which gives their error."""
        n = len(todo)
        if scales is None:  # scaled=False: whole images, in full
            scales = np.ones(n, dtype=np.int64)
            high, wide = sizes[:, 0], sizes[:, 1]
            boxes = plan.box
            bounds = np.stack([np.zeros(n, np.int64), np.zeros(n, np.int64), wide, high], axis=1)
        else:
            high, wide = -(-sizes[:, 0] // scales), -(-sizes[:, 1] // scales)
            boxes, bounds = _bounds(sizes, plan.box, plan.out, scales)
        jobs = np.empty((n, 8), dtype=np.int64)
        jobs[:, 0] = todo
        jobs[:, 1] = scales
        jobs[:, 2:6] = bounds
        jobs[:, 6] = plan.flip
        jobs[:, 7] = integral & (scales == 1)
        need = high * wide * 3
        buffer = self.decoder.batch_buffer(int(need[todo].max()), int(todo.sum()))
        limit = 0 if self.max_pixels is None else min(self.max_pixels, 2**64 - 1)  # 0: none (a C unsigned long long)
        h, w = self.size
        failures = native.decode_batch(
            images, jobs, np.ascontiguousarray(boxes, dtype=np.float64), buffer, slots, h, w, self.renderer.table, limit,
        )
        done = set(np.flatnonzero(todo).tolist())
        done.difference_update(j for j, _ in failures)
        return done

    def _decode_each(
        self, images: Any, stored: bool, sizes: np.ndarray, headers: list[tuple[int, int, str | None] | None], plan: Plan,
        integral_array: np.ndarray, scales: np.ndarray | None, slots: np.ndarray, skip: set[int], ctx: Any,
    ) -> None:
        """Decode image by image (in the thread's reused buffer, three native calls each) every image not in ``skip``.

        Per image, the Python around the native calls is kept to a few lines (it holds the GIL, which the
        other loader threads wait for): the geometry, DCT scales and decode regions are worked out for the
        whole batch in numpy, and the loop reads plain lists.
        """
        h, w = self.size
        render = self.renderer.render
        regions = _regions(sizes, plan.box, plan.out, scales) if scales is not None and self.decoder.partial else None
        integral = integral_array.tolist()
        boxes, flips = plan.box.tolist(), plan.flip.tolist()
        scale_list = None if scales is None else scales.tolist()
        header = self.decoder.header
        for j in range(len(images)):
            if j in skip:
                continue
            if not stored and headers[j] is None and not self._header(j, images, stored, sizes, headers, header, ctx):
                continue  # (a JPEG the batch call read the header of but could not decode: read as before, for its error)
            try:
                if stored:
                    pixels, box, whole = images[j], boxes[j], integral[j]
                else:
                    pixels, box, rescaled = self._decode(
                        images[j], headers[j], sizes[j], boxes[j], plan.out[j], None if scale_list is None else scale_list[j],
                        None if regions is None else regions[j],
                    )
                    whole = integral[j] and not rescaled
                render(pixels, box, (h, w), flips[j], whole, slots[j], chw=stored)
            except Exception as exc:
                ctx.fail(j, f"cannot decode the image in column {self.column!r}", exc)

    def _decode(
        self, data: Any, header: tuple[int, int, str | None] | None, size: np.ndarray, box: list[float], out: np.ndarray,
        scale: int | None, region: tuple[list[float], list[int]] | None,
    ) -> tuple[np.ndarray, list[float], bool]:
        """``(pixels, box, rescaled)``: the decoded pixels that hold ``box``, the box in their coordinates, and
        whether they are at another scale than the source (then no crop is a plain copy).

        ``scale`` (accurate mode): the DCT reduction; ``region``: the part of the image to decode at that
        scale and the box in the scaled image (:func:`_regions`), None where that is the whole image or
        there is no partial decoder. ``scale`` None: fast mode, or a whole decode.
        """
        if scale is not None:
            if region is not None:
                scaled, (x0, y0, x1, y1) = region
                got = self.decoder.decode_region(data, scale, x0, y0, x1, y1, header)
                if got is not None:
                    pixels, left, top = got
                    return pixels, [scaled[0] - left, scaled[1] - top, scaled[2] - left, scaled[3] - top], scale > 1
            pixels = self.decoder.decode(data, scale=scale, header=header)
        else:
            pixels = self.decoder.decode(data, _min_size(size, np.asarray(box), out) if self.fast else (0, 0), header=header)
        height, width = pixels.shape[0], pixels.shape[1]
        if height != size[0] or width != size[1]:  # scaled in the DCT
            sx, sy = width / int(size[1]), height / int(size[0])
            return pixels, [box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy], True
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


def _bounds(sizes: np.ndarray, box: np.ndarray, out: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image, for a decode at 1/``scales[j]``: ``(boxes, bounds)``, the box in the scaled image (float
    ``[n, 4]``) and the pixels to decode (int ``[n, 4]``: ``x0, y0, x1, y1``; the whole scaled image where
    the region would reach all its edges), the batch at once, in numpy.

    The region is the box widened by what the resample reads around it (the bilinear filter's support,
    the box / output ratio when shrinking, plus one for rounding) and one column more on each side for
    the cut edge's column a partial decode does not give exactly (:meth:`Decoder.decode_region`).
    """
    size_h, size_w = sizes[:, 0], sizes[:, 1]
    h, w = -(-size_h // scales), -(-size_w // scales)
    sx, sy = w / size_w, h / size_h
    bx0, by0, bx1, by1 = box[:, 0] * sx, box[:, 1] * sy, box[:, 2] * sx, box[:, 3] * sy
    margin_x = np.ceil(np.maximum(1.0, (bx1 - bx0) / out[:, 1])).astype(np.int64) + 2
    margin_y = np.ceil(np.maximum(1.0, (by1 - by0) / out[:, 0])).astype(np.int64) + 1
    x0 = np.maximum(0, np.floor(bx0).astype(np.int64) - margin_x)
    y0 = np.maximum(0, np.floor(by0).astype(np.int64) - margin_y)
    x1 = np.minimum(w, np.ceil(bx1).astype(np.int64) + margin_x)
    y1 = np.minimum(h, np.ceil(by1).astype(np.int64) + margin_y)
    boxes, bounds = np.empty((len(box), 4), dtype=np.float64), np.empty((len(box), 4), dtype=np.int64)
    boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3] = bx0, by0, bx1, by1
    bounds[:, 0], bounds[:, 1], bounds[:, 2], bounds[:, 3] = x0, y0, x1, y1
    return boxes, bounds


def _regions(sizes: np.ndarray, box: np.ndarray, out: np.ndarray, scales: np.ndarray) -> list[tuple[list[float], list[int]] | None]:
    """Per image, for a decode of part of it at 1/``scales[j]``: ``(box, [x0, y0, x1, y1])``, the box in the
    scaled image and the pixels to decode (:func:`_bounds`), or None when that is the whole image."""
    boxes, bounds = _bounds(sizes, box, out, scales)
    h, w = -(-sizes[:, 0] // scales), -(-sizes[:, 1] // scales)
    whole = ((bounds[:, 0] == 0) & (bounds[:, 1] == 0) & (bounds[:, 2] == w) & (bounds[:, 3] == h)).tolist()
    scaled, pixels = boxes.tolist(), bounds.tolist()
    return [None if whole[j] else (scaled[j], pixels[j]) for j in range(len(whole))]


def batch_decoder(decoder: Decoder) -> ModuleType | None:
    """``chute._jpeg`` where a batch's JPEGs are decoded in one native call (built, accurate mode), else None."""
    return partial_decoder() if decoder.partial else None


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
