"""``chute.tokens.convert``, in module ``chute.tokens.text``: a text corpus tokenized into a token dataset (``chute convert --tokenizer``).

The corpus is read in this process as chunks of about 1 MiB of text
(:mod:`chute.tokens._corpus`); worker processes (or Ray actors) parse and
tokenize the chunks (:mod:`chute.tokens._workers`); results come back in
chunk order, so the dataset is the same bytes whatever the number of workers.
At most two chunks per worker are in flight, so memory stays flat however big
the corpus. This process writes the documents with :class:`chute.tokens.TokenWriter`
(a chunk's documents in one call).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import chute
from chute.format.schema import ColumnType, Json, Scalar, String
from chute.sources._parallel import OrderedPool, resolve_workers
from chute.sources._progress import Progress
from chute.storage.open import open_dataset
from chute.tokens._corpus import CHUNK_BYTES, UNDECODABLE, ReadOptions, TextSource, open_text_source
from chute.tokens._encoders import Encoder, check_picklable, encoder_eos, load_tokenizer
from chute.tokens._workers import Tokenized, setup_worker, tokenize_chunk, tokenize_in_worker
from chute.tokens.writer import TokenWriter

DEFAULT_SHARD_SIZE = "128MB"


SKIPPED_LISTED = 1000
"""Skipped documents the manifest lists one by one (file, line or row, why); the counts are always exact."""


@dataclasses.dataclass
class Counts:
    """What a conversion read and wrote."""

    documents: int = 0  # documents read
    written: int = 0  # documents written
    empty: int = 0  # documents with no tokens (skipped unless keep_empty)
    undecodable: int = 0  # documents whose bytes did not decode (skipped with errors="skip")
    tokens: int = 0  # tokens written, end-of-document tokens included
    skipped: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)  # the first SKIPPED_LISTED

    def add(self, result: Tokenized, *, eos: bool) -> None:
        self.documents += result.documents
        self.empty += result.empty
        self.undecodable += result.undecodable
        self.written += len(result.lengths)
        self.tokens += int(result.tokens.size) + (len(result.lengths) if eos else 0)
        self.skipped += result.skipped[: max(0, SKIPPED_LISTED - len(self.skipped))]

    def empty_note(self, keep_empty: bool) -> str:
        """What happened to the empty documents ('' when there were none)."""
        if not self.empty:
            return ""
        what = "kept" if keep_empty else "skipped (keep them with --keep-empty / keep_empty=True)"
        return f"{self.empty:,} of {self.documents:,} documents were empty (no tokens): {what}"

    def undecodable_note(self, encoding: str) -> str:
        """The documents skipped with errors="skip" ('' when there were none)."""
        if not self.undecodable:
            return ""
        return f"{self.undecodable:,} of {self.documents:,} documents were not {encoding.upper()} text: skipped (--errors skip)"

    def record(self, keep_empty: bool) -> dict[str, Any]:
        """The manifest's record of skipped documents: counts by why, and the first ones where they were."""
        by_why = {"empty": 0 if keep_empty else self.empty, UNDECODABLE: self.undecodable}
        return {
            "count": sum(by_why.values()),
            "by_why": {why: n for why, n in by_why.items() if n},
            "first": [{"source_file": f, "source_line": line, "why": why} for f, line, why in self.skipped],
        }


def convert(
    source: Any,
    out: str | os.PathLike,
    *,
    tokenizer: Any,
    text_key: str = "text",
    eos: bool = False,
    eos_id: int | None = None,
    keep_empty: bool = False,
    kind: str | None = None,
    split: str | None = None,
    vocab_size: int | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    compression: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    ray: str | None = None,
    start_method: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    keep: Sequence[str] = (),
    encoding: str = "utf-8",
    errors: str = "strict",
) -> chute.Dataset:
    """Tokenize the text corpus ``source`` into a token dataset at ``out`` and open it.

    ``source``: JSON lines (``.jsonl``, also ``.gz``/``.zst``/``.bz2``/``.xz``), Parquet or
    Arrow files, a folder of ``.txt`` files (one document each), a Hugging Face dataset
    (a ``save_to_disk`` folder, a folder of its Parquet files, or a ``datasets.Dataset``),
    a folder of any one of these, a glob or a list. ``kind`` (``jsonl``, ``arrow``,
    ``hf``, ``txt``) overrides detection; ``split`` picks a split of a Hugging Face dataset.
    ``text_key`` is the JSON key or column holding each document's text.

    ``tokenizer``: a path to a Hugging Face ``tokenizer.json`` (or its folder), a
    tiktoken encoding name (``cl100k_base``; tiktoken needs its BPE file: see
    docs/tokens.md), a ``tokenizers.Tokenizer``, a ``tiktoken.Encoding``, or a
    function ``text -> token ids`` (a top-level function when ``workers`` > 1). The
    vocabulary size (the tokenizer's, or ``vocab_size``) picks uint16 or uint32 storage.

    ``eos`` appends the tokenizer's end-of-document token to every document
    (``eos_id`` names it, and implies ``eos``). Documents with no tokens are counted
    and skipped, unless ``keep_empty``. ``workers`` tokenizer processes (default: one
    per CPU; 0 or 1: in this process); ``ray`` (an address: ``auto``, ``local``,
    ``ray://host:10001``) tokenizes with Ray actors instead (``workers`` of them, default
    one per CPU of the cluster; ``chute[ray]``). Either way the dataset is
    the same bytes. If anything fails, nothing valid is left at ``out``.

    Every document's origin is kept: columns ``source_file`` (its file, relative to
    ``source``) and ``source_line`` (its line in a JSON-lines file, from 1; its row in a
    Parquet/Arrow/Hugging Face source, from 0; 0 for a ``.txt`` file). ``keep`` names
    fields (JSON keys, columns) stored beside them as JSON values (``keep=["id", "url"]``).
    Skipped documents are counted by why, the first 1,000 listed, in the manifest
    (``metadata["source"]["skipped"]``). ``encoding`` is the text's (JSON lines, ``.txt``);
    ``errors`` says what to do with bytes that do not decode: ``"strict"`` (an error naming
    the file and line), Python's ``"replace"``, ``"ignore"``, ``"backslashreplace"``, or
    ``"skip"`` the document (counted and recorded like an empty one).
    """
    dataset, _ = convert_counted(
        source, out, tokenizer=tokenizer, text_key=text_key, eos=eos, eos_id=eos_id, keep_empty=keep_empty, kind=kind,
        split=split, vocab_size=vocab_size, workers=workers, shard_size=shard_size, overwrite=overwrite,
        compression=compression, storage_options=storage_options, progress=progress, ray=ray,
        start_method=start_method, chunk_bytes=chunk_bytes, keep=keep, encoding=encoding, errors=errors,
    )
    return dataset


def convert_counted(
    source: Any,
    out: str | os.PathLike,
    *,
    tokenizer: Any,
    text_key: str = "text",
    eos: bool = False,
    eos_id: int | None = None,
    keep_empty: bool = False,
    kind: str | None = None,
    split: str | None = None,
    vocab_size: int | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    compression: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    ray: str | None = None,
    start_method: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    keep: Sequence[str] = (),
    encoding: str = "utf-8",
    errors: str = "strict",
) -> tuple[chute.Dataset, Counts]:
    """:func:`convert`, also returning what it read and wrote (``chute convert`` prints it)."""
    encoder = load_tokenizer(tokenizer, vocab_size=vocab_size)
    end = encoder_eos(encoder, eos, eos_id)
    options = ReadOptions(tuple(keep), encoding, errors)
    text = open_text_source(source, text_key=text_key, kind=kind, split=split, options=options)
    counts = Counts()
    bar = Progress(text.documents, f"chute convert (tokenize {text.kind})", enabled=progress, unit="documents")
    described = {**text.metadata(), "tokenizer": encoder.name}
    columns: dict[str, ColumnType] = {"source_file": String(), "source_line": Scalar("int64")}
    columns.update({name: Json() for name in options.keep})
    writer = TokenWriter(
        out, vocab_size=encoder.vocab_size, eos_id=end, shard_size=shard_size, metadata={"source": described},
        overwrite=overwrite, compression=compression, storage_options=storage_options, columns=columns,
    )
    with bar, writer, _tokenized(text, encoder, keep_empty, workers, ray, start_method, chunk_bytes) as results:
        for result in results:
            _write(writer, result)
            counts.add(result, eos=end is not None)
            bar.update(result.documents)
        for note in (counts.empty_note(keep_empty), counts.undecodable_note(options.encoding)):
            if note:
                bar.note(note)
        described["skipped"] = counts.record(keep_empty)  # in the manifest the writer writes as the block ends
    return open_dataset(writer.url, storage_options=storage_options), counts


def _write(writer: TokenWriter, result: Tokenized) -> None:
    """A chunk's documents, their origin and kept fields (already JSON text), in one call."""
    files = result.files
    values: dict[str, Any] = {"source_file": files, "source_line": result.lines, **result.kept}
    nbytes = np.fromiter((len(f) + 16 for f in files), dtype=np.int64, count=len(files))
    for texts in result.kept.values():
        nbytes += np.fromiter((len(t) + 8 for t in texts), dtype=np.int64, count=len(texts))
    writer._extend_encoded(result.tokens, result.lengths, values, nbytes)


@contextlib.contextmanager
def _tokenized(
    text: TextSource, encoder: Encoder, keep_empty: bool, workers: int | None, ray: str | None,
    start_method: str | None, chunk_bytes: int,
) -> Iterator[Iterator[Tokenized]]:
    """The chunks of ``text`` tokenized, in order: by Ray actors, worker processes, or this process."""
    chunks = text.chunks(chunk_bytes)
    if ray is not None:
        from chute.tokens._ray_actors import tokenize_on_ray

        check_picklable(encoder)
        with contextlib.closing(tokenize_on_ray(chunks, encoder, keep_empty, ray, workers or None)) as results:
            yield results  # closing: the actors end now, not when the generator is collected
        return
    if resolve_workers(workers) > 1:
        check_picklable(encoder)
        fn = tokenize_in_worker
    else:
        fn = functools.partial(tokenize_chunk, encoder, keep_empty)
    with OrderedPool(workers, start_method=start_method, setup=setup_worker, setup_args=(encoder, keep_empty)) as pool:
        with contextlib.closing(pool.map(fn, chunks)) as results:
            yield results
