"""Fixed-length training samples of a token source: :func:`sequences` and its view, :class:`Sequences`.

A view reads like a :class:`chute.Dataset` (``shards`` with row counts,
``fixed_columns``, ``read(indices, outs)``, ``get_batch``, ``len``), so the
Loader, ``TorchIterable``, worker threads and processes, the device stage and
the global order take it unchanged. Its rows are *sequences*; its shard ``k``
holds the sequences that start in the source's shard ``k``, and row ``i`` is a
pure function of the shards' token and document counts, ``seq_len`` and the
packing mode:

- ``pack="concat"``: the corpus is one stream (shards, and documents within
  them, in order). Row ``i`` is the window ``stream[i*L : i*L + L + 1]``:
  ``input_ids`` its first ``L`` tokens, ``labels`` its last ``L``. Windows
  overlap by one token and the partial tail is dropped. Opening reads only the
  manifest (token counts per shard).
- ``pack="documents"``: each shard's documents are packed in order into
  sequences of at most ``L`` tokens (next-fit: a document joins the current
  sequence if it fits, else starts the next; a document longer than ``L`` fills
  whole sequences and its remainder starts the next), so every sequence is a
  contiguous range of the shard's tokens followed by padding. Rows add
  ``position_ids`` (restarting at each document piece) and ``cu_seqlens``
  (int32 boundaries of every piece and of the padding over the flattened
  batch, flash-attention's varlen convention); ``labels`` are -100 at padding
  and at each piece's last position. A shard's plan (its sequence boundaries)
  is computed natively when the shard is first read; the number of sequences
  per shard comes from the manifest for the sequence lengths the writer
  counted (powers of two 16-65,536) and otherwise from one native pass over
  each shard's document offsets at opening.

Every batch is one native call (``chute._native.tokens_window`` /
``tokens_packed``) that reads the mapped shards and widens ``uint16``/``uint32``
tokens into the int64 output with the GIL released.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from chute import _native
from chute.errors import ShardError
from chute.format.manifest import ShardInfo
from chute.format.reader import check_indices, get_batch
from chute.format.schema import ColumnType, Ragged, Schema, Tensor
from chute.tokens._args import INT64_MAX, MAX_SEQ_LEN, integer
from chute.tokens.source import TokenSource, token_source

__all__ = ["Sequences", "sequences", "PACKINGS", "check_documents"]

PACKINGS = ("concat", "documents")
IGNORE = -100  # the label of positions that predict nothing (padding, a piece's last token)


def window_counts(shard_tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """``pack="concat"``: how many windows start in each shard (window ``w`` starts at token ``w * seq_len``)."""
    starts = np.zeros(len(shard_tokens) + 1, dtype=np.int64)
    np.cumsum(shard_tokens, out=starts[1:])
    total = int(starts[-1])
    windows = (total - 1) // seq_len if total > seq_len else 0  # window w needs w*L + L + 1 <= total
    first = np.minimum(-(-starts // seq_len), windows)  # ceil(start / L), capped
    return np.diff(first)


def packed_counts(source: TokenSource, seq_len: int) -> np.ndarray:
    """``pack="documents"``: sequences per shard, from the source's description when it has them, else counted."""
    known = source.packed.get(seq_len)
    if known is not None and len(known) == len(source.shards):
        return np.asarray(known, dtype=np.int64)
    counts = np.zeros(len(source.shards), dtype=np.int64)
    for i in range(len(source.shards)):
        _, _, offsets = source.map(i)
        assert offsets is not None  # asked for (documents=True)
        counts[i] = _plan(source, i, offsets, seq_len, None)
    return counts


def check_documents(source: TokenSource, i: int, offsets: np.ndarray) -> None:
    """ShardError unless shard ``i``'s document offsets never decrease (one native pass, nothing allocated).

    :meth:`TokenSource.map` checks only their ends; ``pack="documents"`` checks the rest in the pass that
    plans a shard's sequences, and a reader of documents without a plan (:func:`chute.tokens.which` on
    ``pack="concat"``) calls this."""
    _plan(source, i, offsets, 2**31 - 1, None)


def _plan(source: TokenSource, i: int, offsets: np.ndarray, seq_len: int, out: np.ndarray | None) -> int:
    try:
        return _native.tokens_plan(offsets, seq_len, out)
    except ValueError as exc:
        raise ShardError(
            f"{source.root}: shard {source.shards[i].file} has damaged document offsets ({exc}); "
            "run `chute inspect --verify` on it and write it again"
        ) from None


class Sequences:
    """Fixed-length samples of a token source; make one with :func:`sequences`. Picklable."""

    #: A batch is one native call with the GIL released, ``cu_seqlens`` (the variable-size column of
    #: ``pack="documents"``) included: the Loader treats it as a gather (worker threads from one per core).
    native_batches = True

    def __init__(self, source: TokenSource, seq_len: int, pack: str = "concat", pad_id: int = 0) -> None:
        seq_len = integer(seq_len, "seq_len", 1, MAX_SEQ_LEN)
        pad_id = integer(pad_id, "pad_id", -(2**63), INT64_MAX)
        if pack not in PACKINGS:
            raise ValueError(f"pack must be one of {PACKINGS}, got {pack!r}")
        self.source, self.seq_len, self.pack, self.pad_id = source, seq_len, pack, pad_id
        self.root = f"chute.tokens.sequences({source.root}, seq_len={seq_len}, pack={pack!r})"
        self.itemsize = source.dtype.itemsize
        self.starts = np.zeros(len(source.shards) + 1, dtype=np.int64)  # token offsets of the shards in the stream
        np.cumsum(source.shard_tokens, out=self.starts[1:])
        rows = window_counts(source.shard_tokens, seq_len) if pack == "concat" else packed_counts(source, seq_len)
        self.offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(rows, out=self.offsets[1:])
        self.shards = tuple(
            ShardInfo(s.file, int(r), s.bytes, s.checksum, s.compression, s.stored_bytes) for s, r in zip(source.shards, rows)
        )
        columns: dict[str, ColumnType] = {"input_ids": Tensor("int64", (seq_len,)), "labels": Tensor("int64", (seq_len,))}
        if pack == "documents":
            columns["position_ids"] = Tensor("int64", (seq_len,))
            columns["cu_seqlens"] = Ragged("int32")
        self.schema = Schema.from_dict(columns)
        self.cache = source.cache
        self.progressive = False
        self._sources: list[Any] = [None] * len(self.shards)  # per shard: what the kernel reads, None until mapped
        self._lock = threading.Lock()
        source.set_on_unmap(self._unmap)
        self.read = self._read_window if pack == "concat" else self._read_packed

    def __reduce__(self):
        return (Sequences, (self.source, self.seq_len, self.pack, self.pad_id))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"{self.root}: {len(self)} sequences in {len(self.shards)} shards"

    @property
    def num_tokens(self) -> int:
        """Tokens of the source (all shards)."""
        return int(self.starts[-1])

    @property
    def nbytes(self) -> int:
        """Bytes of one epoch's batches (what the Loader sizes its read-ahead with)."""
        return len(self) * self.seq_len * 8 * len(self.fixed_columns)

    @property
    def fixed_columns(self) -> list[tuple[str, tuple[int, ...], np.dtype, torch.dtype]]:
        names = ["input_ids", "labels"] + (["position_ids"] if self.pack == "documents" else [])
        return [(name, (self.seq_len,), np.dtype(np.int64), torch.int64) for name in names]

    @property
    def variable_columns(self) -> list[str]:
        return ["cu_seqlens"] if self.pack == "documents" else []

    # ------------------------------------------------------------------ shards

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, row within the shard)`` of sequence ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"sequence {index} is out of range for {self.root} of {len(self)} sequences")
        shard = int(np.searchsorted(self.offsets[:-1], index, side="right")) - 1
        while self.offsets[shard + 1] <= index:  # shards without sequences
            shard += 1
        return shard, index - int(self.offsets[shard])

    def shards_of(self, indices: np.ndarray) -> list[int]:
        """The source shards rows ``indices`` read, once each, ascending."""
        idx = np.asarray(indices, dtype=np.int64)
        if self.pack == "documents":
            return np.unique(np.searchsorted(self.offsets, idx, side="right") - 1).tolist()
        first = np.searchsorted(self.starts, idx * self.seq_len, side="right") - 1
        last = np.searchsorted(self.starts, idx * self.seq_len + self.seq_len, side="right") - 1
        spans = [np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]
        shards = np.unique(np.concatenate(spans)) if spans else np.zeros(0, np.int64)
        return [int(s) for s in shards if self.starts[s + 1] > self.starts[s]]

    def reads(self, shard: int) -> list[int]:
        """The source shards that the sequences of ``shard`` read: itself, and for ``concat`` the
        following shards its last windows run into (what a remote pass must download with it)."""
        lo, hi = int(self.offsets[shard]), int(self.offsets[shard + 1])
        if self.pack == "documents" or hi == lo:
            return [shard]
        last = int(np.searchsorted(self.starts, (hi - 1) * self.seq_len + self.seq_len, side="right")) - 1
        return [s for s in range(shard, last + 1) if s == shard or self.starts[s + 1] > self.starts[s]]

    def shard_path(self, i: int) -> str:
        return self.source.shard_path(i)

    def _map(self, i: int) -> None:
        """Map source shard ``i`` (and, documents: plan its sequences) for the kernels."""
        with self._lock:
            if self._sources[i] is not None:
                return
            tokens, base, offsets = self.source.map(i, self.pack == "documents")
            if self.pack == "concat":
                self._sources[i] = (tokens, base)
                return
            assert offsets is not None  # asked for (documents)
            rows = self.shards[i].rows
            plan = np.empty(rows + 1, dtype=np.int64)
            try:  # one native pass: checks the offsets, counts and fills the plan
                _native.tokens_plan(offsets, self.seq_len, plan)
            except ValueError:
                count = _plan(self.source, i, offsets, self.seq_len, None)  # damaged offsets raise ShardError here
                raise ShardError(
                    f"{self.source.root}: shard {self.shards[i].file} packs into {count} sequences of "
                    f"{self.seq_len} tokens, its description says {rows}; write the dataset again"
                ) from None
            self._sources[i] = (tokens, offsets, plan)

    def plan(self, i: int) -> np.ndarray:
        """``pack="documents"``: shard ``i``'s plan, the token offsets (in its mapped tokens) where its sequences
        start, then where the last one ends (mapped and planned if it was not)."""
        if self.pack != "documents":
            raise ValueError(f"{self.root} reads windows of the token stream; only pack='documents' has a plan")
        while True:
            self._map(i)
            mapped = self._sources[i]
            if mapped is not None:  # else unmapped meanwhile (a remote shard evicted): map again
                return mapped[2]

    def _prepare(self, indices: np.ndarray) -> bool:
        """A batch needs shards not mapped yet: let the source prepare them together (their checksums hashed side
        by side with the other ranks'), before they are mapped one by one."""
        missing = [i for i in self.shards_of(indices) if self._sources[i] is None]
        if len(missing) > 1:
            self.source.prepare(missing)
        return True

    def _unmap(self, i: int) -> None:
        self._sources[i] = None

    # ------------------------------------------------------------------ reading

    def _read_window(self, indices: np.ndarray, outs: Sequence[np.ndarray], columnar: bool = False) -> list[Any]:
        """``pack="concat"``: windows ``indices`` into ``outs`` (input_ids, labels), one native call."""
        prepared = False
        while True:
            try:
                _native.tokens_window(indices, self.seq_len, self.starts, self._sources, self.itemsize, outs[0], outs[1])
                return []
            except _native.Unmapped as missing:
                prepared = prepared or self._prepare(indices)
                self._map(missing.shard)
            except _native.CorruptShard as exc:
                raise self._corrupt(exc) from None

    def _read_packed(self, indices: np.ndarray, outs: Sequence[np.ndarray], columnar: bool = False) -> list[Any]:
        """``pack="documents"``: sequences ``indices`` into ``outs`` (input_ids, labels, position_ids); returns
        ``[cu_seqlens]`` of the batch (its own array: the batch's user may keep it; a Python call or two per batch,
        bounded by tests/tokens/test_calls.py)."""
        cu = np.empty(outs[0].size + 1, dtype=np.int32)  # at most one segment per position, + the leading 0
        prepared = False
        while True:
            try:
                count = _native.tokens_packed(
                    indices, self.offsets, self._sources, self.itemsize, self.seq_len, self.pad_id,
                    outs[0], outs[1], outs[2], cu,
                )
                return [torch.from_numpy(cu[:count])]
            except _native.Unmapped as missing:
                prepared = prepared or self._prepare(indices)
                self._map(missing.shard)
            except _native.CorruptShard as exc:
                raise self._corrupt(exc) from None

    def _corrupt(self, exc: Any) -> ShardError:
        shard = exc.shard
        name = self.shards[shard].file if 0 <= shard < len(self.shards) else "?"
        return ShardError(
            f"{self.source.root}: shard {name} is corrupt ({exc}); run `chute inspect --verify` on it and write it again"
        )

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None,
                  *, columnar: bool = False) -> dict[str, Any]:
        """Sequences ``indices`` as a batch: ``input_ids``, ``labels`` (and ``position_ids``, ``cu_seqlens``)."""
        return get_batch(self, indices, out, columnar)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, (np.integer, torch.Tensor)):
            index = int(index)
        if not isinstance(index, int):
            raise TypeError(f"sequence indices must be integers, not {type(index).__name__}; use get_batch for many")
        if index < 0:
            index += len(self)
        batch = self.get_batch(check_indices([index], len(self), self.root))
        return {name: value[0] if name != "cu_seqlens" else value for name, value in batch.items()}

    def release_direct_holds(self) -> None:
        self.source.release_direct_holds()

    def close(self) -> None:
        """Drop the mappings (shards are mapped again on the next read)."""
        with self._lock:
            self._sources = [None] * len(self.shards)
        self.source.close()

    def __enter__(self) -> Sequences:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sequences(data: Any, seq_len: int, *, pack: str = "concat", pad_id: int = 0) -> Sequences:
    """Fixed-length training samples of a token dataset, for :class:`chute.Loader` and everything that reads datasets.

    ``data``: a token dataset (``chute.tokens.write``; a :class:`chute.Dataset`
    or its path/URL) or existing token files (:func:`chute.tokens.megatron`,
    :func:`chute.tokens.flat`). Batches are dicts of int64 tensors
    ``input_ids`` and ``labels`` of shape ``[B, seq_len]``; with
    ``pack="documents"`` also ``position_ids`` and ``cu_seqlens`` (int32). See
    :mod:`chute.tokens.sequences` and docs/tokens.md for the exact semantics.
    """
    return Sequences(token_source(data), seq_len, pack, pad_id)
