"""Benchmark datasets, generated once into a data directory and reused.

W1  per-sample .pkl.gz dicts + CSV index (and its chute conversion)
W2  200,000 uint8[3,32,32] images + int64 labels
W3  2,000 float32 records of 1 MiB
"""

from __future__ import annotations

import os

import numpy as np

import chute

SHAPES = {
    "w2": dict(rows=200_000, shape=(3, 32, 32), dtype=np.uint8, batch=256, label=True),
    "w3": dict(rows=2_000, shape=(262_144,), dtype=np.float32, batch=8, label=False),
}


def warm(ds: chute.Dataset) -> None:
    """Read every shard once so the data is in the page cache."""
    for i in range(len(ds.shards)):
        with open(ds.shard_path(i), "rb") as f:
            while f.read(64 << 20):
                pass


def array_dataset(name: str, root: str) -> tuple[chute.Dataset, str]:
    """The chute dataset of shape ``name`` and the path of a raw .npy copy of its data."""
    spec = SHAPES[name]
    path = os.path.join(root, name)
    raw = os.path.join(root, f"{name}.npy")
    os.makedirs(root, exist_ok=True)
    if not os.path.exists(raw):
        rng = np.random.default_rng(0)
        data = np.lib.format.open_memmap(raw + ".tmp.npy", mode="w+", dtype=spec["dtype"], shape=(spec["rows"], *spec["shape"]))
        for a in range(0, spec["rows"], 10_000):
            chunk = data[a : a + 10_000]
            chunk[...] = rng.integers(0, 255, chunk.shape) if spec["dtype"] == np.uint8 else rng.standard_normal(chunk.shape)
        data.flush()
        del data
        os.replace(raw + ".tmp.npy", raw)
    if not os.path.exists(os.path.join(path, "manifest.json")):
        data = np.load(raw, mmap_mode="r")
        samples = ({"x": data[i], "label": i} if spec["label"] else {"x": data[i]} for i in range(spec["rows"]))
        chute.write(samples, path, overwrite=True)
    ds = chute.open(path)
    warm(ds)
    return ds, raw


def pickle_dataset(root: str, files: int = 20_000) -> tuple[chute.Dataset, str]:
    """W1: the chute conversion of ``files`` per-sample pickles, and the CSV index of the originals."""
    from chute.demo import generate
    from chute.sources import convert

    base = os.path.join(root, f"w1-{files}")
    index = os.path.join(base, "index.csv")
    if not os.path.exists(index):
        generate(base + ".tmp", files)
        os.replace(base + ".tmp", base)
    path = os.path.join(root, f"w1-{files}-chute")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        convert(index, path, kind="index", allow_pickle=True, progress=False, overwrite=True)
    ds = chute.open(path)
    warm(ds)
    return ds, index


from _torch import MemmapDataset  # noqa: E402,F401  (kept here for older imports)
