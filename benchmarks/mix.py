"""Mixture overhead: W2 read through chute.mix of its two halves vs the same data as one dataset.

Two levels, each a median of --repeats runs with the ratio measured in the same run:

* order + gather: for one whole shuffled epoch, each batch's indices come from
  the order (``Order.batch`` for the dataset, ``MixOrder.batch`` for the mixture
  of the halves at weights 1:1) and are gathered with ``get_batch`` into reused
  buffers, one thread. Each run uses a new epoch (and a new order object), so
  the mixture's per-epoch planning is included.
* the Loader, default settings (autotuned threads): ``chute.Loader(ds, 256,
  shuffle=True)`` over each, 3 epochs a run, the rate of epochs 2-3 (the
  steady state; the first also starts the threads and maps the shards).

    python benchmarks/mix.py                     # data in ./bench-data (W2 reused from the other benchmarks)
    python benchmarks/mix.py --repeats 7 --batch 256

Results go to benchmarks/results/mix.json through benchmarks/_results.py: table "w2" (docs/benchmarks.md draws
it with benchmarks/tables.py).
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
from _data import SHAPES, array_dataset, warm  # noqa: E402
from _results import save  # noqa: E402

import chute  # noqa: E402
from chute.order import Order  # noqa: E402


def halves(root: str, raw: str) -> tuple[chute.Dataset, chute.Dataset]:
    """W2's first and second 100,000 rows as two datasets (written once)."""
    data = np.load(raw, mmap_mode="r")
    out = []
    for name, a, b in (("w2-half-a", 0, len(data) // 2), ("w2-half-b", len(data) // 2, len(data))):
        path = os.path.join(root, name)
        if not os.path.exists(os.path.join(path, "manifest.json")):
            chute.write(({"x": data[i], "label": i} for i in range(a, b)), path, overwrite=True)
        ds = chute.open(path)
        warm(ds)
        out.append(ds)
    return out[0], out[1]


def epoch(ds, order, epoch_number: int, out: dict) -> tuple[float, float]:
    """(samples/s, seconds spent in the order) for one epoch."""
    in_order = 0.0
    start = time.perf_counter()
    rows = 0
    for step in range(order.num_batches(1)):
        t = time.perf_counter()
        idx = order.batch(epoch_number, step)
        in_order += time.perf_counter() - t
        n = len(idx)
        ds.get_batch(idx, out={k: v[:n] for k, v in out.items()})
        rows += n
    return rows / (time.perf_counter() - start), in_order


def loader_rate(ds, batch: int, seed: int, epochs: int = 3) -> float:
    """Samples/s of a default Loader over ``ds`` in the epochs after the first."""
    loader = chute.Loader(ds, batch, shuffle=True, seed=seed)
    marks = []
    for _ in range(epochs):
        rows = 0
        for b in loader:
            rows += len(b["label"])
        marks.append((time.perf_counter(), rows))
    loader.close()
    return sum(r for _, r in marks[1:]) / (marks[-1][0] - marks[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=SHAPES["w2"]["batch"])
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    torch.set_num_threads(1)
    whole, raw = array_dataset("w2", args.data_dir)
    a, b = halves(args.data_dir, raw)
    mixture = chute.mix({"a": a, "b": b}, {"a": 1, "b": 1})
    out = {"x": torch.empty((args.batch, 3, 32, 32), dtype=torch.uint8), "label": torch.empty(args.batch, dtype=torch.int64)}
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads 1")
    print(f"W2 {len(whole):,} rows ({len(whole.shards)} shards) vs chute.mix of halves "
          f"({len(a.shards)} + {len(b.shards)} shards), weights 1:1, batch {args.batch}, shuffle, one epoch a run, median of {args.repeats}")
    rows = {"dataset": [], "mixture": [], "ratio": [], "order_s_dataset": [], "order_s_mixture": []}
    for run in range(args.repeats):
        single = Order(tuple(s.rows for s in whole.shards), args.batch, True, 0)
        mixed = mixture.order(args.batch, shuffle=True, seed=0)
        rate_d, order_d = epoch(whole, single, run, out)
        rate_m, order_m = epoch(mixture, mixed, run, out)
        rows["dataset"].append(rate_d)
        rows["mixture"].append(rate_m)
        rows["ratio"].append(rate_m / rate_d)
        rows["order_s_dataset"].append(order_d)
        rows["order_s_mixture"].append(order_m)
    med = {k: statistics.median(v) for k, v in rows.items()}
    gather = med
    print(f"  {'':40s} {'samples/s':>12s} {'order s/epoch':>14s}")
    print(f"  {'one dataset (Order)':40s} {med['dataset']:12,.0f} {med['order_s_dataset']:14.3f}")
    print(f"  {'chute.mix of the halves (MixOrder)':40s} {med['mixture']:12,.0f} {med['order_s_mixture']:14.3f}")
    print(f"  mixture / dataset, same run: median {med['ratio']:.2f} (runs: {', '.join(f'{r:.2f}' for r in rows['ratio'])})")

    ld = {"dataset": [], "mixture": [], "ratio": []}
    for run in range(args.repeats):
        d = loader_rate(whole, args.batch, run)
        m = loader_rate(mixture, args.batch, run)
        ld["dataset"].append(d)
        ld["mixture"].append(m)
        ld["ratio"].append(m / d)
    med = {k: statistics.median(v) for k, v in ld.items()}
    print(f"Loader, default settings (autotuned threads), batch {args.batch}, epochs 2-3 of 3, median of {args.repeats}")
    print(f"  {'chute.Loader(one dataset)':40s} {med['dataset']:12,.0f}")
    print(f"  {'chute.Loader(chute.mix of the halves)':40s} {med['mixture']:12,.0f}")
    print(f"  mixture / dataset, same run: median {med['ratio']:.2f} (runs: {', '.join(f'{r:.2f}' for r in ld['ratio'])})")
    save("mix", {"w2": {
        "title": f"W2, batch {args.batch}",
        "columns": [["dataset", "one dataset", ",.0f"], ["mixture", "`chute.mix` of the halves", ",.0f"],
                    ["ratio", "mixture / dataset (median of the per-run ratios)", ".2f"], ["runs_text", "per-run ratios", ""]],
        "rows": [
            {"label": "order + gather, one thread (`Order.batch`/`MixOrder.batch` + `get_batch` into reused buffers), samples/s",
             "dataset": gather["dataset"], "mixture": gather["mixture"], "ratio": gather["ratio"],
             "runs_text": ", ".join(f"{r:.2f}" for r in rows["ratio"]), "runs": rows},
            {"label": "the order alone, ms per epoch", "dataset": 1e3 * gather["order_s_dataset"],
             "mixture": 1e3 * gather["order_s_mixture"]},
            {"label": "`chute.Loader(ds, batch, shuffle=True)`, default (autotuned), epochs 2-3 of 3, samples/s",
             "dataset": med["dataset"], "mixture": med["mixture"], "ratio": med["ratio"],
             "runs_text": ", ".join(f"{r:.2f}" for r in ld["ratio"]), "runs": ld},
        ],
        "notes": (f"W2 ({len(whole):,} rows, {len(whole.shards)} shards) against `chute.mix` of its two halves "
                  f"({len(a.shards)} + {len(b.shards)} shards, weights 1:1), shuffled; medians of {args.repeats} runs, "
                  "ratios from the same run"),
    }})


if __name__ == "__main__":
    main()
