"""Where a sequence view's tokens come from: a token source, shard by shard.

A *token source* tells a :class:`chute.tokens.Sequences` view, from its
description alone (O(shards), nothing mapped), how many tokens and documents
each shard holds; when a shard is first read it maps it and hands out two
zero-copy arrays: the shard's flat tokens (``uint16`` or ``uint32``) and its
documents' int64 offsets into them. Three kinds exist:

- :class:`DatasetTokens`: a chute token dataset (``chute.tokens.write``, local
  or remote through the node cache);
- :class:`chute.tokens.files.MegatronTokens` and
  :class:`chute.tokens.files.NumpyTokens`: existing token files read in place.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from chute.errors import ManifestError, ShardError
from chute.format.manifest import ShardInfo
from chute.tokens.writer import COLUMN, METADATA_KEY

__all__ = ["TokenSource", "DatasetTokens", "token_source"]


class TokenSource:
    """What a sequence view reads: per shard, its tokens and document offsets.

    Attributes (set by subclasses): ``root`` (names the data in messages),
    ``dtype`` (numpy ``uint16``/``uint32``), ``eos_id``, ``shards`` (one
    :class:`ShardInfo` per shard: file, bytes), ``shard_tokens`` and
    ``shard_docs`` (int64 arrays), ``cache`` (the node cache of a remote
    dataset, else None), ``packed`` (``{seq_len: sequences per shard}`` known
    without reading the shards).
    """

    root: str
    dtype: np.dtype
    eos_id: int | None
    shards: tuple[ShardInfo, ...]
    shard_tokens: np.ndarray
    shard_docs: np.ndarray
    cache: Any = None
    packed: dict[int, list[int]]

    def map(self, i: int, documents: bool = True) -> tuple[np.ndarray, int, np.ndarray | None]:
        """Shard ``i``: ``(tokens, base, doc_offsets)``; its tokens are ``tokens[base : base + shard_tokens[i]]``
        and ``doc_offsets`` (int64, absolute in ``tokens``) bound its documents (may be None unless ``documents``).

        Checked here: the offsets' first entry is ``base`` and their last ``base + shard_tokens[i]``, inside
        ``tokens``. Not checked (O(documents)): that they never decrease. A reader that uses the offsets between
        the first and last checks that itself (:func:`chute.tokens.sequences.check_documents`, or the packing
        plan, which checks it in the same pass)."""
        raise NotImplementedError

    def set_on_unmap(self, callback: Any) -> None:
        """``callback(i)`` is called when shard ``i``'s mapping goes (a remote shard evicted from the cache)."""

    def prepare(self, shards: list[int]) -> None:
        """Shards ``shards`` are about to be mapped together (one batch's): do what can be done for them at once."""

    def shard_path(self, i: int) -> str:
        raise NotImplementedError

    def release_direct_holds(self) -> None:
        """A loader's pass starts: let go of shards held for direct reads (remote)."""

    def close(self) -> None:
        """Unmap everything (mapped again on the next read)."""

    @property
    def nbytes(self) -> int:
        return int(self.shard_tokens.sum()) * self.dtype.itemsize

    def first_documents(self, counts: np.ndarray) -> np.ndarray:
        """Per shard, the number (from 0, over all of the data) of its first document; ``counts`` are the
        documents per shard (:attr:`shard_docs`, or counted where unknown)."""
        first = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        return first


class DatasetTokens(TokenSource):
    """The tokens of a chute token dataset (one ``tokens`` column, a row per document)."""

    def __init__(self, dataset: Any) -> None:
        meta = dataset.metadata.get(METADATA_KEY)
        if not isinstance(meta, dict) or COLUMN not in dataset.schema.names:
            raise ShardError(
                f"dataset {dataset.root} is not a token dataset (its manifest has no {METADATA_KEY!r} metadata); "
                "write one with chute.tokens.write or `chute convert ... --tokenizer`"
            )
        self.dataset = dataset
        self.root = dataset.root
        self.shards = tuple(dataset.shards)
        checked = check_metadata(meta, self.shards, dataset.schema[COLUMN], self.root)
        self.dtype, self.eos_id, self.shard_tokens, self.packed = checked
        self.shard_docs = np.asarray([s.rows for s in self.shards], dtype=np.int64)
        self.cache = dataset.cache
        self._lock = threading.Lock()
        # Opening a shard must cost O(1), not a walk over its millions of document offsets: the offsets
        # are checked where they are used (see map), so the dataset skips Arrow's full walk of them.
        dataset.defer_offset_checks([COLUMN])

    def __reduce__(self):
        return (DatasetTokens, (self.dataset,))

    def map(self, i: int, documents: bool = True) -> tuple[np.ndarray, int, np.ndarray]:
        shard = self.dataset.shard(i)
        (offsets, data), _ = shard.sources[COLUMN]
        tokens = np.frombuffer(data, dtype=self.dtype) if len(data) else np.empty(0, self.dtype)
        base = int(offsets[0]) if len(offsets) else 0
        held = int(offsets[-1]) - base if len(offsets) else 0
        if base != 0:
            raise ShardError(
                f"dataset {self.root}: shard {self.shards[i].file} is damaged: its document offsets start at "
                f"{base}, not 0; run `chute inspect --verify` on the dataset and write it again"
            )
        if held != int(self.shard_tokens[i]) or base + held > len(tokens):
            raise ShardError(
                f"dataset {self.root}: shard {self.shards[i].file} holds {held} tokens, the manifest says "
                f"{int(self.shard_tokens[i])}; run `chute inspect --verify` on the dataset and write it again"
            )
        return tokens, base, offsets

    def prepare(self, shards: list[int]) -> None:
        """Their checksums, hashed side by side with the other processes opening the dataset (Dataset.check_ahead)."""
        self.dataset.check_ahead(shards)

    def set_on_unmap(self, callback: Any) -> None:
        cache = self.cache
        if cache is None:
            return
        previous = cache.on_unpin

        def on_unpin(i: int) -> None:
            if previous is not None:
                previous(i)
            callback(i)

        cache.on_unpin = on_unpin

    def shard_path(self, i: int) -> str:
        return self.dataset.shard_path(i)

    def release_direct_holds(self) -> None:
        self.dataset.release_direct_holds()

    def close(self) -> None:
        self.dataset.close()


def check_metadata(
    meta: dict, shards: tuple[ShardInfo, ...], column: Any, root: str
) -> tuple[np.dtype, int | None, np.ndarray, dict[int, list[int]]]:
    """The manifest's token description, bounded before anything is sized from it: ``(dtype, eos_id, shard_tokens,
    packed)``, or a ManifestError naming the field (a hand-edited or damaged manifest, never a MemoryError)."""

    def bad(field: str, why: str) -> ManifestError:
        return ManifestError(
            f"dataset {root}: the manifest's metadata field {METADATA_KEY}.{field} {why}; the manifest is damaged: "
            "write the dataset again (or restore its manifest.json)"
        )

    def count(value: Any, field: str, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise bad(field, f"is {value!r}, not an integer from 0 to {high}")
        return value

    dtype = meta.get("dtype")
    if dtype not in ("uint16", "uint32"):
        raise bad("dtype", f"is {dtype!r}, not 'uint16' or 'uint32'")
    if getattr(column, "dtype", dtype) != dtype:
        raise bad("dtype", f"is {dtype!r} but the column {COLUMN!r} holds {column.dtype}")
    numpy = np.dtype(dtype)
    vocab = meta.get("vocab_size")
    if vocab is not None:
        count(vocab, "vocab_size", 2**32)
    eos = meta.get("eos_id")
    if eos is not None:
        count(eos, "eos_id", (vocab if vocab else 2**32) - 1)
    listed = meta.get("shard_tokens")
    if not isinstance(listed, list) or len(listed) != len(shards):
        what = f"a list of {len(listed)}" if isinstance(listed, list) else repr(type(listed).__name__)
        raise bad("shard_tokens", f"is {what}, not a list of one token count per shard ({len(shards)})")
    tokens = [count(n, f"shard_tokens[{i}]", s.bytes // numpy.itemsize) for i, (n, s) in enumerate(zip(listed, shards))]
    packed: dict[int, list[int]] = {}
    table = meta.get("packed") or {}
    if not isinstance(table, dict):
        raise bad("packed", f"is a {type(table).__name__}, not a mapping of sequence lengths to counts")
    for key, counts in table.items():
        if not (isinstance(key, str) and key.isdigit() and 1 <= int(key) < 2**31):
            raise bad("packed", f"has the key {key!r}, not a sequence length")
        if not isinstance(counts, list) or len(counts) != len(shards):
            raise bad(f"packed[{key}]", f"is not a list of one sequence count per shard ({len(shards)})")
        # a sequence holds at least one token: a count above the shard's tokens is damage, not a plan to allocate
        packed[int(key)] = [count(c, f"packed[{key}][{i}]", tokens[i]) for i, c in enumerate(counts)]
    return numpy, eos, np.asarray(tokens, dtype=np.int64), packed


def token_source(data: Any) -> TokenSource:
    """A token source for ``data``: a token source, a chute token dataset, or its path/URL."""
    if isinstance(data, TokenSource):
        return data
    import os

    if isinstance(data, (str, os.PathLike)):
        from chute.storage.open import open_dataset

        data = open_dataset(data)
    if hasattr(data, "manifest") and hasattr(data, "shard"):
        return DatasetTokens(data)
    raise TypeError(
        f"chute.tokens.sequences reads a token dataset (chute.tokens.write, chute.open), a path to one, or "
        f"chute.tokens.megatron(...) / chute.tokens.flat(...), got {type(data).__name__}"
    )
