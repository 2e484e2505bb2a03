"""Small sources generated in tmp_path for the converter tests (shared helpers)."""

from __future__ import annotations

import csv
import gzip
import io
import os
import pickle
import random

from PIL import Image


def ten_key_dict(rng: random.Random) -> dict[str, str]:
    """The "why does my DataLoader hang?" write-up's sample: ten random 5-digit-string keys to 5-digit-string values."""
    return {f"{rng.randrange(10**5):05d}": f"{rng.randrange(10**5):05d}" for _ in range(10)}


def write_pickle_index(root, n: int, seed: int = 0) -> tuple[str, list[dict[str, str]]]:
    """``root/index.csv`` (path, label, weight, name) and ``root/pickles/<i>.pkl.gz``; returns (index, dicts)."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "pickles"), exist_ok=True)
    dicts = []
    index = os.path.join(root, "index.csv")
    with open(index, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "weight", "name"])
        for i in range(n):
            sample = ten_key_dict(rng)
            dicts.append(sample)
            name = f"pickles/{i}.pkl.gz"
            with gzip.open(os.path.join(root, name), "wb") as out:
                pickle.dump(sample, out)
            writer.writerow([name, i % 3, i / 4, f"item-{i}"])
    return index, dicts


def image_bytes(fmt: str, seed: int, size=(8, 6)) -> bytes:
    """A small encoded image (JPEG/PNG) with random pixels."""
    rng = random.Random(seed)
    image = Image.new("RGB", size)
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(size[0] * size[1])])
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def no_dataset_at(path) -> bool:
    """Nothing valid at ``path``: no manifest (the writer commits by writing it last)."""
    return not os.path.exists(os.path.join(path, "manifest.json"))



def dict_sample(i: int, n: int, rng) -> dict:
    """The common layout: ``{"x": float32[3, s, s], "label": int, "id": str, "meta": {...}}``.

    ``x`` is 3x8x8 but for the last tenth of the samples (6x6: a shape that changes
    late), ``meta.note`` is missing in every fifth sample.
    """
    import numpy as np

    side = 8 if i < n - n // 10 else 6
    sample = {
        "x": np.asarray(rng.standard_normal((3, side, side)), dtype=np.float32),
        "label": int(rng.integers(0, 10)),
        "id": f"sample-{i:05d}",
        "meta": {"width": side, "source": {"camera": f"cam{i % 3}"}},
    }
    if i % 5 != 2:
        sample["meta"]["note"] = f"note {i}"
    return sample


def write_dict_index(root, n: int, seed: int = 0) -> tuple[str, list[dict]]:
    """``root/index.csv`` (one ``path`` column) and ``root/files/<i>.pkl.gz`` holding :func:`dict_sample` dicts."""
    import numpy as np

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    samples = []
    index = os.path.join(root, "index.csv")
    with open(index, "w", newline="") as f:
        f.write("path\n")
        for i in range(n):
            sample = dict_sample(i, n, rng)
            samples.append(sample)
            with gzip.open(os.path.join(root, "files", f"{i}.pkl.gz"), "wb") as out:
                pickle.dump(sample, out)
            f.write(f"files/{i}.pkl.gz\n")
    return index, samples
