"""``chute.tokens.convert``, in module ``chute.tokens.text``: a text corpus tokenized into a token dataset (``chute convert --tokenizer``).

The corpus is read in this process as chunks of about 1 MiB of text
(:mod:`chute.tokens._text_sources`); worker processes (or Ray actors) parse and
tokenize the chunks (:mod:`chute.tokens._tokenize`); results come back in
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
from collections.abc import Iterator, Mapping
from typing import Any

import chute
from chute.sources._parallel import OrderedPool, resolve_workers
from chute.sources._progress import Progress
from chute.storage.open import open_dataset
from chute.tokens._text_sources import CHUNK_BYTES, TextSource, open_text_source
from chute.tokens._tokenize import Tokenized, setup_worker, tokenize_chunk, tokenize_in_worker
from chute.tokens._tokenizer import Encoder, check_picklable, encoder_eos, load_tokenizer
from chute.tokens.writer import TokenWriter

DEFAULT_SHARD_SIZE = "128MB"


@dataclasses.dataclass
class Counts:
    """What a conversion read and wrote."""

    documents: int = 0  # documents read
    written: int = 0  # documents written
    empty: int = 0  # documents with no tokens (skipped unless keep_empty)
    tokens: int = 0  # tokens written, end-of-document tokens included

    def add(self, result: Tokenized, *, eos: bool) -> None:
        self.documents += result.documents
        self.empty += result.empty
        self.written += len(result.lengths)
        self.tokens += int(result.tokens.size) + (len(result.lengths) if eos else 0)

    def empty_note(self, keep_empty: bool) -> str:
        """What happened to the empty documents ('' when there were none)."""
        if not self.empty:
            return ""
        what = "kept" if keep_empty else "skipped (keep them with --keep-empty / keep_empty=True)"
        return f"{self.empty:,} of {self.documents:,} documents were empty (no tokens): {what}"


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
    """
    dataset, _ = convert_counted(
        source, out, tokenizer=tokenizer, text_key=text_key, eos=eos, eos_id=eos_id, keep_empty=keep_empty, kind=kind,
        split=split, vocab_size=vocab_size, workers=workers, shard_size=shard_size, overwrite=overwrite,
        compression=compression, storage_options=storage_options, progress=progress, ray=ray,
        start_method=start_method, chunk_bytes=chunk_bytes,
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
) -> tuple[chute.Dataset, Counts]:
    """:func:`convert`, also returning what it read and wrote (``chute convert`` prints it)."""
    encoder = load_tokenizer(tokenizer, vocab_size=vocab_size)
    end = encoder_eos(encoder, eos, eos_id)
    text = open_text_source(source, text_key=text_key, kind=kind, split=split)
    counts = Counts()
    bar = Progress(text.documents, f"chute convert (tokenize {text.kind})", enabled=progress, unit="documents")
    metadata = {"source": {**text.metadata(), "tokenizer": encoder.name}}
    writer = TokenWriter(
        out, vocab_size=encoder.vocab_size, eos_id=end, shard_size=shard_size, metadata=metadata, overwrite=overwrite,
        compression=compression, storage_options=storage_options,
    )
    with bar, writer, _tokenized(text, encoder, keep_empty, workers, ray, start_method, chunk_bytes) as results:
        for result in results:
            writer.extend(result.tokens, result.lengths)
            counts.add(result, eos=end is not None)
            bar.update(result.documents)
        if counts.empty:
            bar.note(counts.empty_note(keep_empty))
    return open_dataset(writer.url, storage_options=storage_options), counts


@contextlib.contextmanager
def _tokenized(
    text: TextSource, encoder: Encoder, keep_empty: bool, workers: int | None, ray: str | None,
    start_method: str | None, chunk_bytes: int,
) -> Iterator[Iterator[Tokenized]]:
    """The chunks of ``text`` tokenized, in order: by Ray actors, worker processes, or this process."""
    chunks = text.chunks(chunk_bytes)
    if ray is not None:
        from chute.tokens._ray_tokenize import tokenize_on_ray

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
