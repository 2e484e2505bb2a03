"""Random-batch gather speed, one thread: chute's native gather vs the best way to copy the same rows.

Two shapes (docs/benchmarks.md):
  W2  200,000 uint8[3,32,32] images + int64 labels, batches of 256
  W3  2,000 float32 records of 1 MiB, batches of 8

For each: ``Dataset.read`` (one native call for every fixed-size column, into
reused output arrays; data in the page cache), and ``get_batch`` (the same,
into fresh tensors); the limit: for W2 numpy fancy indexing ``x[idx]`` of the
whole array held in RAM, for W3 the same rows read with ``os.preadv`` from the
page cache into a page-aligned buffer reused for every batch; and a torch
DataLoader over a numpy-memmap map-style Dataset with num_workers 0 and 2.
Every figure is the median of --repeats runs of the same batches.

    python benchmarks/gather.py                 # both shapes, data in ./bench-data
    python benchmarks/gather.py --only w2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import SHAPES, MemmapDataset, array_dataset  # noqa: E402


def timed(fn, batches: list[np.ndarray], repeats: int) -> float:
    """Median samples/s of ``fn`` over ``batches``, after one warm-up batch."""
    fn(batches[0])
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            fn(b)
        rates.append(sum(len(b) for b in batches) / (time.perf_counter() - start))
    return statistics.median(rates)


def dataloader_rate(path: str, label: bool, batch: int, samples: int, workers: int, repeats: int) -> float:
    ds = MemmapDataset(path, label)
    rates = []
    for _ in range(repeats):
        sampler = torch.randperm(len(ds))[:samples].tolist()
        loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
        start = time.perf_counter()
        for _ in loader:
            pass
        rates.append(samples / (time.perf_counter() - start))
    return statistics.median(rates)


def run(name: str, root: str, repeats: int) -> list[tuple[str, float, float]]:
    spec = SHAPES[name]
    ds, raw_path = array_dataset(name, root)
    raw = np.load(raw_path, mmap_mode="r")
    row_bytes = int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize + (8 if spec["label"] else 0)
    ram = np.array(raw)  # the in-RAM copy: the limit
    labels = np.arange(spec["rows"], dtype=np.int64)
    rng = np.random.default_rng(1)
    n_batches = max(20, min(2000, (512 << 20) // (row_bytes * spec["batch"])))
    batches = [rng.integers(0, spec["rows"], spec["batch"]) for _ in range(n_batches)]
    out = {"x": torch.empty((spec["batch"], *spec["shape"]), dtype=torch.from_numpy(ram[:1]).dtype)}
    if spec["label"]:
        out["label"] = torch.empty(spec["batch"], dtype=torch.int64)
    if spec["label"]:  # W2: numpy fancy indexing of the array in RAM
        def limit(b):
            ram[b], labels[b]

        results = [("numpy x[idx], whole array in RAM (the limit)", timed(limit, batches, repeats))]
    else:  # W3: the rows read from the page cache into one page-aligned buffer
        import mmap

        row = ram[0].nbytes
        aligned = mmap.mmap(-1, spec["batch"] * row)
        views = [memoryview(aligned)[i * row : (i + 1) * row] for i in range(spec["batch"])]
        fd = os.open(raw_path, os.O_RDONLY)
        header = raw.offset

        def limit(b):
            for view, i in zip(views, b.tolist()):
                os.preadv(fd, [view], header + i * row)

        results = [("os.preadv into an aligned buffer, page cache (the limit)", timed(limit, batches, repeats))]
    arrays = [t.numpy() for t in out.values()]
    results.append(("chute Dataset.read, reused outputs (the Loader's call)", timed(lambda b: ds.read(b, arrays), batches, repeats)))
    results.append(("chute get_batch, fresh tensors", timed(lambda b: ds.get_batch(b), batches, repeats)))
    dl_samples = min(spec["rows"], 50_000 if spec["label"] else 800)
    npy = os.path.join(root, f"{name}.npy")
    for workers in (0, 2):
        results.append((f"torch DataLoader, memmap Dataset, num_workers={workers}", dataloader_rate(npy, spec["label"], spec["batch"], dl_samples, workers, repeats)))
    return [(label, rate, rate * row_bytes / 1e6) for label, rate in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data", help="where to generate the datasets (reused across runs)")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append", help="run only this shape (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs")
    for name in args.only or sorted(SHAPES):
        spec = SHAPES[name]
        print(f"\n{name.upper()}: {spec['rows']:,} x {spec['dtype'].__name__}{list(spec['shape'])}, batch {spec['batch']}, median of {args.repeats}")
        results = run(name, args.data_dir, args.repeats)
        limit = results[0][1]
        best_dl = max(rate for label, rate, _ in results if "DataLoader" in label)
        print(f"  {'':58s} {'samples/s':>12s} {'MB/s':>9s} {'/limit':>7s} {'/best DL':>8s}")
        for label, rate, mbs in results:
            print(f"  {label:58s} {rate:12,.0f} {mbs:9,.0f} {rate / limit:7.2f} {rate / best_dl:8.1f}")


if __name__ == "__main__":
    main()
