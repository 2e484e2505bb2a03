"""Random-batch gather speed: chute's get_batch vs numpy in RAM vs a torch DataLoader.

Two shapes (docs/benchmarks.md):
  W2  200,000 uint8[3,32,32] images + int64 labels, batches of 256
  W3  2,000 float32 records of 1 MiB, batches of 8

For each: chute ``Dataset.get_batch`` with reused output buffers on 1 and 2 torch
threads (data in the page cache), numpy fancy indexing of the same data held in
RAM (the limit), and a torch DataLoader over a numpy-memmap map-style Dataset with
num_workers 0 and 2. Every figure is the median of --repeats runs.

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
    ram_out = np.empty((spec["batch"], *spec["shape"]), dtype=spec["dtype"])

    def numpy_take(b):
        np.take(ram, b, axis=0, out=ram_out)
        if spec["label"]:
            labels[b]

    results = [("numpy fancy indexing, in RAM (limit)", timed(numpy_take, batches, repeats))]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append((f"chute get_batch, torch threads={threads}", timed(lambda b: ds.get_batch(b, out=out), batches, repeats)))
    torch.set_num_threads(os.cpu_count() or 1)
    grouped = [np.sort(b) for b in batches]  # indices grouped by shard, as a shuffle window of shards yields them
    torch.set_num_threads(1)
    results.append(("chute get_batch, indices grouped by shard, threads=1", timed(lambda b: ds.get_batch(b, out=out), grouped, repeats)))
    torch.set_num_threads(os.cpu_count() or 1)
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
