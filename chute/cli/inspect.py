"""``chute inspect DATASET``: a dataset's schema, rows, shards, sizes and checksums (``--verify`` checks them)."""

from __future__ import annotations

import argparse
import json
import sys

from chute._sizes import format_size
from chute.cli._args import table


def add(sub) -> None:
    p = sub.add_parser("inspect", help="show a dataset's schema, rows, shards, sizes and checksums")
    p.add_argument("dataset")
    p.add_argument("--verify", action="store_true", help="check every shard's size and checksum (exit 1 if any fails)")
    p.add_argument("--all", action="store_true", help="list every shard, not the first 20")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from chute.storage.open import open_dataset

    ds = open_dataset(args.dataset)
    manifest = ds.manifest
    print(f"dataset   {ds.root}")
    print(f"format    chute {manifest.to_json()['format_version']}, written by {manifest.created_by or 'unknown'}")
    print(f"rows      {len(ds):,} in {len(ds.shards)} shard(s), {format_size(ds.nbytes)}")
    print("columns")
    print(table([[name, ctype.describe()] for name, ctype in ds.schema]))
    if ds.metadata:
        print("metadata")
        for key, value in ds.metadata.items():
            text = json.dumps(value)
            print(f"  {key}: {text if len(text) <= 100 else text[:97] + '...'}")
    print("shards")
    header = ["#", "file", "rows", "size", "checksum"] + (["verify"] if args.verify else [])
    rows = [header]
    failed = 0
    limit = len(ds.shards) if args.all or args.verify else 20
    for i, info in enumerate(ds.shards):
        status = []
        if args.verify:
            problem = ds.check_shard(i)
            failed += problem is not None
            status = ["OK" if problem is None else f"FAILED: {problem}"]
        if i < limit:
            rows.append([str(i), info.file, f"{info.rows:,}", format_size(info.bytes), info.checksum, *status])
    print(table(rows))
    if len(ds.shards) > limit:
        print(f"  ... {len(ds.shards) - limit} more (--all lists every shard)")
    if args.verify:
        if failed:
            print(f"verify: {failed} of {len(ds.shards)} shard(s) FAILED; write or download the dataset again", file=sys.stderr)
            return 1
        print(f"verify: all {len(ds.shards)} shard(s) match their size and checksum")
    return 0
