"""Tokenize one chunk of documents (in a worker process, or in this one).

A chunk's result is arrays, not one Python list per document: the tokens of its
kept documents end to end (``uint32``) and their lengths, so the result pickles
as a few buffers; beside them, where each kept document came from (file, and
line or row), its kept fields as JSON text, and the documents that were skipped
and why. Empty documents (no tokens) are dropped unless ``keep_empty``; either
way they are counted. Token ids are checked against the vocabulary here, where
the file and line of the document are still known.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from typing import NoReturn

import numpy as np

from chute.tokens._corpus import Chunk, Documents, TextError
from chute.tokens._encoders import Encoder

UINT32_LIMIT = 1 << 32
EMPTY = "empty"
"""Why a document with no tokens was skipped (the manifest's record of skipped documents)."""


@dataclasses.dataclass
class Tokenized:
    """A chunk tokenized: ``tokens`` cut at ``lengths`` (the kept documents), where each came from, and counts."""

    tokens: np.ndarray  # uint32, the kept documents' tokens end to end
    lengths: np.ndarray  # int64, one per kept document
    documents: int  # documents read (kept or not)
    empty: int  # documents with no tokens (dropped unless keep_empty)
    files: list[str] = dataclasses.field(default_factory=list)  # per kept document: its file, as recorded
    lines: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # per kept document: line/row
    kept: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # per kept field: JSON text per kept document
    skipped: list[tuple[str, int, str]] = dataclasses.field(default_factory=list)  # (file, line/row, why), in order

    @property
    def undecodable(self) -> int:
        return sum(1 for _, _, why in self.skipped if why != EMPTY)


def tokenize_chunk(encoder: Encoder, keep_empty: bool, chunk: Chunk) -> list[Tokenized]:
    """``[Tokenized]`` of ``chunk`` (a one-item list: the shape :class:`~chute.sources._parallel.OrderedPool` maps)."""
    docs = chunk.read()
    ids = encoder.encode(docs.texts)
    try:
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
    except (TypeError, ValueError, OverflowError):  # only a callable can return something else than lists of ints
        _refuse(ids, encoder, docs, chunk.kind)
    _check_ids(flat, lengths, encoder, docs, chunk.kind)
    lines = np.asarray(docs.lines, dtype=np.int64)
    kept = {k: [json.dumps(v, ensure_ascii=False, default=str) for v in values] for k, values in docs.kept.items()}
    files = docs.files
    empty = lengths == 0
    count = int(np.count_nonzero(empty))
    skipped = docs.skipped
    if count and not keep_empty:
        at = np.flatnonzero(empty).tolist()
        rank = {name: i for i, name in enumerate(getattr(chunk, "names", None) or [getattr(chunk, "name", "")])}
        skipped = sorted(skipped + [(files[i], int(lines[i]), EMPTY) for i in at], key=lambda s: (rank.get(s[0], 0), s[1]))
        keep = ~empty
        lengths, lines = lengths[keep], lines[keep]
        files = [f for f, k in zip(files, keep.tolist()) if k]
        kept = {k: [v for v, ok in zip(values, keep.tolist()) if ok] for k, values in kept.items()}
    return [Tokenized(flat.astype(np.uint32), lengths, len(docs.texts) + len(docs.skipped), count, files, lines, kept, skipped)]


def _refuse(ids: list, encoder: Encoder, docs: Documents, kind: str) -> NoReturn:
    """The TextError for results that are not sequences of int64 token ids: the document, and what was wrong."""
    for doc, values in enumerate(ids):
        if not hasattr(values, "__len__") or isinstance(values, (str, bytes)):
            break
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                break
            if not 0 <= int(value) < UINT32_LIMIT:
                raise TextError(f"{docs.place(doc, kind)}: the {encoder.name} gave token id {value}; ids must be in 0..2**32-1")
        else:
            continue
        break
    raise TextError(
        f"{docs.place(0, kind)} and on: the {encoder.name} returned {_kinds(ids)}; it must return a sequence of "
        "int token ids per text (for a transformers tokenizer, pass the tokenizer itself)"
    )


def _kinds(values: list) -> str:
    kinds = sorted({type(v).__name__ for v in values[:100]})
    return ", ".join(kinds) if len(kinds) > 1 else f"a {kinds[0]}" if kinds else "nothing"


def _check_ids(flat: np.ndarray, lengths: np.ndarray, encoder: Encoder, docs: Documents, kind: str) -> None:
    """Every id in ``[0, vocab_size)`` (or ``[0, 2**32)`` when the vocabulary size is unknown)."""
    if not flat.size:
        return
    limit = encoder.vocab_size if encoder.vocab_size is not None else UINT32_LIMIT
    low, high = int(flat.min()), int(flat.max())
    if low >= 0 and high < limit:
        return
    bad = int(np.flatnonzero((flat < 0) | (flat >= limit))[0])
    doc = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
    value = int(flat[bad])
    if encoder.vocab_size is None:
        raise TextError(f"{docs.place(doc, kind)}: the {encoder.name} gave token id {value}; ids must be in 0..2**32-1")
    raise TextError(
        f"{docs.place(doc, kind)}: the {encoder.name} gave token id {value}, outside its vocabulary of "
        f"{encoder.vocab_size} (pass vocab_size= if the tokenizer's is wrong)"
    )


# --------------------------------------------------------------------------- worker processes

_worker_encoder: tuple[Encoder, bool] | None = None
"""This worker process's tokenizer and ``keep_empty``, set once when the process starts."""


def setup_worker(encoder: Encoder, keep_empty: bool) -> None:
    """Worker process initializer: keep the tokenizer for every chunk this process tokenizes.

    One thread per worker: the processes are the parallelism (``tokenizers`` would
    otherwise start a thread per CPU in every worker)."""
    global _worker_encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # this worker process's own environment
    _worker_encoder = (encoder, keep_empty)


def tokenize_in_worker(chunk: Chunk) -> list[Tokenized]:
    """:func:`tokenize_chunk` with the tokenizer :func:`setup_worker` left in this process."""
    assert _worker_encoder is not None, "setup_worker did not run in this process"
    encoder, keep_empty = _worker_encoder
    return tokenize_chunk(encoder, keep_empty, chunk)


