"""``chute which DATASET --step N``: per rank, the documents and token ranges that fed step N (docs/tokens.md)."""

from __future__ import annotations

import argparse
import json

from chute.cli._args import at_least, table
from chute.errors import ChuteError


def add(sub) -> None:
    p = sub.add_parser("which", help="list, per rank, the documents and token ranges that fed step N of a token dataset")
    p.add_argument("dataset", help="a token dataset (chute.tokens.write / chute convert --tokenizer)")
    p.add_argument("--step", type=at_least(0), required=True, help="the step (counted from the epoch's start)")
    p.add_argument("--seq-len", type=at_least(1), required=True, help="tokens per sequence")
    p.add_argument("--pack", choices=["concat", "documents"], default="concat", help="packing mode (default concat)")
    p.add_argument("--state", metavar="FILE", default=None,
                   help="a loader.state_dict() saved as JSON: the batch size, world size, shuffle, seed, epoch and position "
                        "come from it (instead of the options below)")
    p.add_argument("--batch-size", type=at_least(1), default=None, help="sequences per batch on each rank")
    p.add_argument("--world-size", type=at_least(1), default=None, help="ranks (default 1)")
    p.add_argument("--epoch", type=at_least(0), default=None, help="the epoch (default 0)")
    p.add_argument("--seed", type=at_least(0), default=None, help="the loader's seed (default 0)")
    p.add_argument("--shuffle", action="store_true", default=None, help="the loader ran with shuffle=True (default: not, as chute.Loader)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="the loader ran with shuffle=False (the default)")
    p.add_argument("--json", action="store_true", help="print the pieces as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.tokens.steps import which

    if args.state is not None:
        given = [f"--{n.replace('_', '-')}" for n in ("batch_size", "world_size", "epoch", "seed", "shuffle")
                 if getattr(args, n) is not None]
        if given:
            raise ChuteError(f"{', '.join(given)}: not with --state (the saved state has the loader's settings)")
        try:
            with open(args.state) as f:
                state = json.load(f)
        except (OSError, ValueError) as exc:
            raise ChuteError(f"--state {args.state}: cannot read it as a JSON state_dict ({exc})") from None
        ranks = which(state, args.step, data=args.dataset, seq_len=args.seq_len, pack=args.pack)
    else:
        if args.batch_size is None:
            raise ChuteError("--batch-size is needed (or --state FILE, a saved loader.state_dict())")
        ranks = which(
            args.dataset, args.step, args.batch_size, seq_len=args.seq_len, pack=args.pack, world_size=args.world_size,
            epoch=args.epoch, shuffle=args.shuffle, seed=args.seed,
        )
    if args.json:
        print(json.dumps([[piece.to_json() for piece in pieces] for pieces in ranks]))
        return 0
    kept = sorted({k for pieces in ranks for p in pieces for k in p.fields if k not in ("source_file", "source_line")})
    rows = [["rank", "row", "sequence", "shard", "document", "tokens"] + (["source"] if any(p.origin for r in ranks for p in r) else []) + kept]
    for pieces in ranks:
        for p in pieces:
            row = [str(p.rank), str(p.row), str(p.sequence), str(p.shard), str(p.document), f"[{p.start}, {p.stop})"]
            row += [p.origin or ""] if len(rows[0]) > 6 + len(kept) else []
            row += [json.dumps(p.fields.get(k)) for k in kept]
            rows.append(row)
    print(table(rows))
    return 0
