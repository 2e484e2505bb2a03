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
(robust to a load that changes during the run), "/ limit, CPU time" the same by
the thread CPU time each spent on the same batches (robust to a shared machine). Every figure is a median; the
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
from typing import Any, NamedTuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _torch  # noqa: E402
from _data import SHAPES, array_dataset  # noqa: E402
from _results import cpu_seconds, save  # noqa: E402
from tables import render  # noqa: E402


class Paired(NamedTuple):
    """One way to read, measured in turn with the others: medians over the rounds."""

    rate: float  # samples/s
    wall: float | None  # samples/s over the limit's in the same round (None: not alternated with it)
    cpu: float | None  # the limit's thread CPU time over this one's for the same batches, per round
    cpu_per_1000: float  # CPU s per 1000 samples (the process and its workers)


def interleaved(fns: list[tuple[str, Any]], batches: list[np.ndarray], repeats: int, pass_s: float) -> list[tuple[str, Paired]]:
    """Each ``fn`` over passes of ``batches`` (cycled to about ``pass_s`` seconds of the first fn), alternated in one process.

    Round-robin over ``repeats`` rounds, after one warm-up batch each; every ratio
    is to the first fn (the limit) in the same round, so a load that changes
    during the run moves both sides of it. The CPU-time ratio is the one to read on
    a shared machine: other processes stretch a pass's wall time, much less the
    CPU time its thread spends on the same work.
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
    limit_rate, limit_cpu = rates[fns[0][0]], cpu[fns[0][0]]
    out = []
    for label, r in rates.items():
        wall = [x / y for x, y in zip(r, limit_rate)]
        by_cpu = [y / x for x, y in zip(cpu[label], limit_cpu)]
        print(f"  {label[:60]:60s} / limit, wall: {' '.join(f'{x:.3f}' for x in wall)} | CPU time: {' '.join(f'{x:.3f}' for x in by_cpu)}", flush=True)
        out.append((label, Paired(statistics.median(r), statistics.median(wall), statistics.median(by_cpu),
                                  1000 * sum(cpu[label]) / (repeats * samples))))
    return out


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


def row_size(name: str) -> int:
    """Bytes of one row of shape ``name``, its label included."""
    spec = SHAPES[name]
    return int(np.prod(spec["shape"])) * np.dtype(spec["dtype"]).itemsize + (8 if spec["label"] else 0)


def run(name: str, root: str, repeats: int, pass_s: float, with_torch: bool = True) -> list[tuple[str, Paired]]:
    """Each way to read random batches of ``name``, with its figures."""
    spec = SHAPES[name]
    ds, raw_path = array_dataset(name, root)
    raw = np.load(raw_path, mmap_mode="r")
    row_bytes = row_size(name)
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
    results = interleaved(fns, batches, repeats, pass_s)
    dl_samples = min(spec["rows"], 50_000 if spec["label"] else 800)
    npy = os.path.join(root, f"{name}.npy")
    for config in _torch.CONFIGS if with_torch else []:
        rate, cpu = dataloader_rate(npy, spec["label"], spec["batch"], dl_samples, config, repeats)
        results.append((_torch.label(config), Paired(rate, None, None, cpu)))
    return results


def table(name: str, results: list[tuple[str, Paired]], repeats: int, pass_s: float, row_bytes: int) -> dict:
    spec = SHAPES[name]
    limit = results[0][1].rate
    best_dl = max((p.rate for label, p in results if "DataLoader" in label), default=float("nan"))
    rows = [{"label": label, "samples_per_s": p.rate, "mb_per_s": p.rate * row_bytes / 1e6, "cpu_s_per_1000": p.cpu_per_1000,
             "ratio_limit": p.rate / limit if p.wall is None else p.wall, "ratio_limit_cpu": p.cpu,
             "ratio_torch": p.rate / best_dl} for label, p in results]
    return {
        "title": f"{name.upper()}, batch {spec['batch']}",
        "columns": [["samples_per_s", "samples/s", ",.0f"], ["mb_per_s", "MB/s", ",.0f"],
                    ["cpu_s_per_1000", "CPU s / 1k samples", ".4f"], ["ratio_limit", "/ limit", ".2f"],
                    ["ratio_limit_cpu", "/ limit, CPU time", ".2f"], ["ratio_torch", "/ best torch", ".2f"]],
        "rows": rows,
        "notes": (f"the numpy and chute rows: one thread, passes of about {pass_s:g} s (the same batches) alternated in one "
                  f"process over {repeats} rounds; / limit: the median of each round's ratio of samples/s, / limit, CPU "
                  "time: of the limit's thread CPU time over the row's for the same batches; DataLoaders: median of "
                  f"{repeats} passes, persistent workers, a warm-up pass before the clock (worker start-up not timed), "
                  "/ limit of the medians; CPU s / 1k samples includes the worker processes"),
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
        results = run(name, args.data_dir, args.repeats, args.pass_s, not args.no_torch)
        tables[name] = table(name, results, args.repeats, args.pass_s, row_size(name))
        print(render(tables[name]))
    if not args.no_torch:
        save("gather", tables)


if __name__ == "__main__":
    main()
