"""The ``chute`` command: convert, inspect, bench, tune, doctor, demo (docs/cli.md).

Every command imports what it needs when it runs, so ``chute --help`` and
``chute --version`` answer without loading torch. A mistake the user can fix
(a :class:`~chute.errors.ChuteError`, or an OSError on a path they gave) is one
line on stderr, ``chute <command>: error: ...``, and exit status 1; anything
else is a bug in chute and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence

from chute import __version__
from chute._sizes import format_size, parse_size
from chute.errors import ChuteError

SIGPIPE_EXIT = 128 + 13  # what a shell reports for a process stopped by SIGPIPE


def _size(text: str) -> int:
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, got {text}")
    return size


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def _number(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a number above ``minimum`` (or equal to it, if ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"must be {'at least' if inclusive else 'more than'} {minimum:g}, got {text}")
        return value

    return parse


_positive = _number(0, inclusive=False)
_non_negative = _number(0, inclusive=True)


def _column_type(text: str):
    from chute.sources._column_type import parse_column_type

    try:
        return parse_column_type(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _named_column_type(text: str):
    from chute.sources._column_type import parse_named_column_type

    try:
        return parse_named_column_type(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"name one or more columns, comma-separated, got {text!r}")
    return names


CONVERT_OPTIONS = ("path_column", "root", "data_type", "column_types", "cast", "split", "columns", "decode")
"""``chute convert`` flags that go to one kind of converter only (unset ones are not passed)."""


# ---- chute convert --tokenizer: a text corpus into a token dataset (chute/tokens/text.py, docs/tokens.md)
TEXT_OPTIONS = ("text_key", "eos", "eos_id", "keep_empty", "vocab_size")


def _convert_text(args: argparse.Namespace) -> int:
    from chute.tokens.text import convert_counted

    if args.tokenizer is None:
        given = [f"--{n.replace('_', '-')}" for n in TEXT_OPTIONS if getattr(args, n) not in (None, False)]
        raise ChuteError(f"{', '.join(given)}: only with --tokenizer TOKENIZER (to tokenize the text of {args.src})")
    if args.kind is not None:
        raise ChuteError("--kind does not apply with --tokenizer (the text source's kind is told from SRC)")
    start = time.perf_counter()
    with _writing_to(args.dst):
        ds, counts = convert_counted(
            args.src, args.dst, tokenizer=args.tokenizer, text_key=args.text_key or "text", eos=args.eos,
            eos_id=args.eos_id, keep_empty=args.keep_empty, split=args.split, vocab_size=args.vocab_size,
            workers=args.workers, shard_size=args.shard_size, overwrite=args.overwrite, progress=not args.quiet,
            ray=args.ray,
        )
    elapsed = time.perf_counter() - start
    print(
        f"wrote {counts.written:,} documents, {counts.tokens:,} tokens ({ds.metadata['tokens']['dtype']}) in "
        f"{len(ds.shards)} shard(s), {format_size(ds.nbytes)}, to {ds.root} in {elapsed:.1f} s "
        f"({counts.tokens / max(elapsed, 1e-9):,.0f} tokens/s)"
    )
    if counts.empty:
        print(counts.empty_note(args.keep_empty))
    return 0
# ---- end of chute convert --tokenizer


def _convert(args: argparse.Namespace) -> int:
    if args.tokenizer is not None or any(getattr(args, n) not in (None, False) for n in TEXT_OPTIONS):
        return _convert_text(args)
    from chute.sources import convert
    from chute.sources._hints import FixableError

    if args.column_types is not None:
        args.column_types = dict(args.column_types)
    kind_specific = {name: getattr(args, name) for name in CONVERT_OPTIONS if getattr(args, name) is not None}
    start = time.perf_counter()
    common = {"kind": args.kind, "allow_pickle": args.allow_pickle, "shard_size": args.shard_size, "overwrite": args.overwrite}
    try:
        with _writing_to(args.dst):
            if args.ray:  # read and written by Ray tasks (docs/ray.md)
                from chute.ray import convert_on_ray

                ds = convert_on_ray(args.src, args.dst, address=args.ray, **common, **kind_specific)
            else:
                ds = convert(args.src, args.dst, workers=args.workers, progress=not args.quiet, **common, **kind_specific)
    except FixableError as exc:  # its fix as this command's flags, not as Python arguments
        raise ChuteError(exc.render("cli")) from None
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
    from chute.storage.open import open_dataset

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

    run_demo(files=args.files, workers=args.workers, keep=args.keep, steps=args.steps, runs=args.runs)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from chute.tools import bench

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
    from chute.tools import bench

    result = bench.run(
        args.dataset, batch_size=args.batch_size, num_threads=None, max_count=args.max_threads or None, epochs=None, seconds=args.seconds,
        step_ms=args.step_ms, shuffle=True, cache_dir=args.cache_dir, loader_kwargs=_transform_kwargs(args),
    )
    if args.json:
        print(bench.dumps(result))
        return 0
    print(f"chute tune {result.dataset}: batch {result.batch_size}, simulated step {args.step_ms:g} ms, {result.elapsed_s:.1f} s")
    print(bench.tune_text(result))
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from chute.tools import doctor

    dataset = None
    if args.dataset:
        from chute.storage.open import open_dataset

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chute", description="Keep the accelerator fed: convert, inspect and read chute datasets.")
    parser.add_argument("--version", action="version", version=f"chute {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="convert a dataset (index of files, image folder, parquet/arrow, HF, numpy, webdataset) to chute's format")
    p.add_argument("src", help="source: index .csv/.txt, image folder, .parquet/.arrow file or dir, HF save_to_disk dir, .npy/.npz, "
                               ".tar or dir of .tar, .jsonl; an index, .jsonl, .parquet or .tar may be an s3://, gs:// or https:// URL")
    p.add_argument("dst", help="directory (or s3:// / gs:// URL) to write the chute dataset to")
    p.add_argument("--kind", choices=["index", "images", "arrow", "hf", "numpy", "webdataset", "jsonl"], help="source kind (default: detected from SRC)")
    p.add_argument("--allow-pickle", action="store_true", help="unpickle .pkl/.pickle files (runs code from the files: only for files you trust)")
    p.add_argument("--workers", type=_at_least(0), default=None, help="reader processes (default: CPU count; 0 reads in this process)")
    p.add_argument("--shard-size", type=_size, default="128MiB", help="target shard size, e.g. 64MB (default 128MiB)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--path-column", default=None, help="index: the CSV column holding the file paths (default: path, else the first)")
    p.add_argument("--root", metavar="FOLDER", default=None, help="index: the folder relative paths start from (default: the index file's folder)")
    p.add_argument("--data-type", type=_column_type, default=None, metavar="TYPE",
                   help="index: the type of the data column, e.g. 'ragged(float32, 2)', json, bytes (default: inferred)")
    p.add_argument("--column-type", dest="column_types", type=_named_column_type, action="append", default=None, metavar="NAME=TYPE",
                   help="index, jsonl: the type of a column, e.g. 'x=ragged(float32, 3)', 'label=string' (repeatable; default: inferred)")
    p.add_argument("--cast", action="store_true", default=None, help="index, jsonl: round float values to a narrower float column (float64 into float32)")
    p.add_argument("--split", default=None, help="hf: the split of a DatasetDict to convert")
    p.add_argument("--columns", type=_names, default=None, metavar="A,B,...", help="arrow, hf: convert only these columns")
    p.add_argument("--decode", action="store_true", default=None,
                   help="images: store decoded uint8[3,H,W] pixels instead of the files (all images one size; "
                        "3*H*W bytes each, typically 5-15x the JPEG; training then skips decoding)")
    # chute convert --ray (docs/ray.md): reading and writing run as tasks of a Ray cluster
    p.add_argument("--ray", metavar="ADDRESS", help="read and write with Ray tasks on the cluster at ADDRESS ('auto', 'ray://host:10001', or 'local'); needs chute[ray]")
    # ---- chute convert --tokenizer (docs/tokens.md): a text corpus into a token dataset
    p.add_argument("--tokenizer", metavar="TOKENIZER", default=None,
                   help="tokenize a text corpus (SRC: .jsonl[.gz|.zst], Parquet, a folder of .txt, a Hugging Face dataset) "
                        "with TOKENIZER: a path to a Hugging Face tokenizer.json, or a tiktoken encoding name (cl100k_base)")
    p.add_argument("--text-key", default=None, metavar="KEY", help="with --tokenizer: the JSON key or column of the text (default text)")
    p.add_argument("--eos", action="store_true", default=False, help="with --tokenizer: append the tokenizer's end-of-document token to every document")
    p.add_argument("--eos-id", type=_at_least(0), default=None, metavar="N", help="with --tokenizer: append token N to every document (implies --eos)")
    p.add_argument("--keep-empty", action="store_true", default=False, help="with --tokenizer: keep documents with no tokens (default: counted and skipped)")
    p.add_argument("--vocab-size", type=_at_least(1), default=None, metavar="N", help="with --tokenizer: the vocabulary size, if not the tokenizer's (picks uint16 or uint32)")
    # ---- end of chute convert --tokenizer
    p.set_defaults(run=_convert)

    p = sub.add_parser("inspect", help="show a dataset's schema, rows, shards, sizes and checksums")
    p.add_argument("dataset")
    p.add_argument("--verify", action="store_true", help="check every shard's size and checksum (exit 1 if any fails)")
    p.add_argument("--all", action="store_true", help="list every shard, not the first 20")
    p.set_defaults(run=_inspect)

    p = sub.add_parser("demo", help="generate a many-small-pickles dataset, convert it, and compare reading it with chute vs a torch DataLoader")
    p.add_argument("--files", type=_at_least(1), default=2000, help="number of per-sample .pkl.gz files to generate (default 2000)")
    p.add_argument("--workers", type=_at_least(0), default=None, help="num_workers of the multi-process DataLoader baseline, also run at 0 (default: CPU count)")
    p.add_argument("--steps", type=_at_least(1), default=60, help="training steps per run of the tiny-model comparison (default 60)")
    p.add_argument("--runs", type=_at_least(1), default=5, help="timed runs of each contender; medians are printed (default 5)")
    p.add_argument("--keep", action="store_true", help="keep the generated files and dataset")
    p.set_defaults(run=_demo)

    p = sub.add_parser("bench", help="measure a Loader on a dataset: throughput, time to first batch, per-stage utilisation")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--batch-size", type=_at_least(1), default=256, help="samples per batch (default 256)")
    p.add_argument("--threads", type=_at_least(1), default=None, help="worker threads (default: autotuned) or processes with --workers processes")
    p.add_argument("--workers", choices=["threads", "processes"], default="threads", help="worker kind (default threads)")
    p.add_argument("--prefetch", type=_at_least(1), default=None, help="batches in flight (default: autotuned)")
    p.add_argument("--epochs", type=_at_least(1), default=1, help="passes over the dataset (default 1; --seconds may end the run sooner)")
    p.add_argument("--seconds", type=_positive, default=None, help="stop after this many seconds")
    p.add_argument("--no-shuffle", action="store_true", help="read in storage order")
    p.add_argument("--transform", metavar="MODULE:FUNCTION", default=None, help="per-sample transform to run, e.g. mypkg.transforms:decode")
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="write throughput over time and stage utilisation (needs chute[plot])")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_bench)

    p = sub.add_parser("tune", help="run the autotuner against a simulated training step and print the settings it finds, and why")
    p.add_argument("dataset", help="a chute dataset: local path or URL")
    p.add_argument("--step-ms", type=_non_negative, default=10.0, help="simulated training step per batch, in ms (default 10)")
    p.add_argument("--batch-size", type=_at_least(1), default=256, help="samples per batch (default 256)")
    p.add_argument("--seconds", type=_positive, default=20.0, help="how long to run (default 20)")
    p.add_argument("--max-threads", type=_at_least(1), default=None, help="the most threads the autotuner may run (default: 4 per usable CPU, at least 16; "
                        "it also stops when the CPU used fills the usable CPUs)")
    p.add_argument("--transform", metavar="MODULE:FUNCTION", default=None, help="per-sample transform to run, e.g. mypkg.transforms:decode")
    p.add_argument("--cache-dir", default=None, help="node cache for a remote dataset")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(run=_tune)

    p = sub.add_parser("doctor", help="check this machine for what makes data loading slow or fail, and what to change")
    p.add_argument("dataset", nargs="?", help="a chute dataset to check against (size, shards, remote backend)")
    p.add_argument("--cache-dir", default=None, help="the node cache directory to check (default $CHUTE_CACHE_DIR or ~/.cache/chute)")
    p.add_argument("--batch-size", type=_at_least(1), default=256, help="for the /dev/shm estimate (default 256)")
    p.add_argument("--prefetch", type=_at_least(1), default=None, help="for the /dev/shm estimate (default 2 per worker)")
    p.add_argument("--workers", type=_at_least(1), default=None, help="worker processes, for the /dev/shm estimate (default: CPUs, at most 8)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(run=_doctor)

    # chute which (docs/tokens.md): the documents and token ranges that fed a step, per rank
    p = sub.add_parser("which", help="list, per rank, the documents and token ranges that fed step N of a token dataset")
    p.add_argument("dataset", help="a token dataset (chute.tokens.write / chute convert --tokenizer)")
    p.add_argument("--step", type=_at_least(0), required=True, help="the step (counted from the epoch's start)")
    p.add_argument("--batch-size", type=_at_least(1), required=True, help="sequences per batch on each rank")
    p.add_argument("--seq-len", type=_at_least(1), required=True, help="tokens per sequence")
    p.add_argument("--world-size", type=_at_least(1), default=1, help="ranks (default 1)")
    p.add_argument("--pack", choices=["concat", "documents"], default="concat", help="packing mode (default concat)")
    p.add_argument("--epoch", type=_at_least(0), default=0, help="the epoch (default 0)")
    p.add_argument("--seed", type=int, default=0, help="the loader's seed (default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="the loader ran with shuffle=False")
    p.add_argument("--json", action="store_true", help="print the pieces as JSON")
    p.set_defaults(run=_which)
    return parser


def _which(args: argparse.Namespace) -> int:
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
    print(_table(rows))
    return 0


def _os_error_text(exc: OSError) -> str:
    """``/data/x: Permission denied`` plus what to do, for an OSError on a path the user gave."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    text = f"{paths}: {exc.strerror or exc}" if paths else str(exc.strerror or exc)
    hint = {
        errno.EACCES: "check its permissions",
        errno.EPERM: "check its permissions",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "the disk is full",
    }.get(exc.errno or 0)
    return f"{text} ({hint})" if hint else text


@contextlib.contextmanager
def _writing_to(dst: str) -> Iterator[None]:
    """An OS error about ``dst`` (disk full, no permission) becomes a one-line ChuteError naming it."""
    try:
        yield
    except OSError as exc:
        if _concerns(exc, dst):
            raise ChuteError(f"cannot write the dataset to {dst}: {_os_error_text(exc)}") from None
        raise


def _concerns(exc: OSError, path: str) -> bool:
    """Whether ``exc`` is about ``path``, a folder above it or a file inside it."""
    if exc.filename is None:
        return False
    target = os.path.abspath(os.path.expanduser(path))
    failed = os.path.abspath(os.fspath(exc.filename))
    return failed == target or target.startswith(failed.rstrip(os.sep) + os.sep) or failed.startswith(target + os.sep)


def _fail(command: str, message: str) -> int:
    print(f"chute {command}: error: {message}", file=sys.stderr)
    return 1


def _stop_writing_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the arguments are parsed (--data-type imports chute)
        print("chute: interrupted", file=sys.stderr)
        return 130
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is seen below and not at exit
        return status
    except ChuteError as exc:
        return _fail(args.command, str(exc))
    except BrokenPipeError:
        # the reader went away (`chute inspect ds | head`): stop quietly, as other command-line tools do
        _stop_writing_stdout()
        return SIGPIPE_EXIT
    except (ConnectionError, TimeoutError, socket.gaierror) as exc:  # the network, not chute
        return _fail(args.command, f"{type(exc).__name__}: {exc}; check the address and that the server is up")
    except OSError as exc:
        if exc.filename is None:
            raise  # not about a path the user gave: a bug, keep the traceback
        return _fail(args.command, _os_error_text(exc))
    except KeyboardInterrupt:
        print(f"chute {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
