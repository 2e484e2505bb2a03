"""``chute which DATASET --step N``: per rank, the documents and token ranges that fed step N (docs/tokens.md)."""

from __future__ import annotations

import argparse
import json

from chute.cli._args import at_least, table


def add(sub) -> None:
    p = sub.add_parser("which", help="list, per rank, the documents and token ranges that fed step N of a token dataset")
    p.add_argument("dataset", help="a token dataset (chute.tokens.write / chute convert --tokenizer)")
    p.add_argument("--step", type=at_least(0), required=True, help="the step (counted from the epoch's start)")
    p.add_argument("--batch-size", type=at_least(1), required=True, help="sequences per batch on each rank")
    p.add_argument("--seq-len", type=at_least(1), required=True, help="tokens per sequence")
    p.add_argument("--world-size", type=at_least(1), default=1, help="ranks (default 1)")
    p.add_argument("--pack", choices=["concat", "documents"], default="concat", help="packing mode (default concat)")
    p.add_argument("--epoch", type=at_least(0), default=0, help="the epoch (default 0)")
    p.add_argument("--seed", type=int, default=0, help="the loader's seed (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="the loader ran with shuffle=False")
    p.add_argument("--json", action="store_true", help="print the pieces as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.tokens.steps import which

    ranks = which(
        args.dataset, args.step, args.batch_size, seq_len=args.seq_len, pack=args.pack, world_size=args.world_size,
        epoch=args.epoch, shuffle=not args.no_shuffle, seed=args.seed,
    )
    if args.json:
        print(json.dumps([[piece.to_json() for piece in pieces] for pieces in ranks]))
        return 0
    rows = [["rank", "row", "sequence", "shard", "document", "tokens"]]
    for pieces in ranks:
        rows += [[str(p.rank), str(p.row), str(p.sequence), str(p.shard), str(p.document), f"[{p.start}, {p.stop})"] for p in pieces]
    print(table(rows))
    return 0
