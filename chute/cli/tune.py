"""``chute tune DATASET``: the autotuner run against a simulated training step; the settings it finds, and why."""

from __future__ import annotations

import argparse

from chute.cli._args import add_transform, at_least, non_negative, positive, transform_kwargs


def add(sub) -> None:
    p = sub.add_parser("tune", help="run the autotuner against a simulated training step and print the settings it finds, and why")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--step-ms", type=non_negative, default=10.0, help="simulated training step per batch, in ms (default 10)")
    p.add_argument("--batch-size", type=at_least(1), default=256, help="samples per batch (default 256)")
    p.add_argument("--seconds", type=positive, default=20.0, help="how long to run (default 20)")
    p.add_argument("--max-threads", type=at_least(1), default=None, help="the most threads the autotuner may run (default: 4 per usable CPU, at least 16; "
                        "it also stops when the CPU used fills the usable CPUs)")
    add_transform(p)
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.tools import bench

    result = bench.run(
        args.dataset, batch_size=args.batch_size, num_threads=None, max_count=args.max_threads or None, epochs=None, seconds=args.seconds,
        step_ms=args.step_ms, shuffle=True, cache_dir=args.cache_dir, loader_kwargs=transform_kwargs(args),
    )
    if args.json:
        print(bench.dumps(result))
        return 0
    print(f"chute tune {result.dataset}: batch {result.batch_size}, simulated step {args.step_ms:g} ms, {result.elapsed_s:.1f} s")
    print(bench.tune_text(result))
    return 0
