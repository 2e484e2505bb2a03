"""The ``chute`` command: convert, inspect, demo."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from chute._sizes import format_size, parse_size
from chute.errors import ChuteError


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _convert(args: argparse.Namespace) -> int:
    from chute.sources import convert

    start = time.perf_counter()
    ds = convert(
        args.src,
        args.dst,
        kind=args.kind,
        allow_pickle=args.allow_pickle,
        workers=args.workers,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    elapsed = time.perf_counter() - start
    print(
        f"wrote {len(ds):,} rows in {len(ds.shards)} shard(s), {format_size(ds.nbytes)}, "
        f"to {ds.root} in {elapsed:.1f} s"
    )
    return 0


def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _inspect(args: argparse.Namespace) -> int:
    from chute.format.reader import open_dataset

    ds = open_dataset(args.dataset)
    manifest = ds.manifest
    print(f"dataset   {ds.root}")
    print(f"format    chute {manifest.to_json()['format_version']}, written by {manifest.created_by or 'unknown'}")
    print(f"rows      {len(ds):,} in {len(ds.shards)} shard(s), {format_size(ds.nbytes)}")
    print("columns")
    print(_table([[name, ctype.describe()] for name, ctype in ds.schema]))
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
    print(_table(rows))
    if len(ds.shards) > limit:
        print(f"  ... {len(ds.shards) - limit} more (--all lists every shard)")
    if args.verify:
        if failed:
            print(f"verify: {failed} of {len(ds.shards)} shard(s) FAILED; write or download the dataset again", file=sys.stderr)
            return 1
        print(f"verify: all {len(ds.shards)} shard(s) match their size and checksum")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from chute.demo import run_demo

    run_demo(files=args.files, workers=args.workers, keep=args.keep, steps=args.steps)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chute", description="Keep the accelerator fed: convert, inspect and read chute datasets.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a dataset (index of files, image folder, parquet/arrow, HF, numpy, webdataset) to chute's format")
    p.add_argument("src", help="source: index .csv/.txt, image folder, .parquet/.arrow file or dir, HF save_to_disk dir, .npy/.npz, .tar or dir of .tar")
    p.add_argument("dst", help="directory to write the chute dataset to")
    p.add_argument("--kind", choices=["index", "images", "arrow", "hf", "numpy", "webdataset"], help="source kind (default: detected from SRC)")
    p.add_argument("--allow-pickle", action="store_true", help="unpickle .pkl/.pickle files (runs code from the files: only for files you trust)")
    p.add_argument("--workers", type=int, default=None, help="reader processes (default: CPU count; 0 reads in this process)")
    p.add_argument("--shard-size", type=_size, default="128MiB", help="target shard size, e.g. 64MB (default 128MiB)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_convert)

    p = sub.add_parser("inspect", help="show a dataset's schema, rows, shards, sizes and checksums")
    p.add_argument("dataset")
    p.add_argument("--verify", action="store_true", help="check every shard's size and checksum (exit 1 if any fails)")
    p.add_argument("--all", action="store_true", help="list every shard, not the first 20")
    p.set_defaults(run=_inspect)

    p = sub.add_parser("demo", help="generate a many-small-pickles dataset, convert it, and compare reading it with chute vs a torch DataLoader")
    p.add_argument("--files", type=int, default=2000, help="number of per-sample .pkl.gz files to generate (default 2000)")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers for the baseline (default: CPU count)")
    p.add_argument("--steps", type=int, default=300, help="training steps for the tiny-model comparison (default 300)")
    p.add_argument("--keep", action="store_true", help="keep the generated files and dataset")
    p.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ChuteError as exc:
        print(f"chute {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"chute {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
