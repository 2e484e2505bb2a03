"""Random-batch gather speed, one thread: chute's native gather vs the best way to copy the same rows.

Two shapes (docs/benchmarks.md):
  W2  200,000 uint8[3,32,32] images + int64 labels, batches of 256
  W3  2,000 float32 records of 1 MiB, batches of 8

For each: ``Dataset.read`` (one native call for every fixed-size column, into
reused output arrays; data in the page cache), and ``get_batch`` (the same,
into fresh tensors); the limit: for W2 numpy fancy indexing ``x[idx]`` of the
whole array held in RAM, for W3 the same rows read with ``os.preadv`` from the
page cache into a page-aligned buffer reused for every batch; and a torch
DataLoader over the same .npy memmap, the four kinds of benchmarks/_torch.py
(per-sample and batch ``__getitem__``, num_workers 0 and N; persistent workers,
warmed up before the clock). The numpy and chute rows run in turn in one
process, passes of about --pass-s seconds (the same batches, cycled), round-robin
over --repeats rounds; "/ limit" is the median of each round's ratio to the limit
(robust to a load that changes during the run). Every figure is a median; the
tables go to benchmarks/results/gather.json.

    python benchmarks/gather.py                 # both shapes, data in ./bench-data
    python benchmarks/gather.py --only w2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _torch  # noqa: E402
from _data import SHAPES, array_dataset  # noqa: E402
from _results import cpu_seconds, save  # noqa: E402
from tables import render  # noqa: E402


def interleaved(fns: list[tuple[str, Any]], batches: list[np.ndarray], repeats: int, pass_s: float) -> list[tuple[str, tuple[float, float, float]]]:
    """Each ``fn`` over passes of ``batches`` (cycled to about ``pass_s`` seconds of the first fn), alternated in one process.

    Round-robin over ``repeats`` rounds, after one warm-up batch each. Returns, per fn,
    (median samples/s, median ratio to the first fn in the same round, CPU s per
    1000 samples): the ratio pairs passes measured a moment apart, so a load that
    changes during the run moves both.
    """
    for _, fn in fns:
        fn(batches[0])
    start = time.perf_counter()
    for b in batches:
        fns[0][1](b)
    per_batch = (time.perf_counter() - start) / len(batches)
    count = max(len(batches), round(pass_s / per_batch))
    plan = [batches[i % len(batches)] for i in range(count)]
    samples = sum(len(b) for b in plan)
    rates: dict[str, list[float]] = {label: [] for label, _ in fns}
    cpu: dict[str, list[float]] = {label: [] for label, _ in fns}
    for _ in range(repeats):
        for label, fn in fns:
            cpu0, start = time.thread_time(), time.perf_counter()
            for b in plan:
                fn(b)
            rates[label].append(samples / (time.perf_counter() - start))
            cpu[label].append(time.thread_time() - cpu0)
    first_rate, first_cpu = rates[fns[0][0]], cpu[fns[0][0]]
    for label in rates:
        print(f"  {label[:60]:60s} wall ratios {' '.join(f'{x / y:.3f}' for x, y in zip(rates[label], first_rate))}"
              f" | CPU ratios {' '.join(f'{y / x:.3f}' for x, y in zip(cpu[label], first_cpu))}", flush=True)
    return [(label, (statistics.median(r), statistics.median(y / x for x, y in zip(cpu[label], first_cpu)),
                     1000 * sum(cpu[label]) / (repeats * samples)))
            for label, r in rates.items()]


def dataloader_rate(path: str, label: bool, batch: int, samples: int, config: str, repeats: int) -> tuple[float, float]:
    """A torch DataLoader (benchmarks/_torch.py) reading ``samples`` random rows per pass.

    Its workers are persistent and a warm-up pass runs first: worker start-up is
    not timed. Returns (median samples/s, CPU s per 1000 samples, workers included).
    """
    loader = _torch.memmap_loader(path, label, batch, config, num_samples=samples)
    for _ in loader:  # warm-up: starts the workers, maps the file in each
        pass
    rates = []
    cpu0 = cpu_seconds()
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in loader:
            pass
        rates.append(samples / (time.perf_counter() - start))
    cpu = cpu_seconds() - cpu0
    del loader
    return statistics.median(rates), 1000 * cpu / (repeats * samples)


def run(name: str, root: str, repeats: int, pass_s: float, with_torch: bool = True) -> list[tuple[str, float, float, float, float | None]]:
    """(label, samples/s, MB/s, CPU s per 1000 samples, ratio to the limit in the same round or None) of each way
    to read random batches of ``name``."""
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
    arrays = [t.numpy() for t in out.values()]
    fns: list[tuple[str, Any]] = []
    if spec["label"]:  # W2: numpy fancy indexing of the array in RAM
        def limit(b):
            ram[b], labels[b]

        def limit_out(b):
            np.take(ram, b, axis=0, out=arrays[0], mode="clip")
            np.take(labels, b, out=arrays[1], mode="clip")

        fns.append(("numpy x[idx], whole array in RAM (the limit)", limit))
        fns.append(("numpy np.take(x, idx, out=, mode='clip') into reused outputs, in RAM", limit_out))
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

        fns.append(("os.preadv into an aligned buffer, page cache (the limit)", limit))
    fns.append(("chute Dataset.read, reused outputs (the Loader's call)", lambda b: ds.read(b, arrays)))
    fns.append(("chute get_batch, fresh tensors", lambda b: ds.get_batch(b)))
    results: list[tuple[str, tuple[float, float | None, float]]] = list(interleaved(fns, batches, repeats, pass_s))
    dl_samples = min(spec["rows"], 50_000 if spec["label"] else 800)
    npy = os.path.join(root, f"{name}.npy")
    for config in _torch.CONFIGS if with_torch else []:
        rate, cpu = dataloader_rate(npy, spec["label"], spec["batch"], dl_samples, config, repeats)
        results.append((_torch.label(config), (rate, None, cpu)))
    return [(label, rate, rate * row_bytes / 1e6, cpu, ratio) for label, (rate, ratio, cpu) in results]


def table(name: str, results: list[tuple[str, float, float, float, float | None]], repeats: int, pass_s: float) -> dict:
    spec = SHAPES[name]
    limit = results[0][1]
    best_dl = max((rate for label, rate, _, _, _ in results if "DataLoader" in label), default=float("nan"))
    rows = [{"label": label, "samples_per_s": rate, "mb_per_s": mbs, "cpu_s_per_1000": cpu,
             "ratio_limit": rate / limit if paired is None else paired, "ratio_torch": rate / best_dl}
            for label, rate, mbs, cpu, paired in results]
    return {
        "title": f"{name.upper()}, batch {spec['batch']}",
        "columns": [["samples_per_s", "samples/s", ",.0f"], ["mb_per_s", "MB/s", ",.0f"],
                    ["cpu_s_per_1000", "CPU s / 1k samples", ".4f"], ["ratio_limit", "/ limit", ".2f"],
                    ["ratio_torch", "/ best torch", ".2f"]],
        "rows": rows,
        "notes": (f"median of {repeats} passes; the numpy and chute rows: one thread, passes of about {pass_s:g} s "
                  "alternated in one process, / limit the median of each round's ratio; DataLoaders with persistent "
                  "workers and a warm-up pass before the clock (worker start-up not timed); CPU s / 1k samples "
                  "includes the worker processes"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data", help="where to generate the datasets (reused across runs)")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append", help="run only this shape (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pass-s", type=float, default=1.0, help="seconds of one pass of the numpy and chute rows (default 1)")
    parser.add_argument("--no-torch", action="store_true", help="leave out the DataLoader rows (a trial run; not saved)")
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs")
    tables = {}
    for name in args.only or sorted(SHAPES):
        spec = SHAPES[name]
        print(f"\n{name.upper()}: {spec['rows']:,} x {spec['dtype'].__name__}{list(spec['shape'])}, batch {spec['batch']}, median of {args.repeats}")
        tables[name] = table(name, run(name, args.data_dir, args.repeats, args.pass_s, not args.no_torch), args.repeats, args.pass_s)
        print(render(tables[name]))
    if not args.no_torch:
        save("gather", tables)


if __name__ == "__main__":
    main()
