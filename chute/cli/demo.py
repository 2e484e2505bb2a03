"""``chute demo``: a many-small-pickles dataset converted, checked and read with chute and with torch DataLoaders."""

from __future__ import annotations

import argparse

from chute.cli._args import at_least


def add(sub) -> None:
    p = sub.add_parser("demo", help="generate a many-small-pickles dataset, convert it, and compare reading it with chute vs a torch DataLoader")
    p.add_argument("--files", type=at_least(1), default=2000, help="number of per-sample .pkl.gz files to generate (default 2000)")
    p.add_argument("--workers", type=at_least(0), default=None, help="num_workers of the multi-process DataLoader baseline, also run at 0 (default: CPU count)")
    p.add_argument("--steps", type=at_least(1), default=60, help="training steps per run of the tiny-model comparison (default 60)")
    p.add_argument("--runs", type=at_least(1), default=5, help="timed runs of each contender; medians are printed (default 5)")
    p.add_argument("--model-threads", type=at_least(1), default=None,
                   help="torch intra-op threads of the training comparison's model, the same in every row (default: half the CPUs)")
    p.add_argument("--keep", action="store_true", help="keep the generated files and dataset")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.demo import run_demo

    run_demo(files=args.files, workers=args.workers, keep=args.keep, steps=args.steps, runs=args.runs,
             model_threads=args.model_threads)
    return 0
