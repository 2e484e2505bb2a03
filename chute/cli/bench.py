"""``chute bench DATASET``: a Loader measured on a dataset (throughput, time to first batch, per-stage utilisation)."""

from __future__ import annotations

import argparse

from chute.cli._args import add_transform, at_least, positive, transform_kwargs
from chute.errors import ChuteError


def add(sub) -> None:
    p = sub.add_parser("bench", help="measure a Loader on a dataset: throughput, time to first batch, per-stage utilisation")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--batch-size", type=at_least(1), default=256, help="samples per batch (default 256)")
    p.add_argument("--threads", type=at_least(1), default=None, help="worker threads (default: autotuned) or processes with --workers processes")
    p.add_argument("--workers", choices=["threads", "processes"], default="threads", help="worker kind (default threads)")
    p.add_argument("--prefetch", type=at_least(1), default=None, help="batches in flight (default: autotuned)")
    p.add_argument("--epochs", type=at_least(1), default=1, help="passes over the dataset (default 1; --seconds may end the run sooner)")
    p.add_argument("--seconds", type=positive, default=None, help="stop after this many seconds")
    p.add_argument("--no-shuffle", action="store_true", help="read in storage order")
    p.add_argument("--seq-len", type=at_least(1), default=None, metavar="L",
                   help="a token dataset: read it as sequences of L tokens (chute.tokens.sequences), as training reads it")
    p.add_argument("--pack", choices=["concat", "documents"], default=None, help="with --seq-len: the packing (default concat)")
    add_transform(p)
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="write throughput over time and stage utilisation (needs chute[plot])")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.tools import bench

    if args.plot:  # fail before the run, not after it
        _require_matplotlib()
    data = args.dataset
    if args.pack is not None and args.seq_len is None:
        raise ChuteError("--pack goes with --seq-len L (a token dataset read as sequences of L tokens)")
    if args.seq_len is not None:
        from chute.storage.open import open_dataset
        from chute.tokens import sequences

        data = sequences(open_dataset(args.dataset, cache_dir=args.cache_dir), args.seq_len, pack=args.pack or "concat")
    result = bench.run(
        data, batch_size=args.batch_size, num_threads=args.threads, workers=args.workers, prefetch=args.prefetch,
        epochs=args.epochs, seconds=args.seconds, shuffle=not args.no_shuffle, cache_dir=args.cache_dir,
        loader_kwargs=transform_kwargs(args),
    )
    if args.plot:
        bench.plot(result, args.plot)
    if args.json:
        print(bench.dumps(result))
        return 0
    print(result.summary())
    print()
    print(result.report_text)
    if args.plot:
        print(f"\nplot written to {args.plot}")
    return 0


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ChuteError("--plot needs matplotlib: pip install 'chute[plot]'")
