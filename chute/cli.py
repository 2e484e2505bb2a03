"""The ``chute`` command: convert, inspect, bench, tune, doctor, demo (docs/cli.md)."""

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
        **({"ray": args.ray} if args.ray else {}),
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


def _bench(args: argparse.Namespace) -> int:
    from chute.observe import bench

    if args.plot:  # fail before the run, not after it
        _require_matplotlib()
    result = bench.run(
        args.dataset, batch_size=args.batch_size, num_threads=args.threads, workers=args.workers, prefetch=args.prefetch,
        epochs=args.epochs, seconds=args.seconds, shuffle=not args.no_shuffle, cache_dir=args.cache_dir,
        loader_kwargs=_transform_kwargs(args),
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


def _tune(args: argparse.Namespace) -> int:
    from chute.observe import bench

    kwargs = _transform_kwargs(args)
    if args.max_threads:
        kwargs["max_threads"] = args.max_threads
    result = bench.run(
        args.dataset, batch_size=args.batch_size, num_threads=None, epochs=None, seconds=args.seconds,
        step_ms=args.step_ms, shuffle=True, cache_dir=args.cache_dir, loader_kwargs=kwargs,
    )
    if args.json:
        print(bench.dumps(result))
        return 0
    print(f"chute tune {result.dataset}: batch {result.batch_size}, simulated step {args.step_ms:g} ms, {result.elapsed_s:.1f} s")
    print(bench.tune_text(result))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from chute.observe import doctor

    dataset = None
    if args.dataset:
        from chute.format.reader import open_dataset

        dataset = open_dataset(args.dataset, cache_dir=args.cache_dir)
    env = doctor.gather(args.cache_dir)
    checks = doctor.check(env, dataset, batch_size=args.batch_size, prefetch=args.prefetch, workers=args.workers)
    if args.json:
        print(json.dumps([c.to_json() for c in checks], indent=2))
    else:
        print(f"chute doctor{' ' + str(dataset.root) if dataset is not None else ''}")
        print(doctor.format_checks(checks))
    return doctor.exit_code(checks)


def _transform_kwargs(args: argparse.Namespace) -> dict:
    """``{"transform": fn}`` for ``--transform module:function``, else ``{}``."""
    return {"transform": _function(args.transform)} if args.transform else {}


def _function(spec: str):
    """The function named ``module:qualname`` (the current directory is importable, as with ``python -m``)."""
    import importlib
    import os

    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise ChuteError(f"--transform wants module:function (e.g. mypkg.transforms:decode), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise ChuteError(f"--transform {spec}: cannot import {module_name} ({exc}); run from the directory that holds it") from None
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ChuteError(f"--transform {spec}: {module_name} has no {qualname}") from None
    if not callable(target):
        raise ChuteError(f"--transform {spec}: {qualname} is not callable")
    return target


def _require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ChuteError("--plot needs matplotlib: pip install 'chute[plot]'")


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


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
    # chute convert --ray (docs/ray.md): reading and writing run as tasks of a Ray cluster
    p.add_argument("--ray", metavar="ADDRESS", help="read and write with Ray tasks on the cluster at ADDRESS ('auto', 'ray://host:10001', or 'local'); needs chute[ray]")
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

    p = sub.add_parser("bench", help="measure a Loader on a dataset: throughput, time to first batch, per-stage utilisation")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch (default 256)")
    p.add_argument("--threads", type=int, default=None, help="worker threads (default: autotuned) or processes with --workers processes")
    p.add_argument("--workers", choices=["threads", "processes"], default="threads", help="worker kind (default threads)")
    p.add_argument("--prefetch", type=int, default=None, help="batches in flight (default: autotuned)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the dataset (default 1; --seconds may end the run sooner)")
    p.add_argument("--seconds", type=_positive, default=None, help="stop after this many seconds")
    p.add_argument("--no-shuffle", action="store_true", help="read in storage order")
    p.add_argument("--transform", metavar="MODULE:FUNCTION", default=None, help="per-sample transform to run, e.g. mypkg.transforms:decode")
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="write throughput over time and stage utilisation (needs chute[plot])")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_bench)

    p = sub.add_parser("tune", help="run the autotuner against a simulated training step and print the settings it finds, and why")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--step-ms", type=float, default=10.0, help="simulated training step per batch, in ms (default 10)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per batch (default 256)")
    p.add_argument("--seconds", type=_positive, default=20.0, help="how long to run (default 20)")
    p.add_argument("--max-threads", type=int, default=None, help="the autotuner's CPU budget (default: the usable CPUs)")
    p.add_argument("--transform", metavar="MODULE:FUNCTION", default=None, help="per-sample transform to run, e.g. mypkg.transforms:decode")
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_tune)

    p = sub.add_parser("doctor", help="check this machine for what makes data loading slow or fail, and what to change")
    p.add_argument("dataset", nargs="?", help="a chute dataset to check against (size, shards, remote backend)")
    p.add_argument("--cache-dir", default=None, help="the node cache directory to check (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--batch-size", type=int, default=256, help="for the /dev/shm estimate (default 256)")
    p.add_argument("--prefetch", type=int, default=None, help="for the /dev/shm estimate (default 2 per worker)")
    p.add_argument("--workers", type=int, default=None, help="worker processes, for the /dev/shm estimate (default: CPUs, at most 8)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(run=_doctor)
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
