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
    tokens = ds.metadata.get("tokens")
    if isinstance(tokens, dict):  # a token dataset: its figures on one line (the metadata below is cut short)
        print(f"tokens    {_token_summary(tokens)}")
    print("columns")
    print(table([[name, ctype.describe()] for name, ctype in ds.schema]))
    if ds.metadata:
        print("metadata")
        for key, value in ds.metadata.items():
            if key == "tokens" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in ("shard_tokens", "packed")}  # per-shard lists
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


def _token_summary(meta: dict) -> str:
    """``documents, tokens, dtype, vocabulary, end token`` of a token dataset's metadata (what is there of them)."""

    def number(key: str) -> str:
        value = meta.get(key)
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "?"

    vocab = meta.get("vocab_size")
    eos = meta.get("eos_id")
    return (f"{number('documents')} documents, {number('tokens')} tokens ({meta.get('dtype', '?')}), "
            f"vocabulary {'unknown' if vocab is None else number('vocab_size')}, "
            f"end-of-document token {'none' if eos is None else number('eos_id')}")
