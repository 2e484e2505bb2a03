"""An ImageNet-like image workload: full-size photo-like JPEGs, RandomResizedCrop to 224, flip, normalize.

Built once into ``<data-dir>/imagenet-like`` (a chute dataset: a ``jpeg`` bytes
column and a ``label``) and ``imagenet-like-blob.bin`` + ``-offsets.npy`` (the
same bytes back to back, for the Pillow loops). 2,000 images of ImageNet's
usual sizes (500 x 375 and its neighbours, both orientations, a few squares):
smooth gradients, shapes and noise, JPEG quality 90, 4:2:0 (about 50-60 KB
each: they compress like photos, not like random bytes).

The Pillow peers do what a user writes without torchvision, torchvision's
algorithms by hand: open, ``convert("RGB")``, torchvision's
``RandomResizedCrop.get_params`` (scale (0.08, 1), ratio (3/4, 4/3)), crop +
resize to 224 (bilinear), a random flip, then ``ToTensor`` + ``Normalize`` in
torch. ``draft=True`` adds Pillow's ``draft`` before the decode, asking for the
smallest JPEG scale at which the crop box still has 224 pixels each way (the
same rule chute follows).
"""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import random
import time

import numpy as np

ROWS = 2_000
OUT = 224
QUALITY = 90
SIZES = [(375, 500), (500, 375), (333, 500), (500, 333), (375, 500), (400, 500), (500, 400), (375, 375), (450, 600), (500, 500)]
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def _image(i: int) -> bytes:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(1000 + i)
    h, w = SIZES[i % len(SIZES)]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy, xx = yy / h, xx / w
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(-120, 120, 3)
        channels.append(128 + a * xx + b * yy + c * xx * yy)
    img = np.stack(channels, axis=-1) + rng.normal(0, 6, (h, w, 3))
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(4, 10))):
        x0, y0 = int(rng.integers(0, w - 32)), int(rng.integers(0, h - 32))
        x1, y1 = x0 + int(rng.integers(24, w // 2)), y0 + int(rng.integers(24, h // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    out = io.BytesIO()
    pil.save(out, format="JPEG", quality=QUALITY)
    return out.getvalue()


def _images(bounds: tuple[int, int]) -> list[bytes]:
    return [_image(i) for i in range(*bounds)]


def dataset(root: str, rows: int = ROWS):
    """The chute dataset and the paths of the blob and offsets files (built on first use)."""
    from _data import warm

    import chute

    path = os.path.join(root, "imagenet-like")
    blob, offsets = os.path.join(root, "imagenet-like-blob.bin"), os.path.join(root, "imagenet-like-offsets.npy")
    if not os.path.exists(offsets):
        chunks = [(a, min(rows, a + 250)) for a in range(0, rows, 250)]
        with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 1) as pool:
            images = [jpeg for part in pool.map(_images, chunks) for jpeg in part]
        with open(blob + ".tmp", "wb") as f:
            for jpeg in images:
                f.write(jpeg)
        os.replace(blob + ".tmp", blob)
        chute.write(({"jpeg": jpeg, "label": i} for i, jpeg in enumerate(images)), path, overwrite=True)
        np.save(offsets + ".tmp.npy", np.cumsum([0] + [len(j) for j in images]).astype(np.int64))
        os.replace(offsets + ".tmp.npy", offsets)
    ds = chute.open(path)
    warm(ds)
    with open(blob, "rb") as f:
        while f.read(64 << 20):
            pass
    return ds, blob, offsets


# --------------------------------------------------------------------------- the Pillow peers


def rrc_params(height: int, width: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``: ``(top, left, h, w)``, scale (0.08, 1), ratio (3/4, 4/3)."""
    area = height * width
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif ratio > 4 / 3:
        h, w = height, int(round(height * (4 / 3)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pillow_augment(data: bytes, rng: random.Random, draft: bool = False):
    """JPEG bytes -> float32[3, 224, 224]: RandomResizedCrop + flip + ToTensor + Normalize, as users write it."""
    import torch
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    width, height = img.size
    top, left, h, w = rrc_params(height, width, rng)
    if draft:  # the smallest JPEG scale that keeps 224 pixels across the box
        img.draft("RGB", (math.ceil(width * OUT / w), math.ceil(height * OUT / h)))
        sx, sy = img.size[0] / width, img.size[1] / height
        top, left, h, w = top * sy, left * sx, h * sy, w * sx
    img = img.convert("RGB")
    img = img.resize((OUT, OUT), Image.BILINEAR, box=(left, top, left + w, top + h))  # crop + resize
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img)).permute(2, 0, 1).float().div_(255)
    return x.sub_(_MEAN).div_(_STD)


try:
    import torch as _torch

    _MEAN = _torch.tensor(MEAN).view(3, 1, 1)
    _STD = _torch.tensor(STD).view(3, 1, 1)
except ImportError:  # pragma: no cover
    pass


def _loop(args: tuple[str, str, int, int, int, bool]) -> tuple[int, float]:
    blob, offsets_path, a, b, seed, draft = args
    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    offsets = np.load(offsets_path)
    data = np.memmap(blob, dtype=np.uint8, mode="r")
    order = np.random.default_rng(seed).permutation(len(offsets) - 1)[a:b]
    rng = random.Random(seed + a)
    start = time.perf_counter()
    for i in order:
        pillow_augment(data[offsets[i] : offsets[i + 1]].tobytes(), rng, draft)
    return len(order), time.perf_counter() - start


def _ready(_: int) -> int:
    import PIL.Image
    import torch

    torch.set_num_threads(1)
    return os.getpid() if PIL.Image else 0


def pillow_2proc(blob: str, offsets: str, n: int, draft: bool) -> tuple[int, float]:
    """The Pillow loop over all ``n`` images split over 2 processes: ``(images, seconds)``."""
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_ready, range(2))  # started and warm before the clock
        start = time.perf_counter()
        parts = pool.map(_loop, [(blob, offsets, 0, n // 2, 0, draft), (blob, offsets, n // 2, n, 0, draft)], chunksize=1)
        seconds = time.perf_counter() - start
    return sum(p[0] for p in parts), seconds


def scaled_decode_tolerance(crops: int = 120) -> dict:
    """Scaled DCT decode + resample against full decode + the same resample: per scale, the crops and the differences.

    Photo-like JPEGs of 600 x 800 to 1200 x 1600 (tests/images/_data.py's
    generator), a RandomResizedCrop box to 224 each, decoded at every scale
    ``dct_scale`` allows for it. What docs/images.md states as the tolerance.
    """
    import sys

    import simplejpeg
    from PIL import Image

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from chute.images.plan import Plan, RandomResizedCrop
    from tests.images._data import encode, pixels

    def resample(px: np.ndarray, box: np.ndarray) -> np.ndarray:
        h, w = px.shape[:2]
        src = Image.frombuffer("RGB", (w, h), np.ascontiguousarray(px), "raw", "RGB", 0, 1)
        return np.asarray(src.resize((OUT, OUT), Image.BILINEAR, box=tuple(float(v) for v in box))).astype(np.int16)

    rng = np.random.default_rng(0)
    stats: dict[int, list[tuple[float, int, float]]] = {}
    for i in range(crops):
        h, w = [(750, 1000), (1000, 750), (600, 800), (1200, 1600)][i % 4]
        data = encode(pixels(i, h, w))
        full = simplejpeg.decode_jpeg(data)
        box = RandomResizedCrop(OUT).apply(Plan.whole(np.array([[h, w]])), rng.random((1, 40))).box[0]
        for d in (2, 4, 8):
            if (box[3] - box[1]) / d < OUT or (box[2] - box[0]) / d < OUT:
                continue
            scaled = simplejpeg.decode_jpeg(data, min_height=-(-h // d), min_width=-(-w // d), min_factor=d)
            diff = np.abs(resample(full, box) - resample(scaled, box * np.array([scaled.shape[1] / w, scaled.shape[0] / h] * 2)))
            stats.setdefault(d, []).append((float(diff.mean()), int(diff.max()), float(np.quantile(diff, 0.99))))
    return {
        d: {"crops": len(v), "mean_abs": float(np.mean([x[0] for x in v])), "worst_crop_mean_abs": max(x[0] for x in v),
            "max_abs": max(x[1] for x in v), "worst_crop_q99": max(x[2] for x in v)}
        for d, v in sorted(stats.items())
    }
