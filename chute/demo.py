"""``chute demo``: the "why does my DataLoader hang?" dataset, read both ways.

MISSION.md section 1: a CSV index and one gzip-compressed pickle per sample
(each a dict of ten 5-digit-string keys to 5-digit-string values), read by a
map-style Dataset under ``DataLoader(batch_size=1, collate_fn=lambda b: b[0])``.
The demo generates that layout, converts it with ``chute convert``, checks that
every sample comes back identical, and times a random-order pass both ways.
"""

from __future__ import annotations

import csv
import gzip
import os
import pickle
import random
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import torch

from chute._sizes import format_size


class PickleFilesDataset(torch.utils.data.Dataset):
    """The write-up's Dataset: a CSV index of paths, one gzipped pickle per sample."""

    def __init__(self, index_csv: str) -> None:
        root = os.path.dirname(index_csv)
        with open(index_csv, newline="") as f:
            self.paths = [os.path.join(root, row["path"]) for row in csv.DictReader(f)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, str]:
        with gzip.open(self.paths[i], "rb") as f:
            return pickle.load(f)


def first(batch: list[Any]) -> Any:
    """``collate_fn=lambda b: b[0]`` from the write-up, as a function so ``spawn`` can pickle it."""
    return batch[0]


def generate(root: str, files: int, seed: int = 0) -> str:
    """Write ``files`` gzipped pickles of ten random 5-digit keys/values and a CSV index."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "pickles"), exist_ok=True)
    index = os.path.join(root, "index.csv")
    with open(index, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for i in range(files):
            sample = {f"{rng.randrange(10**5):05d}": f"{rng.randrange(10**5):05d}" for _ in range(10)}
            name = f"pickles/{i}.pkl.gz"
            with gzip.open(os.path.join(root, name), "wb") as out:
                pickle.dump(sample, out)
            writer.writerow([name, i % 10])
    return index


class ArrayDataset(torch.utils.data.Dataset):
    """The usual map-style Dataset over a .npy file of images and one of labels (memory-mapped)."""

    def __init__(self, images: str, labels: str) -> None:
        self.paths = (images, labels)
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(np.load(self.paths[1], mmap_mode="r"))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.arrays is None:  # mapped lazily, so each worker process maps the files itself
            self.arrays = tuple(np.load(p, mmap_mode="r") for p in self.paths)
        images, labels = self.arrays
        return {"image": torch.from_numpy(np.array(images[i])), "label": int(labels[i])}


def _learnable_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy uint8[3,32,32] images whose label (0-9) is their mean brightness bucket."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    base = (labels * 25 + 5).astype(np.int16)[:, None, None, None]
    noise = rng.integers(-20, 21, (n, 3, 32, 32), dtype=np.int16)
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels.astype(np.int64)


def _train(batches, steps: int, seed: int = 0) -> tuple[float, float, int]:
    """Train a tiny model for ``steps`` batches; return (seconds, mean loss of the last 50, samples seen)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(128, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses: list[float] = []
    seen = 0
    start = time.perf_counter()
    while len(losses) < steps:
        for batch in batches:
            images = batch["image"].float().div_(255)
            loss = torch.nn.functional.cross_entropy(model(images), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seen += len(images)
            if len(losses) == steps:
                break
    return time.perf_counter() - start, float(np.mean(losses[-50:])), seen


def train_comparison(root: str, steps: int = 300, workers: int = 2, rows: int = 20_000, batch_size: int = 128) -> dict[str, float]:
    """Train the same tiny model on the same images, fed by chute and by a torch DataLoader."""
    import chute

    images, labels = _learnable_images(rows)
    np.save(os.path.join(root, "images.npy"), images)
    np.save(os.path.join(root, "labels.npy"), labels)
    ds = chute.write(
        ({"image": im, "label": int(lb)} for im, lb in zip(images, labels)), os.path.join(root, "images-chute"), shard_size="16MB"
    )
    print(f"  training a tiny CNN for {steps} steps of {batch_size} images (uint8[3,32,32]) on the CPU, shuffled:")
    baseline = torch.utils.data.DataLoader(
        ArrayDataset(os.path.join(root, "images.npy"), os.path.join(root, "labels.npy")),
        batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True,
    )
    torch_s, torch_loss, seen = _train(baseline, steps)
    with chute.Loader(ds, batch_size, shuffle=True, seed=0, drop_last=True) as loader:
        chute_s, chute_loss, _ = _train(loader, steps)
    print(f"    torch DataLoader (num_workers={workers})  {_rate(seen, torch_s)}   loss (last 50 steps) {torch_loss:.3f}")
    print(f"    chute Loader                  {_rate(seen, chute_s)}   loss (last 50 steps) {chute_loss:.3f}   {torch_s / chute_s:6.1f}x")
    return {"train_torch": seen / torch_s, "train_chute": seen / chute_s}


def _rate(samples: int, seconds: float) -> str:
    return f"{samples / seconds:>12,.0f} samples/s"


def run_demo(files: int = 2000, workers: int | None = None, keep: bool = False, batch_size: int = 64, steps: int = 300) -> dict[str, float]:
    """Run the demo and print the comparison; returns the measured rates (samples/s)."""
    import chute
    from chute.sources import convert

    if workers is None:
        workers = os.cpu_count() or 1
    root = tempfile.mkdtemp(prefix="chute-demo-")
    try:
        print(f"chute demo: {files:,} per-sample .pkl.gz files plus a CSV index (MISSION.md section 1), in {root}")
        start = time.perf_counter()
        index = generate(root, files)
        print(f"  generated the files in {time.perf_counter() - start:.1f} s")

        start = time.perf_counter()
        ds = convert(index, os.path.join(root, "chute-dataset"), kind="index", allow_pickle=True, progress=False)
        print(
            f"  converted to a chute dataset ({len(ds.shards)} shard, {format_size(ds.nbytes)}) in "
            f"{time.perf_counter() - start:.1f} s: chute convert {index} DST --allow-pickle"
        )

        order = np.random.default_rng(0).permutation(files)
        baseline = PickleFilesDataset(index)
        loader = torch.utils.data.DataLoader(
            baseline,
            batch_size=1,
            num_workers=workers,
            collate_fn=first,
            sampler=order.tolist(),
            persistent_workers=False,
        )
        start = time.perf_counter()
        from_torch = list(loader)
        torch_s = time.perf_counter() - start

        start = time.perf_counter()
        from_chute: list[dict[str, str]] = []
        for a in range(0, files, batch_size):
            from_chute.extend(ds.get_batch(order[a : a + batch_size])["data"])
        chute_s = time.perf_counter() - start

        start = time.perf_counter()
        for i in order.tolist():
            ds[i]
        single_s = time.perf_counter() - start

        if from_chute != from_torch:
            raise chute.ChuteError("chute returned different samples than the pickle files: please report this as a bug")
        print(f"  read all {files:,} samples in a random order; every sample identical both ways")
        print(f"    torch DataLoader over the .pkl.gz files (num_workers={workers}, batch_size=1) {_rate(files, torch_s)}")
        print(f"    chute Dataset.get_batch, batches of {batch_size}, one thread           {_rate(files, chute_s)}   {torch_s / chute_s:6.1f}x")
        print(f"    chute Dataset[i], one sample at a time                        {_rate(files, single_s)}   {torch_s / single_s:6.1f}x")
        rates = {"torch": files / torch_s, "chute_batch": files / chute_s, "chute_single": files / single_s}
        rates.update(train_comparison(root, steps=steps, workers=workers))
        return rates
    finally:
        if keep:
            print(f"  kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
