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


def _rate(samples: int, seconds: float) -> str:
    return f"{samples / seconds:>12,.0f} samples/s"


def run_demo(files: int = 2000, workers: int | None = None, keep: bool = False, batch_size: int = 64) -> dict[str, float]:
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
        return {"torch": files / torch_s, "chute_batch": files / chute_s, "chute_single": files / single_s}
    finally:
        if keep:
            print(f"  kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
