"""Held-out splits of a token corpus: :func:`split`, deterministic, by whole documents, disjoint and exact.

A split assigns every document of a token source to exactly one part, in
exact proportions (``{"train": 0.99, "val": 0.01}``: the documents are
apportioned by largest remainders, so the parts' sizes differ from the
fractions by less than one document and add up to the corpus). It works at the
granularity the data already has: the source's shards are put in an order
drawn from ``seed`` (chute's keyed permutation, the same on every machine and
numpy version) and the parts take consecutive documents of that order, so
each part is a set of whole shards plus at most one range of documents at each
boundary between parts. Opening a split costs what opening the source costs,
plus the document offsets of the (at most ``parts - 1``) shards a boundary
cuts; no document is read, copied or listed.

Each part is a :class:`~chute.tokens.source.TokenSource` with the same shards
as the source (a shard outside the part holds no rows of it), so
:func:`chute.tokens.sequences` reads it like any token data, a remote one
through its node cache, and its sequences mix (:func:`chute.mix`), shuffle and
resume exactly as any view's: the split is a pure function of the shards'
document counts, the fractions and the seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from chute import _native
from chute.errors import ChuteError
from chute.format.manifest import ShardInfo
from chute.mixture.order import apportion
from chute.order import _key, permutation
from chute.tokens._args import integer
from chute.tokens.source import TokenSource, token_source

__all__ = ["split", "SplitTokens"]

_PURPOSE = 0x5B117  # keys the shard order of splits apart from every other permutation of the seed


class SplitTokens(TokenSource):
    """Part ``name`` of a :func:`split`: documents ``[lo, hi)`` of each shard ``i`` of ``parent`` (``ranges[i]``)."""

    def __init__(self, parent: TokenSource, name: str, ranges: list[tuple[int, int]]) -> None:
        self.parent, self.name, self.ranges = parent, name, [(int(a), int(b)) for a, b in ranges]
        self.root = f"{parent.root} [split {name!r}]"
        self.dtype, self.eos_id, self.cache = parent.dtype, parent.eos_id, parent.cache
        self.dataset = getattr(parent, "dataset", None)  # a token dataset's rows (which() reads documents' fields)
        self._docs = docs = np.asarray(_documents(parent), dtype=np.int64)
        tokens = np.zeros(len(ranges), dtype=np.int64)
        cut: dict[int, np.ndarray] = {}  # shards a boundary cuts: their documents' offsets
        for i, (lo, hi) in enumerate(self.ranges):
            if hi <= lo:
                continue
            if lo == 0 and hi == docs[i]:  # the whole shard: its counts are the source's
                tokens[i] = parent.shard_tokens[i]
            else:  # a boundary cuts it: its offsets say how many tokens the range holds
                _, _, offsets = parent.map(i)
                assert offsets is not None
                cut[i] = offsets[lo : hi + 1]
                tokens[i] = int(cut[i][-1]) - int(cut[i][0])
        self.shard_tokens = tokens
        self.shard_docs = np.asarray([hi - lo for lo, hi in self.ranges], dtype=np.int64)
        self.packed = {  # the sequence counts the source knows: the same for whole shards, counted for cut ones
            length: [_native.tokens_plan(cut[i], length) if i in cut else (c if hi > lo else 0)
                     for i, (c, (lo, hi)) in enumerate(zip(counts, self.ranges))]
            for length, counts in parent.packed.items()
        }
        self.shards = tuple(
            ShardInfo(s.file, int(n), s.bytes, s.checksum, s.compression, s.stored_bytes)
            for s, n in zip(parent.shards, self.shard_docs)
        )

    def __reduce__(self):
        return (SplitTokens, (self.parent, self.name, self.ranges))

    def map(self, i: int, documents: bool = True) -> tuple[np.ndarray, int, np.ndarray | None]:
        lo, hi = self.ranges[i]
        tokens, base, offsets = self.parent.map(i, documents or lo > 0 or hi < int(self._docs[i]))
        if offsets is None:  # the whole shard, tokens only (pack="concat")
            return tokens, base, None
        return tokens, int(offsets[lo]), offsets[lo : hi + 1]

    def set_on_unmap(self, callback: Any) -> None:
        self.parent.set_on_unmap(callback)

    def prepare(self, shards: list[int]) -> None:
        self.parent.prepare(shards)

    def shard_path(self, i: int) -> str:
        return self.parent.shard_path(i)

    def release_direct_holds(self) -> None:
        self.parent.release_direct_holds()

    def close(self) -> None:
        self.parent.close()

    def first_documents(self, counts: np.ndarray) -> np.ndarray:
        """Documents keep their numbers in the source (a dataset's rows): shard ``i``'s first is its ``lo``-th."""
        return self.parent.first_documents(self._docs) + np.asarray([lo for lo, _ in self.ranges], dtype=np.int64)

    @property
    def documents(self) -> int:
        return int(self.shard_docs.sum())


def split(data: Any, fractions: Mapping[str, float], *, seed: int = 0) -> dict[str, SplitTokens]:
    """The documents of ``data`` split into parts of the given ``fractions``, e.g. ``{"train": 0.99, "val": 0.01}``.

    ``data``: a token dataset (or its path/URL), :func:`chute.tokens.megatron` or
    :func:`chute.tokens.flat` files. ``fractions`` are positive numbers, relative
    (``{"train": 969, "val": 30, "test": 1}`` is Megatron's ``--split 969,30,1``).
    Returns one token source per part, in the order given, for
    :func:`chute.tokens.sequences`. The same data, fractions and ``seed`` give
    the same split on any machine; no document is in two parts, and every
    document is in one. See :mod:`chute.tokens.split`.
    """
    source = token_source(data)
    names = [str(n) for n in fractions]
    if not names:
        raise ValueError("split needs at least one part, e.g. {'train': 0.99, 'val': 0.01}")
    weights = []
    for name, value in fractions.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)) \
                or not math.isfinite(value) or value <= 0:
            raise ValueError(f"the fraction of part {name!r} must be a positive number, got {value!r}")
        weights.append(Fraction(value).limit_denominator(10**12) if isinstance(value, float) else Fraction(value))
    seed = integer(seed, "seed", 0, 2**63 - 1)
    docs = np.asarray(_documents(source), dtype=np.int64)
    total = int(docs.sum())
    if total == 0:
        raise ChuteError(f"{source.root} holds no documents to split")
    counts = apportion(total, weights)
    order = permutation(len(docs), _key(seed, _PURPOSE)) if len(docs) > 1 else np.zeros(len(docs), np.int64)
    ranges: list[list[tuple[int, int]]] = [[(0, 0)] * len(docs) for _ in names]
    part, left = 0, counts[0]
    for shard in order.tolist():
        lo, n = 0, int(docs[shard])
        while lo < n:
            while left == 0:
                part += 1
                left = counts[part]
            take = min(left, n - lo)
            ranges[part][shard] = (lo, lo + take)
            lo += take
            left -= take
    return {name: SplitTokens(source, name, r) for name, r in zip(names, ranges)}


def _documents(source: TokenSource) -> np.ndarray:
    """Documents per shard (flat files without known counts: their offsets, mapped once)."""
    counts = np.asarray(source.shard_docs, dtype=np.int64)
    if (counts >= 0).all():
        return counts
    return np.asarray([len(_offsets(source, i)) - 1 for i in range(len(source.shards))], dtype=np.int64)


def _offsets(source: TokenSource, i: int) -> np.ndarray:
    offsets = source.map(i)[2]
    assert offsets is not None  # asked for (documents=True)
    return offsets
