"""A pass start on a Loader that has run before: ``iter(loader)`` to the first batch, on passes 2 and later.

A validation pass or a small dataset runs many short passes over one Loader;
each pays the pass start (the rows of the epoch, the fused task, the channel,
the workers bound to the pass, the first steps submitted) before its first
batch. This script times, in one process, from ``iter(loader)`` to holding the
first batch, for every pass after the first (which imports and starts the
workers), and the whole pass; then prints medians with min-max.

  --rows 1000 --dim 64 --batch 64    the dataset: rows of float32[dim] and an int64 id, in one shard
  --passes 21                        passes timed (after one warm-up pass)
  --shuffle / --no-shuffle           shuffled passes (default) or the dataset order
  --workers threads|processes        the Loader's workers (default threads, autotuned)
  --profile PATH                     also write a cProfile of the timed pass starts (iter + first batch) to PATH

    python benchmarks/short_passes.py
    python benchmarks/short_passes.py --rows 1000 --dim 64 --batch 64 --passes 21
    python benchmarks/short_passes.py --profile /tmp/starts.prof && python -m pstats /tmp/starts.prof

A machine shared with other work moves these figures by several times from run
to run: compare two versions of chute within one run of each, on a quiet
machine, and say which.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import chute


def passes(loader: chute.Loader, count: int, profile: cProfile.Profile | None = None) -> tuple[list[float], list[float]]:
    """``(first-batch seconds, whole-pass seconds)`` of ``count`` passes over ``loader``."""
    starts, wholes = [], []
    clock = time.perf_counter
    for _ in range(count):
        if profile is not None:
            profile.enable()
        began = clock()
        it = iter(loader)
        next(it)
        first = clock()
        if profile is not None:
            profile.disable()
        for _ in it:
            pass
        starts.append(first - began)
        wholes.append(clock() - began)
    return starts, wholes


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered) * 1e3:7.2f} ms ({ordered[0] * 1e3:.2f}-{ordered[-1] * 1e3:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--passes", type=int, default=21)
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--workers", choices=["threads", "processes"], default="threads")
    parser.add_argument("--profile", metavar="PATH")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = ({"x": np.full(args.dim, i, np.float32), "id": i} for i in range(args.rows))
        ds = chute.write(rows, os.path.join(tmp, "ds"))
        with chute.Loader(ds, args.batch, shuffle=args.shuffle, seed=0, workers=args.workers) as loader:
            passes(loader, 1)  # the first pass: imports, the workers start
            profile = cProfile.Profile() if args.profile else None
            starts, wholes = passes(loader, args.passes, profile)
            if profile is not None:
                profile.dump_stats(args.profile)
            batches = len(loader)
    print(
        f"chute {chute.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
        f"dataset: {args.rows} rows of float32[{args.dim}] + int64 id; Loader(batch_size={args.batch}, "
        f"shuffle={args.shuffle}, workers={args.workers!r}); {batches} batches a pass\n"
        f"passes 2-{args.passes + 1}, medians of {args.passes} (min-max):\n"
        f"  iter(loader) to the first batch  {_ms(starts)}\n"
        f"  the whole pass                   {_ms(wholes)}"
    )


if __name__ == "__main__":
    main()
