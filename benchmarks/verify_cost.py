"""What checking shards on read costs: the first epoch with ``verify=True`` vs ``verify=False``.

    python benchmarks/verify_cost.py [--runs 5] [--rows 100000] [--data DIR]

With ``verify=True`` a shard's checksum is computed the first time a machine
reads it (the file read in 8 MiB chunks) and remembered by a marker file in
chute's cache directory; its Arrow structure is checked once per process,
always. So the checksum's cost falls on the first epoch ever read on a machine.
Every run here is a fresh process with a fresh, empty chute cache directory
(``CHUTE_CACHE_DIR``: no markers), reading one shuffled epoch from the page
cache (the data is read once beforehand), which is the worst case for the
check: nothing else (disk, network) hides it. Runs of
the two settings alternate; the script prints the median epoch time of each,
their ratio, and the time of ``Dataset.verify()`` (a full check of every
shard: checksum, schema, rows, structure) against the median unverified epoch.

Two datasets: fixed-size tensors (uint8[3,32,32] + an int64 label, W2's shape)
and variable columns (a string, a map, a JSON value and a ragged array per row).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _data import warm  # noqa: E402
from _results import save  # noqa: E402

import chute  # noqa: E402


def make(root: str, kind: str, rows: int) -> str:
    path = os.path.join(root, f"verify-{kind}-{rows}")
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    rng = np.random.default_rng(0)
    if kind == "tensors":
        images = rng.integers(0, 255, (rows, 3, 32, 32), dtype=np.uint8)
        samples = ({"image": images[i], "label": i} for i in range(rows))
    else:
        samples = ({"text": f"sample {i} " + "x" * (i % 40), "tags": {f"k{j}": str(j) for j in range(i % 5)},
                    "meta": {"id": i, "score": i / 3}, "seq": np.arange(i % 16, dtype=np.int32)} for i in range(rows))
    chute.write(samples, path, shard_size="32MB", overwrite=True)
    return path


def epoch(path: str, verify: bool, batch: int) -> float:
    """One shuffled epoch in this process; its seconds."""
    ds = chute.open(path, verify=verify)
    loader = chute.Loader(ds, batch, shuffle=True, seed=0)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "chute-bench"))
    parser.add_argument("--child", nargs=2, metavar=("PATH", "VERIFY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(epoch(args.child[0], args.child[1] == "1", args.batch)))
        return
    os.makedirs(args.data, exist_ok=True)
    print(f"settings: {args.runs} runs per setting, {args.rows:,} rows, batch {args.batch}, shuffled, threads: "
          "chute's default (autotuned), data in the page cache, 32 MB shards; one fresh process per epoch")
    rows = []
    for kind in ("tensors", "variable"):
        path = make(args.data, kind, args.rows)
        ds = chute.open(path)
        warm(ds)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.runs):
            for verify in (False, True):
                with tempfile.TemporaryDirectory() as fresh:  # no checksum remembered from an earlier run
                    out = subprocess.run([sys.executable, __file__, "--batch", str(args.batch), "--child", path, "1" if verify else "0"],
                                         capture_output=True, text=True, check=True, env=dict(os.environ, CHUTE_CACHE_DIR=fresh))
                times[verify].append(json.loads(out.stdout.strip().splitlines()[-1]))
        full = []
        for _ in range(args.runs):
            start = time.perf_counter()
            chute.open(path).verify()
            full.append(time.perf_counter() - start)
        bare, checked, whole = (statistics.median(times[False]), statistics.median(times[True]), statistics.median(full))
        print(f"{kind:9s} {ds.nbytes / 2**20:7.1f} MiB in {len(ds.shards)} shards: first epoch {bare:6.3f} s unverified, "
              f"{checked:6.3f} s verified (x{checked / bare:.2f}); Dataset.verify() {whole:6.3f} s (x{whole / bare:.2f} of an epoch)")
        rows.append({
            "label": (f"W2-shaped tensors, {ds.nbytes / 2**20:.1f} MiB in {len(ds.shards)} shards" if kind == "tensors" else
                      f"variable columns (string, map, JSON, ragged), {ds.nbytes / 2**20:.1f} MiB in {len(ds.shards)} shards"),
            "bare_s": bare, "verified_s": checked, "ratio": checked / bare, "verify_call_s": whole,
        })
    save("verify_cost", {"epoch": {
        "title": f"{args.rows:,} rows, batch {args.batch}, page cache",
        "columns": [["bare_s", "first epoch, verify=False, s", ".3f"], ["verified_s", "first epoch, verify=True, s", ".3f"],
                    ["ratio", "verified / not", ".2f"], ["verify_call_s", "Dataset.verify() s", ".3f"]],
        "rows": rows,
        "notes": (f"median of {args.runs} runs; each epoch in a fresh process with an empty chute cache directory, so every "
                  "run pays the checksums (the worst case: once per machine and file otherwise)"),
    }})


if __name__ == "__main__":
    main()
