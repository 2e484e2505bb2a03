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
  --stage none|thread|device|both    stages on threads of their own: an identity BatchStage(where="thread"),
                                     the device copy (device="cpu"), or both (default none)
  --profile PATH                     also write a cProfile of the timed pass starts (iter + first batch) to PATH
  --against DIR [--rounds 5] [--label TEXT]  before/after: alternate, round by round, a fresh process of this checkout's
                                     chute and one of the chute package in DIR (e.g. `git archive <commit> chute`
                                     unpacked there, with the built extensions copied in); medians of the rounds'
                                     medians, saved as table short_passes/<workers> (docs/benchmarks.md)

    python benchmarks/short_passes.py
    python benchmarks/short_passes.py --rows 1000 --dim 64 --batch 64 --passes 21
    python benchmarks/short_passes.py --profile /tmp/starts.prof && python -m pstats /tmp/starts.prof
    python benchmarks/short_passes.py --against /tmp/chute-before --rounds 5

A machine shared with other work moves these figures by several times from run
to run: compare two versions of chute within one run (``--against``), and say
how busy the machine was.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import chute

HERE = os.path.dirname(os.path.abspath(__file__))


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


def _identity(batch: dict) -> dict:
    return batch


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{statistics.median(ordered) * 1e3:7.2f} ms ({ordered[0] * 1e3:.2f}-{ordered[-1] * 1e3:.2f})"


def measure(args: argparse.Namespace) -> dict:
    """One process's figures: the medians (and min, max) of ``args.passes`` pass starts and whole passes."""
    with tempfile.TemporaryDirectory() as tmp:
        rows = ({"x": np.full(args.dim, i, np.float32), "id": i} for i in range(args.rows))
        ds = chute.write(rows, os.path.join(tmp, "ds"))
        extra: dict = {}
        if args.stage in ("thread", "both"):
            extra["stages"] = [chute.BatchStage(_identity, name="identity", where="thread")]
        if args.stage in ("device", "both"):
            extra["device"] = "cpu"
        with chute.Loader(ds, args.batch, shuffle=args.shuffle, seed=0, workers=args.workers, **extra) as loader:
            passes(loader, 1)  # the first pass: imports, the workers start
            profile = cProfile.Profile() if args.profile else None
            starts, wholes = passes(loader, args.passes, profile)
            if profile is not None:
                profile.dump_stats(args.profile)
            batches = len(loader)
    return {
        "chute": os.path.dirname(os.path.abspath(chute.__file__)), "batches": batches, "starts": starts, "wholes": wholes,
        "start_ms": statistics.median(starts) * 1e3, "whole_ms": statistics.median(wholes) * 1e3,
        "load": os.getloadavg()[0],
    }


def settings(args: argparse.Namespace, batches: int) -> str:
    return (f"dataset: {args.rows} rows of float32[{args.dim}] + int64 id; Loader(batch_size={args.batch}, "
            f"shuffle={args.shuffle}, workers={args.workers!r}{_stages(args.stage)}); {batches} batches a pass")


def _stages(stage: str) -> str:
    return {"none": "", "thread": ", stages=[a thread stage]", "device": ', device="cpu"',
            "both": ', stages=[a thread stage], device="cpu"'}[stage]


def against(args: argparse.Namespace, argv: list[str]) -> None:
    """Rounds of one fresh process each for this checkout and for ``args.against``, alternated; the table."""
    drop = {"--against": 1, "--rounds": 1, "--label": 1}
    child, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
        elif a in drop:
            skip = drop[a]
        else:
            child.append(a)
    versions = {"this": os.path.dirname(HERE), "against": os.path.abspath(args.against)}
    runs: dict[str, list[dict]] = {name: [] for name in versions}
    for r in range(args.rounds):
        for name, root in versions.items():
            env = {**os.environ, "PYTHONPATH": root}
            out = subprocess.run([sys.executable, __file__, *child, "--json"], env=env, capture_output=True, text=True,
                                 check=True, cwd=tempfile.gettempdir()).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{name} {runs[name][-1]['start_ms']:.2f} ms" for name in versions), file=sys.stderr)
    assert runs["this"][0]["chute"] != runs["against"][0]["chute"], "both runs imported the same chute"
    label = {"this": "chute (this checkout)", "against": args.label or f"chute at {args.against}"}
    rows = []
    for name in versions:
        starts = [run["start_ms"] for run in runs[name]]
        wholes = [run["whole_ms"] for run in runs[name]]
        rows.append({
            "label": label[name], "start_ms": statistics.median(starts), "start_min_ms": min(starts),
            "start_max_ms": max(starts), "whole_ms": statistics.median(wholes), "rounds": starts,
        })
    load = statistics.median(run["load"] for run in runs["this"])
    print(f"\n{settings(args, runs['this'][0]['batches'])}\niter(loader) to the first batch, passes 2-{args.passes + 1}: "
          f"medians over {args.rounds} alternated rounds of each round's median; load average {load:.1f} on {os.cpu_count()} CPUs")
    for row in rows:
        print(f"  {row['label']:40} first batch {row['start_ms']:6.2f} ms ({row['start_min_ms']:.2f}-{row['start_max_ms']:.2f}), "
              f"whole pass {row['whole_ms']:6.2f} ms")
    sys.path.insert(0, HERE)
    from _results import save

    title = f"{args.rows} x float32[{args.dim}], batch {args.batch}, workers={args.workers}{_stages(args.stage)}"
    save("short_passes", {args.workers + ("" if args.stage == "none" else f"-{args.stage}"): {
        "title": title,
        "columns": [["start_ms", "iter() to first batch, ms (median)", ".2f"], ["start_min_ms", "min ms", ".2f"],
                    ["start_max_ms", "max ms", ".2f"], ["whole_ms", "whole pass, ms (median)", ".2f"]],
        "rows": rows,
        "notes": f"passes 2-{args.passes + 1} of one Loader per process; the medians of {args.rounds} alternated rounds' "
                 f"medians (min, max: of the rounds); load average {load:.1f} on {os.cpu_count()} CPUs (a shared machine)",
    }})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--passes", type=int, default=21)
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--workers", choices=["threads", "processes"], default="threads")
    parser.add_argument("--stage", choices=["none", "thread", "device", "both"], default="none")
    parser.add_argument("--profile", metavar="PATH")
    parser.add_argument("--against", metavar="DIR")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", help="what the chute in --against DIR is (its row's label; default: the path)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        return against(args, sys.argv[1:])
    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"chute {chute.__version__} ({figures['chute']}), python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load average {figures['load']:.1f}\n{settings(args, figures['batches'])}\n"
        f"passes 2-{args.passes + 1}, medians of {args.passes} (min-max):\n"
        f"  iter(loader) to the first batch  {_ms(figures['starts'])}\n"
        f"  the whole pass                   {_ms(figures['wholes'])}"
    )


if __name__ == "__main__":
    main()
