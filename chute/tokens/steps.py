"""Steps as first-class: which documents and token ranges fed a given step, on every rank.

The global order (:class:`chute.order.Order`) says which sequences each rank
reads at each step; a sequence view says which tokens each sequence holds. So
"what did step N see?" is a pure function of the dataset, the loader settings
and N, answered here without reading a single token: only the document
offsets of the shards involved are read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.order import DEFAULT_WINDOW, Order

__all__ = ["Piece", "which"]


@dataclasses.dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of document ``document`` (its global number, from 0), read by ``sequence``
    (the view's row) at position ``row`` of ``rank``'s batch."""

    rank: int
    row: int
    sequence: int
    shard: int
    document: int
    start: int
    stop: int

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def which(
    data: Any, step: int, batch_size: int, *, seq_len: int | None = None, pack: str = "concat", world_size: int = 1,
    epoch: int = 0, shuffle: bool = True, seed: int = 0, window: int = DEFAULT_WINDOW, drop_last: bool = False,
) -> list[list[Piece]]:
    """Per rank, the document pieces that fed ``step`` of ``epoch`` (a Loader with these settings on each rank).

    ``data``: a :class:`chute.tokens.Sequences` view, or anything
    :func:`chute.tokens.sequences` takes together with ``seq_len`` and ``pack``.
    ``batch_size`` is per rank, as for :class:`chute.Loader`. A window of
    ``pack="concat"`` lists every document it touches, its last token being the
    next window's first (the label of its last position).
    """
    from chute.tokens.sequences import Sequences, sequences

    view = data if isinstance(data, Sequences) else sequences(data, _need(seq_len), pack=pack)
    order = Order(tuple(s.rows for s in view.shards), int(batch_size), bool(shuffle), int(seed), int(window), bool(drop_last))
    steps = order.num_batches(world_size, 0)
    if not 0 <= step < steps:
        raise ChuteError(
            f"step {step} is outside the {steps} steps (0 to {steps - 1}) of an epoch of {view.root} at batch size "
            f"{batch_size} on {world_size} rank(s)"
        )
    doc_base = np.zeros(len(view.shards) + 1, dtype=np.int64)
    np.cumsum(_documents(view), out=doc_base[1:])
    out = []
    shards: dict[int, tuple[int, np.ndarray]] = {}
    for rank in range(world_size):
        pieces: list[Piece] = []
        for position, row in enumerate(order.batch(epoch, step, rank, world_size, 0).tolist()):
            pieces += _pieces(view, rank, position, int(row), doc_base, shards)
        out.append(pieces)
    return out


def _need(seq_len: int | None) -> int:
    if seq_len is None:
        raise ValueError("which needs seq_len= unless it is given a chute.tokens.sequences view")
    return seq_len


def _documents(view: Any) -> np.ndarray:
    counts = np.asarray(view.source.shard_docs, dtype=np.int64)
    if (counts >= 0).all():
        return counts
    return np.asarray([len(view.source.map(i)[2]) - 1 for i in range(len(view.shards))], dtype=np.int64)


def _offsets(view: Any, shard: int, shards: dict[int, tuple[int, np.ndarray]]) -> tuple[int, np.ndarray]:
    """``(base, doc_offsets)`` of a source shard, checked never to decrease (once per shard and call)."""
    got = shards.get(shard)
    if got is None:
        from chute.tokens.sequences import check_documents

        _, base, offsets = view.source.map(shard)
        if view.pack == "concat":  # pack="documents" checked them in the shard's plan (view._map)
            check_documents(view.source, shard, offsets)
        got = shards[shard] = (int(base), offsets)
    return got


def _pieces(view: Any, rank: int, position: int, row: int, doc_base: np.ndarray,
            shards: dict[int, tuple[int, np.ndarray]]) -> list[Piece]:
    """The document pieces of sequence ``row``: stream (concat) or plan (documents) range, cut at documents."""
    if view.pack == "concat":
        first = row * view.seq_len
        spans = []  # (shard, stream start, stream stop) of the window's L + 1 tokens in each shard
        pos, stop = first, first + view.seq_len + 1
        while pos < stop:
            shard = int(np.searchsorted(view.starts, pos, side="right")) - 1
            end = min(stop, int(view.starts[shard + 1]))
            spans.append((shard, pos - int(view.starts[shard]), end - int(view.starts[shard])))
            pos = end
    else:
        shard, local = view.locate(row)
        view._map(shard)
        plan = view._sources[shard][2]
        base = _offsets(view, shard, shards)[0]
        spans = [(shard, int(plan[local]) - base, int(plan[local + 1]) - base)]
    pieces = []
    for shard, lo, hi in spans:
        base, offsets = _offsets(view, shard, shards)  # searched in place: the mapped offsets are never copied
        d = int(np.searchsorted(offsets, base + lo, side="right")) - 1
        while lo < hi:
            while int(offsets[d + 1]) - base <= lo:  # empty documents
                d += 1
            begin, end = int(offsets[d]) - base, min(hi, int(offsets[d + 1]) - base)
            pieces.append(Piece(rank, position, row, shard, int(doc_base[shard]) + d, lo - begin, end - begin))
            lo = end
    return pieces
