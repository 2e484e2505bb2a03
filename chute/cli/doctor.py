"""``chute doctor [DATASET]``: what on this machine makes data loading slow or fail, and what to change."""

from __future__ import annotations

import argparse
import json

from chute.cli._args import at_least


def add(sub) -> None:
    p = sub.add_parser("doctor", help="check this machine for what makes data loading slow or fail, and what to change")
    p.add_argument("dataset", nargs="?", help="a chute dataset to check against (size, shards, remote backend)")
    p.add_argument("--cache-dir", default=None, help="the node cache directory to check (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--batch-size", type=at_least(1), default=256, help="for the /dev/shm estimate (default 256)")
    p.add_argument("--prefetch", type=at_least(1), default=None, help="for the /dev/shm estimate (default 2 per worker)")
    p.add_argument("--workers", type=at_least(1), default=None, help="worker processes, for the /dev/shm estimate (default: CPUs, at most 8)")
    p.add_argument("--seq-len", type=at_least(1), default=None, metavar="L",
                   help="a token dataset: size /dev/shm from sequences of L tokens (as training reads it), not documents")
    p.add_argument("--pack", choices=["concat", "documents"], default="concat", help="with --seq-len: the packing (default concat)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.tools import doctor

    dataset = None
    if args.dataset:
        from chute.storage.open import open_dataset

        dataset = open_dataset(args.dataset, cache_dir=args.cache_dir)
    env = doctor.gather(args.cache_dir)
    checks = doctor.check(env, dataset, batch_size=args.batch_size, prefetch=args.prefetch, workers=args.workers,
                          seq_len=args.seq_len, pack=args.pack)
    if args.json:
        print(json.dumps([c.to_json() for c in checks], indent=2))
    else:
        print(f"chute doctor{' ' + str(dataset.root) if dataset is not None else ''}")
        print(doctor.format_checks(checks))
    return doctor.exit_code(checks)
