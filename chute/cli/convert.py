"""``chute convert SRC DST``: another layout into a chute dataset; with ``--tokenizer``, a text corpus into a token dataset."""

from __future__ import annotations

import argparse
import time

from chute._sizes import format_size
from chute.cli._args import at_least, size, writing_to
from chute.errors import ChuteError

CONVERT_OPTIONS = ("path_column", "root", "data_type", "column_types", "cast", "split", "columns", "decode")
"""``chute convert`` flags that go to one kind of converter only (unset ones are not passed)."""

KINDS = ("index", "images", "arrow", "hf", "numpy", "webdataset", "jsonl", "hdf5", "zarr", "lmdb", "tfrecord")
"""chute.sources.KINDS, spelt out: ``chute --help`` does not import the converters (tests/test_cli.py checks they agree)."""

TEXT_OPTIONS = ("text_key", "eos", "eos_id", "keep_empty", "vocab_size", "keep", "encoding", "errors")
"""``chute convert`` flags that go to the text conversion only (chute/tokens/text.py, docs/tokens.md)."""


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


def add(sub) -> None:
    p = sub.add_parser("convert", help="convert a dataset (index of files, image folder, parquet/arrow, HF, numpy, webdataset, "
                                       "jsonl, HDF5, Zarr, LMDB, TFRecord) to chute's format")
    p.add_argument("src", help="source: index .csv/.txt, image folder, .parquet/.arrow file or dir, HF save_to_disk dir, .npy/.npz, "
                               ".tar or dir of .tar, .jsonl, .h5/.nc, a Zarr group, an LMDB dir, .tfrecord files; an index, .jsonl, "
                               ".parquet, .tar, .h5, Zarr group or .tfrecord may be an s3://, gs:// or https:// URL")
    p.add_argument("dst", help="directory (or s3:// / gs:// URL) to write the chute dataset to")
    p.add_argument("--kind", choices=KINDS, help="source kind (default: detected from SRC)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="unpickle .pkl/.pickle files and pickled LMDB values (runs code from the data: only for data you trust)")
    p.add_argument("--workers", type=at_least(0), default=None, help="reader processes (default: CPU count; 0 reads in this process)")
    p.add_argument("--shard-size", type=size, default="128MiB", help="target shard size, e.g. 64MB (default 128MiB)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at DST")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--path-column", default=None, help="index: the CSV column holding the file paths (default: path, else the first)")
    p.add_argument("--root", metavar="FOLDER", default=None, help="index: the folder relative paths start from (default: the index file's folder)")
    p.add_argument("--data-type", type=_column_type, default=None, metavar="TYPE",
                   help="index: the type of the data column, e.g. 'ragged(float32, 2)', json, bytes (default: inferred)")
    p.add_argument("--column-type", dest="column_types", type=_named_column_type, action="append", default=None, metavar="NAME=TYPE",
                   help="index, jsonl, lmdb, tfrecord: the type of a column, e.g. 'x=ragged(float32, 3)', 'label=string' (repeatable; default: inferred)")
    p.add_argument("--cast", action="store_true", default=None, help="index, jsonl: round float values to a narrower float column (float64 into float32)")
    p.add_argument("--split", default=None, help="hf: the split of a DatasetDict to convert")
    p.add_argument("--columns", type=_names, default=None, metavar="A,B,...", help="arrow, hf, hdf5, zarr: convert only these columns (arrays)")
    p.add_argument("--decode", action="store_true", default=None,
                   help="images: store decoded uint8[3,H,W] pixels instead of the files (all images one size; "
                        "3*H*W bytes each, typically 5-15x the JPEG; training then skips decoding)")
    # chute convert --ray (docs/ray.md): reading and writing run as tasks of a Ray cluster
    p.add_argument("--ray", metavar="ADDRESS", help="read and write with Ray tasks on the cluster at ADDRESS ('auto', 'ray://host:10001', or 'local'); needs chute[ray]")
    # chute convert --tokenizer (docs/tokens.md): a text corpus into a token dataset
    p.add_argument("--tokenizer", metavar="TOKENIZER", default=None,
                   help="tokenize a text corpus (SRC: .jsonl[.gz|.zst], Parquet, a folder of .txt, a Hugging Face dataset) "
                        "with TOKENIZER: a path to a Hugging Face tokenizer.json, or a tiktoken encoding name (cl100k_base)")
    p.add_argument("--text-key", default=None, metavar="KEY", help="with --tokenizer: the JSON key or column of the text (default text)")
    p.add_argument("--eos", action="store_true", default=False, help="with --tokenizer: append the tokenizer's end-of-document token to every document")
    p.add_argument("--eos-id", type=at_least(0), default=None, metavar="N", help="with --tokenizer: append token N to every document (implies --eos)")
    p.add_argument("--keep-empty", action="store_true", default=False, help="with --tokenizer: keep documents with no tokens (default: counted and skipped)")
    p.add_argument("--vocab-size", type=at_least(1), default=None, metavar="N", help="with --tokenizer: the vocabulary size, if not the tokenizer's (picks uint16 or uint32)")
    p.add_argument("--keep", type=_names, default=None, metavar="A,B,...",
                   help="with --tokenizer: fields (JSON keys, columns) kept beside the tokens, e.g. id,url (each document's file and line are kept anyway)")
    p.add_argument("--encoding", default=None, help="with --tokenizer: the text's encoding (JSON lines, .txt; default utf-8)")
    p.add_argument("--errors", default=None, choices=["strict", "replace", "ignore", "backslashreplace", "skip"],
                   help="with --tokenizer: bytes that do not decode: an error (strict, the default), replaced, ignored, or the document skipped (counted)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
        with writing_to(args.dst):
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


def _convert_text(args: argparse.Namespace) -> int:
    from chute.tokens.text import convert_counted

    if args.tokenizer is None:
        given = [f"--{n.replace('_', '-')}" for n in TEXT_OPTIONS if getattr(args, n) not in (None, False)]
        raise ChuteError(f"{', '.join(given)}: only with --tokenizer TOKENIZER (to tokenize the text of {args.src})")
    if args.kind is not None:
        raise ChuteError("--kind does not apply with --tokenizer (the text source's kind is told from SRC)")
    start = time.perf_counter()
    with writing_to(args.dst):
        ds, counts = convert_counted(
            args.src, args.dst, tokenizer=args.tokenizer, text_key=args.text_key or "text", eos=args.eos,
            eos_id=args.eos_id, keep_empty=args.keep_empty, split=args.split, vocab_size=args.vocab_size,
            workers=args.workers, shard_size=args.shard_size, overwrite=args.overwrite, progress=not args.quiet,
            ray=args.ray, keep=args.keep or (), encoding=args.encoding or "utf-8", errors=args.errors or "strict",
        )
    elapsed = time.perf_counter() - start
    print(
        f"wrote {counts.written:,} documents, {counts.tokens:,} tokens ({ds.metadata['tokens']['dtype']}) in "
        f"{len(ds.shards)} shard(s), {format_size(ds.nbytes)}, to {ds.root} in {elapsed:.1f} s "
        f"({counts.tokens / max(elapsed, 1e-9):,.0f} tokens/s)"
    )
    for note in (counts.empty_note(args.keep_empty), counts.undecodable_note(args.encoding or "utf-8")):
        if note:
            print(note)
    return 0
