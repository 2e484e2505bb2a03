"""Worker processes over a remote dataset: batches from the node cache against the same dataset on local disk.

    python benchmarks/remote_processes.py [--rows 120000] [--epochs 6] [--rounds 3] [--workers 2]

``workers="processes"`` is for transforms that hold the GIL. Over a remote
dataset the main process downloads and holds the shards; each worker maps the
shards of its batches from the node cache as a guest of that hold and keeps
them mapped until the main process lets go of them (docs/remote.md). This
measures what that costs: one dataset (``--rows`` rows of a 1 KiB float32
vector, an int and a short string, 2 MiB shards) read by
``chute.Loader(batch_size=256, shuffle=True, transform=<per-sample Python>,
workers=chute.Workers("processes", count=W))``

* from local disk (the reference: nothing to download or hold);
* over HTTP (a real server process on 127.0.0.1) through a node cache that holds
  the whole dataset, after a first epoch filled it (every later epoch reads the
  cache: the cost of holding and mapping alone);
* over HTTP through a cache limited to 25% of the dataset (every epoch
  downloads again).

Every configuration runs ``--epochs`` epochs in one Loader, ``--rounds`` times
(the configurations in turn); the first epoch of each Loader (worker start, cold
cache) is left out and the median of the others is reported, with its ratio to
the local reference measured in the same run. Saved to
benchmarks/results/remote_processes.json (table "epochs").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from _results import save  # noqa: E402

import chute  # noqa: E402
from tests.servers import HTTPServerProcess  # noqa: E402

BATCH = 256
SHARD = 2 << 20


def touch(sample: dict) -> dict:
    """A per-sample transform in pure Python (holds the GIL: the reason to use worker processes)."""
    sample["y"] = sample["y"] + 1
    return sample


def make(root: str, rows: int) -> chute.Dataset:
    if os.path.exists(os.path.join(root, "manifest.json")):
        ds = chute.open(root)
        if len(ds) == rows:
            return ds
        shutil.rmtree(root)
    return chute.write(({"x": np.full(256, i, np.float32), "y": i, "t": f"s{i}"} for i in range(rows)), root, shard_size=SHARD)


def epochs(ds: chute.Dataset, n: int, workers: int) -> list[float]:
    """Samples/s of each of ``n`` epochs of one Loader."""
    loader = chute.Loader(ds, BATCH, shuffle=True, seed=0, transform=touch, workers=chute.Workers("processes", count=workers))
    out = []
    try:
        for epoch in range(n):
            loader.set_epoch(epoch)
            start = time.perf_counter()
            rows = sum(len(batch["y"]) for batch in loader)
            out.append(rows / (time.perf_counter() - start))
    finally:
        loader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("CHUTE_BENCH_DATA", os.path.join(tempfile.gettempdir(), "chute-bench")))
    parser.add_argument("--rows", type=int, default=120_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    local = make(os.path.join(args.data, "remote-processes", "ds"), args.rows)
    work = tempfile.mkdtemp(prefix="chute-remote-processes-")
    www = os.path.join(work, "www")
    os.makedirs(www)
    shutil.copytree(local.root, os.path.join(www, "ds"), copy_function=os.link)
    server = HTTPServerProcess(www).start()
    url = server.url.rstrip("/") + "/ds"
    rows = []
    try:
        configs = [("local disk", lambda: local), ("HTTP, cache holds the dataset", lambda: chute.open(
            url, cache_dir=os.path.join(work, "cache-all"), cache_limit=2 * local.nbytes))]
        configs.append(("HTTP, cache 25% of the dataset", lambda: chute.open(
            url, cache_dir=os.path.join(work, "cache-25"), cache_limit=local.nbytes // 4)))
        measured: dict[str, list[list[float]]] = {label: [] for label, _ in configs}
        for round_ in range(args.rounds):  # the configurations in turn, so that a slower spell of the machine hits each
            for label, opened in configs:
                ds = opened()
                rates = epochs(ds, args.epochs, args.workers)
                if ds is not local:
                    ds.close()
                measured[label].append(rates)
                print(f"round {round_ + 1}, {label}: epochs {[round(r) for r in rates]} samples/s", flush=True)
        reference = statistics.median(r for rates in measured[configs[0][0]] for r in rates[1:])
        for label, runs in measured.items():
            median = statistics.median(r for rates in runs for r in rates[1:])
            row = {"label": f"{label}, {args.workers} processes", "samples_per_s": median, "ratio_local": median / reference,
                   "first_epoch": statistics.median(rates[0] for rates in runs), "epochs": runs}
            rows.append(row)
            print(f"{row['label']}: {median:,.0f} samples/s ({median / reference:.2f}x local); first epoch {row['first_epoch']:,.0f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    save("remote_processes", {"epochs": {
        "title": f"{len(local):,} rows ({local.nbytes / 1e6:,.0f} MB, {len(local.shards)} shards), batch {BATCH}",
        "columns": [["samples_per_s", "samples/s", ",.0f"], ["ratio_local", "/ local disk", ".2f"],
                    ["first_epoch", "first epoch samples/s", ",.0f"]],
        "rows": rows,
        "notes": f"shuffled (default window), a per-sample Python transform, workers=chute.Workers('processes', "
                 f"count={args.workers}); medians of epochs 2-{args.epochs} of one Loader over {args.rounds} rounds (the first epoch: "
                 "worker start, cold cache)",
    }})


if __name__ == "__main__":
    main()
