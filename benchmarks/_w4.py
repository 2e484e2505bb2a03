"""W4: 20,000 JPEGs of 256x256, decoded with Pillow and randomly cropped to 224 (uint8 CHW tensors).

Built once into ``<data-dir>/w4`` (a chute dataset with a ``jpeg`` bytes column
and a ``label``) and ``<data-dir>/w4-blob.bin`` + ``w4-offsets.npy`` (the same
JPEG bytes back to back, for the baselines that do not use chute). The images
are smooth gradients, a few shapes and noise: they compress like photos
(about 20-30 KB each at quality 90), not like random bytes.

Every configuration runs the same per-image work, :func:`decode_crop`: a JPEG
decode, a random 224x224 crop, a CHW uint8 tensor. The limits decode with the
decoder chute.images uses (simplejpeg, libjpeg-turbo), so a ratio to them
measures the loader, not the decoder; Pillow's loop is shown beside them.
``benchmarks/loader.py --only w4`` runs them:

  limit-1          a plain simplejpeg loop over the images on one core (no batching)
  limit-2proc      the same loop split over 2 processes (multiprocessing): the two-core limit
  limit-2proc-pil  the same with Pillow's decoder, for scale
  torch-2        torch DataLoader(num_workers=2, batch 256) over a map Dataset of the same bytes
  chute-2        chute.Loader(workers=2), the decode in the per-sample transform
  chute-auto     chute.Loader(): the autotuner picks
  chute-proc2    chute.Loader(workers=chute.Workers("processes", count=2))
"""

from __future__ import annotations

import io
import multiprocessing
import os
import random
import resource
import time

import numpy as np
import torch

ROWS = 20_000
SIDE = 256
CROP = 224
BATCH = 256
QUALITY = 90


# --------------------------------------------------------------------------- the work


def decode_crop_simplejpeg(data: bytes, rng: random.Random | None = None) -> torch.Tensor:
    """JPEG bytes -> a random 224x224 crop as a uint8 CHW tensor, decoded by simplejpeg (what chute.images uses)."""
    import simplejpeg

    rand = (rng or random).randrange
    pixels = simplejpeg.decode_jpeg(data)
    h, w = pixels.shape[:2]
    x, y = rand(w - CROP + 1), rand(h - CROP + 1)
    return torch.from_numpy(pixels[y : y + CROP, x : x + CROP].transpose(2, 0, 1).copy())


DECODERS = {"simplejpeg": decode_crop_simplejpeg}  # "pillow" added below


def decode_crop(data: bytes, rng: random.Random | None = None) -> torch.Tensor:
    """JPEG bytes -> a random 224x224 crop as a uint8 CHW tensor (Pillow decodes with the GIL released)."""
    from PIL import Image

    rand = (rng or random).randrange
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        x, y = rand(img.width - CROP + 1), rand(img.height - CROP + 1)
        crop = img.crop((x, y, x + CROP, y + CROP))
    return torch.from_numpy(np.asarray(crop).transpose(2, 0, 1).copy())


DECODERS["pillow"] = decode_crop


def decode_sample(sample: dict) -> dict:
    """chute's per-sample transform (module-level, so worker processes can import it)."""
    return {"image": decode_crop(sample["jpeg"]), "label": sample["label"]}


class JpegBlobDataset(torch.utils.data.Dataset):
    """A map-style Dataset over the JPEG bytes in one file (memory-mapped), as a torch user would write it."""

    def __init__(self, blob: str, offsets: str) -> None:
        self.blob, self.offsets_path = blob, offsets
        self.offsets = np.load(offsets)
        self.data: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.data is None:  # mapped lazily, in each worker
            self.data = np.memmap(self.blob, dtype=np.uint8, mode="r")
        a, b = self.offsets[i], self.offsets[i + 1]
        return decode_crop(self.data[a:b].tobytes()), i


# --------------------------------------------------------------------------- the data


def _image(i: int) -> bytes:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(i)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(-120, 120, 3)
        channels.append(128 + a * xx + b * yy + c * xx * yy)
    img = np.stack(channels, axis=-1)
    img += rng.normal(0, 10, img.shape)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = (int(v) for v in rng.integers(0, SIDE - 16, 2))
        x1, y1 = x0 + int(rng.integers(16, 96)), y0 + int(rng.integers(16, 96))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    out = io.BytesIO()
    pil.save(out, format="JPEG", quality=QUALITY)
    return out.getvalue()


def _images(bounds: tuple[int, int]) -> list[bytes]:
    return [_image(i) for i in range(*bounds)]


def jpeg_dataset(root: str, rows: int = ROWS):
    """The W4 chute dataset and the paths of the blob and offsets files (built on first use)."""
    from _data import warm

    import chute

    path = os.path.join(root, "w4")
    blob, offsets = os.path.join(root, "w4-blob.bin"), os.path.join(root, "w4-offsets.npy")
    if not os.path.exists(offsets):
        chunks = [(a, min(rows, a + 1000)) for a in range(0, rows, 1000)]
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


# --------------------------------------------------------------------------- the configurations


def _loop(args: tuple) -> tuple[int, float]:
    """Decode images ``[a, b)`` (of a random permutation) in this process: ``(images, seconds)``.

    ``args``: ``(blob, offsets, a, b, seed[, decoder])``, decoder a key of DECODERS (default simplejpeg).
    """
    blob, offsets_path, a, b, seed = args[:5]
    decode = DECODERS[args[5] if len(args) > 5 else "simplejpeg"]
    offsets = np.load(offsets_path)
    data = np.memmap(blob, dtype=np.uint8, mode="r")
    order = np.random.default_rng(seed).permutation(len(offsets) - 1)[a:b]
    rng = random.Random(seed)
    start = time.perf_counter()
    for i in order:
        decode(data[offsets[i] : offsets[i + 1]].tobytes(), rng)
    return len(order), time.perf_counter() - start


def _ready(_: int) -> int:
    """Import the decoders in a pool process before the clock starts."""
    import PIL.Image
    import simplejpeg

    return os.getpid() if PIL.Image and simplejpeg else 0


def limit_2proc(blob: str, offsets: str, n: int, decoder: str = "simplejpeg") -> tuple[int, float]:
    """The decode + crop loop over all ``n`` images split over 2 processes: ``(images, seconds)``.

    ``decoder``: "simplejpeg" (what chute.images decodes with: the limit) or "pillow".
    """
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_ready, range(2))  # started and warm before the clock
        start = time.perf_counter()
        parts = pool.map(_loop, [(blob, offsets, 0, n // 2, 0, decoder), (blob, offsets, n // 2, n, 0, decoder)], chunksize=1)
        seconds = time.perf_counter() - start
    return sum(p[0] for p in parts), seconds


def measure(config: str, data_dir: str, epochs: int) -> dict:
    """One W4 configuration in this process: samples/s over the steady state (after the first batch)."""
    import chute

    ds, blob, offsets = jpeg_dataset(data_dir)
    n = len(ds)
    from _results import cpu_seconds

    cpu0 = cpu_seconds()
    first_batch = None
    if config == "limit-1":
        torch.set_num_threads(1)
        samples, seconds = _loop((blob, offsets, 0, n, 0))
        first_batch = 0.0
    elif config in ("limit-2proc", "limit-2proc-pil"):
        samples, seconds = limit_2proc(blob, offsets, n, "pillow" if config.endswith("pil") else "simplejpeg")
        first_batch = 0.0
    else:
        if config == "torch-2":
            dataset = JpegBlobDataset(blob, offsets)
            made = time.perf_counter()
            loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=2)
            count = lambda b: len(b[1])  # noqa: E731
        else:
            kwargs = {"chute-2": dict(workers=2), "chute-auto": dict(),
                      "chute-proc2": dict(workers=chute.Workers("processes", count=2))}[config]
            made = time.perf_counter()
            loader = chute.Loader(ds, BATCH, shuffle=True, seed=0, transform=decode_sample, **kwargs)
            count = lambda b: len(b["label"])  # noqa: E731
        samples = 0
        steady_start = None
        for _ in range(epochs):
            for batch in loader:
                if steady_start is None:
                    steady_start = time.perf_counter()
                    first_batch = steady_start - made
                else:
                    samples += count(batch)
        seconds = time.perf_counter() - steady_start
        settings = None
        if config.startswith("chute"):
            report = loader.report(since="start").to_json()
            settings = report["settings"]
            loader.close()
    cpu = cpu_seconds() - cpu0
    jpeg_bytes = os.path.getsize(blob) / n
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "samples_per_s": samples / seconds,
        "mb_per_s": samples * jpeg_bytes / seconds / 1e6,
        "first_batch_s": first_batch,
        "cpu_s_per_1000": 1000 * cpu / max(1, samples),
        "peak_rss_mb": rss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "rss_per_epoch_mb": [rss],
    }
    if config.startswith("chute"):
        out["threads"] = settings["num_threads"]
        out["prefetch"] = settings["prefetch"]
    return out


def print_table(results: dict[str, dict], repeats: int) -> None:
    """The W4 table: images/s (best and median of the runs), ratios to the two-core limit and to the DataLoader.

    Ratios use the best run of each configuration: on a shared 2-core VM,
    another process only ever slows a run down, and a run on two cores is hit
    harder than a run on one, so the best of a few interleaved runs is the
    closest to what the machine can do.
    """
    best = {config: max(r["runs"]) for config, r in results.items()}
    limit, torch2 = best["limit-2proc"], best["torch-2"]
    names = {
        "limit-1": "simplejpeg decode loop, 1 core",
        "limit-2proc": "simplejpeg decode loop, 2 processes (the limit)",
        "limit-2proc-pil": "Pillow decode loop, 2 processes",
        "torch-2": "torch DataLoader, num_workers=2",
        "chute-2": "chute Loader, 2 threads",
        "chute-auto": "chute Loader, autotuned",
        "chute-proc2": "chute Loader, 2 processes",
    }
    print(f"\nW4 (20,000 JPEGs 256x256 -> random crop 224, batch {BATCH}; best and median of {repeats} interleaved runs; "
          "steady state after the first batch)")
    print(f"  {'config':38s} {'best/s':>8s} {'median/s':>9s} {'/limit':>7s} {'/torch':>7s} {'1st batch':>10s} {'CPU s/1k':>9s}  settings")
    for config, r in results.items():
        settings = f"threads {r['threads']:.0f}, prefetch {r['prefetch']:.0f}" if "threads" in r else ""
        print(
            f"  {names.get(config, config):38s} {best[config]:8,.0f} {r['samples_per_s']:9,.0f} {best[config] / limit:7.2f} "
            f"{best[config] / torch2:7.2f} {r['first_batch_s']:9.3f}s {r['cpu_s_per_1000']:9.3f}  {settings}"
        )
