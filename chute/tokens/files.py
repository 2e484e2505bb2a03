"""Existing token files read in place: Megatron-LM indexed datasets and flat numpy token arrays.

Both are :class:`chute.tokens.source.TokenSource` objects, so
:func:`chute.tokens.sequences` reads them exactly like a chute token dataset.
Each file is one shard, memory-mapped read-only where it lies: nothing is
copied or converted, and opening reads only headers (file sizes, the index's
counts).

**Megatron-LM** (``megatron(prefix)``): ``prefix.bin`` holds the tokens of
every sequence back to back; ``prefix.idx`` is the MMIDIDX index::

    b"MMIDIDX\\x00\\x00"  version <Q (1)  dtype code <B  sequences <Q  document indices <Q
    sequence lengths   int32[sequences]
    sequence pointers  int64[sequences]   (byte offsets into .bin)
    document indices   int64[document indices]

Each Megatron *sequence* is one document here (as Megatron's GPTDataset
reads them). Token dtypes: uint16 (code 8) and int32 (code 4, read as
uint32: ids are never negative).

**Flat arrays** (``flat(path)``): a ``.npy`` file, or a raw file of
``dtype`` tokens (nanoGPT/OLMo style). Document boundaries come from
``eos_id`` (each document ends with it) or, without one, the file is one
document.

Document offsets (``pack="documents"`` only) are computed when a shard is
first read: from the index's lengths (8 bytes per document) or by one scan for
``eos_id`` (flat files); ``pack="concat"`` needs neither.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute.errors import ChuteError, ShardError
from chute.format.manifest import ShardInfo
from chute.tokens.source import TokenSource

__all__ = ["MegatronTokens", "FlatTokens", "megatron", "flat", "MEGATRON_HEADER"]

MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES: dict[int, np.dtype] = {8: np.dtype(np.uint16), 4: np.dtype(np.uint32)}  # int32 ids are read as uint32 (never negative)
_HEADER = struct.Struct("<QBQQ")


def _paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    out = [os.fspath(p) for p in paths]
    if not out:
        raise ValueError("give at least one file")
    return out


class _Files(TokenSource):
    """Files mapped on first use in each process (a pickled source maps them again where it is unpickled)."""

    def __init__(self) -> None:
        self._maps: dict[tuple[int, bool], tuple[np.ndarray, int, np.ndarray | None]] = {}
        self._lock = threading.Lock()
        self.cache = None
        self.packed = {}

    def map(self, i: int, documents: bool = True) -> tuple[np.ndarray, int, np.ndarray | None]:
        key = (i, documents)
        mapped = self._maps.get(key)
        if mapped is None:
            with self._lock:
                mapped = self._maps.get(key)
                if mapped is None:
                    mapped = self._maps[key] = self._map(i, documents)
        return mapped

    def _map(self, i: int, documents: bool) -> tuple[np.ndarray, int, np.ndarray | None]:
        raise NotImplementedError

    def shard_path(self, i: int) -> str:
        return self.shards[i].file

    def _documents(self) -> np.ndarray:
        """Documents per file (flat files with ``eos_id``: counted once, by the scan that finds their ends)."""
        if (self.shard_docs < 0).any():
            self.shard_docs = np.asarray([len(self._offsets(i)) - 1 for i in range(len(self.shards))], dtype=np.int64)
        return self.shard_docs

    def _offsets(self, i: int) -> np.ndarray:
        offsets = self.map(i)[2]
        assert offsets is not None  # asked for (documents=True)
        return offsets

    def __len__(self) -> int:
        """The number of documents."""
        return int(self._documents().sum())

    def __getitem__(self, index: int) -> np.ndarray:
        """Document ``index`` (counted over all the files, from 0): its token ids, a read-only view of the file."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"document indices must be integers, not {type(index).__name__}")
        counts = self._documents()
        total = int(counts.sum())
        position = int(index) + (total if index < 0 else 0)
        if not 0 <= position < total:
            raise IndexError(f"document {index} is out of range for {self.root} of {total} documents")
        ends = np.cumsum(counts)
        shard = int(np.searchsorted(ends, position, side="right"))
        d = position - (int(ends[shard - 1]) if shard else 0)
        tokens, _, offsets = self.map(shard)
        assert offsets is not None
        return tokens[int(offsets[d]) : int(offsets[d + 1])]

    def close(self) -> None:
        with self._lock:
            self._maps = {}


class MegatronTokens(_Files):
    """Megatron-LM indexed datasets (``prefix.bin`` + ``prefix.idx``), one shard per prefix; see :func:`megatron`."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        super().__init__()
        self.prefixes = list(prefixes)
        self.root = self.prefixes[0] if len(self.prefixes) == 1 else f"{self.prefixes[0]} (+{len(self.prefixes) - 1})"
        self.eos_id = None
        dtypes, shards, tokens, docs, self._index = [], [], [], [], []
        for prefix in self.prefixes:
            dtype, count, index, described = _read_index(prefix)
            size = _size(prefix + ".bin")
            if size != described:
                raise ShardError(
                    f"{prefix}.bin holds {size} bytes but {prefix}.idx describes {described} ({count} sequences of "
                    f"{dtype} tokens): the .bin is truncated or damaged, or the two files belong to different datasets; "
                    "write them again (or give the prefix of the matching pair)"
                )
            dtypes.append(dtype)
            shards.append(ShardInfo(prefix + ".bin", count, size, ""))
            tokens.append(size // dtype.itemsize)
            docs.append(count)
            self._index.append(index)
        if len(set(dtypes)) > 1:
            raise ChuteError(f"the Megatron datasets {self.prefixes} store different token dtypes {dtypes}; read them apart")
        self.dtype = dtypes[0]
        self.shards = tuple(shards)
        self.shard_tokens = np.asarray(tokens, dtype=np.int64)
        self.shard_docs = np.asarray(docs, dtype=np.int64)

    def __reduce__(self):
        return (MegatronTokens, (self.prefixes,))

    def _map(self, i: int, documents: bool) -> tuple[np.ndarray, int, np.ndarray | None]:
        prefix = self.prefixes[i]
        tokens = _memmap(prefix + ".bin", self.dtype)
        if not documents:
            return tokens, 0, None
        lengths_at, count = self._index[i]
        index = np.memmap(prefix + ".idx", dtype=np.uint8, mode="r")
        lengths = np.frombuffer(index, dtype=np.int32, count=count, offset=lengths_at)
        pointers = np.frombuffer(index, dtype=np.int64, count=count, offset=lengths_at + 4 * count)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if count and (int(lengths.min()) < 0 or not np.array_equal(pointers, offsets[:-1] * self.dtype.itemsize)
                      or int(offsets[-1]) != len(tokens)):
            raise ShardError(
                f"{prefix}.idx does not describe {prefix}.bin: sequence lengths and pointers disagree with each other "
                f"or with the {len(tokens)} tokens of the .bin; the index is damaged or belongs to another file"
            )
        return tokens, 0, offsets


def _read_index(prefix: str) -> tuple[np.dtype, int, tuple[int, int], int]:
    """The token dtype, the number of sequences, where the lengths start in ``prefix.idx``, and the size in bytes
    the index says ``prefix.bin`` has (where its last sequence ends; read from the index in O(1))."""
    path = prefix + ".idx"
    start = len(MEGATRON_HEADER) + _HEADER.size
    try:
        with open(path, "rb") as f:
            head = f.read(start)
            if head[: len(MEGATRON_HEADER)] != MEGATRON_HEADER or len(head) < start:
                raise ShardError(f"{path} is not a Megatron-LM index (it does not start with {MEGATRON_HEADER!r})")
            version, code, sequences, documents = _HEADER.unpack_from(head, len(MEGATRON_HEADER))
            if version != 1:
                raise ShardError(f"{path} is a Megatron-LM index of version {version}; chute reads version 1")
            dtype = MEGATRON_DTYPES.get(code)
            if dtype is None:
                raise ShardError(
                    f"{path} stores tokens with dtype code {code}; chute reads uint16 (8) and int32 (4) token ids"
                )
            size = os.fstat(f.fileno()).st_size
            if sequences * (4 + 8) + documents * 8 > size - start:
                raise ShardError(f"{path} holds {size} bytes, too few for {sequences} sequences; the index is truncated")
            described = 0
            if sequences:  # the last sequence's pointer and length: where the .bin ends
                f.seek(start + 4 * (sequences - 1))
                (length,) = struct.unpack("<i", f.read(4))
                f.seek(start + 4 * sequences + 8 * (sequences - 1))
                (pointer,) = struct.unpack("<q", f.read(8))
                if length < 0 or pointer < 0:
                    raise ShardError(f"{path}: its last sequence has length {length} at byte {pointer}; the index is damaged")
                described = pointer + length * dtype.itemsize
    except FileNotFoundError:
        raise ChuteError(f"{path} is missing: a Megatron-LM dataset is a prefix with a .bin and an .idx file") from None
    return dtype, int(sequences), (start, int(sequences)), described
def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        raise ChuteError(f"{path} is missing") from None


def _memmap(path: str, dtype: np.dtype, offset: int = 0, count: int | None = None) -> np.ndarray:
    size = _size(path)
    if count is None:
        count = (size - offset) // dtype.itemsize
    if count == 0:
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


class FlatTokens(_Files):
    """Flat token arrays (``.npy`` or raw files of ``dtype``), one shard per file; see :func:`flat`."""

    def __init__(self, paths: Sequence[str], dtype: Any = None, eos_id: int | None = None) -> None:
        super().__init__()
        self.paths = list(paths)
        self.root = self.paths[0] if len(self.paths) == 1 else f"{self.paths[0]} (+{len(self.paths) - 1})"
        self.eos_id = None if eos_id is None else int(eos_id)
        self._given = dtype
        self._layout = [_flat_layout(p, dtype) for p in self.paths]  # (dtype, data offset, tokens)
        dtypes = {d for d, _, _ in self._layout}
        if len(dtypes) > 1:
            raise ChuteError(f"the token files {self.paths} store different dtypes {sorted(map(str, dtypes))}; read them apart")
        self.dtype = self._layout[0][0]
        self.shard_tokens = np.asarray([n for _, _, n in self._layout], dtype=np.int64)
        self.shard_docs = np.full(len(self.paths), -1, dtype=np.int64)  # unknown until read (eos_id)
        self.shards = tuple(ShardInfo(p, 0, _size(p), "") for p in self.paths)

    def __reduce__(self):
        return (FlatTokens, (self.paths, self._given, self.eos_id))

    def _map(self, i: int, documents: bool) -> tuple[np.ndarray, int, np.ndarray | None]:
        dtype, offset, count = self._layout[i]
        tokens = _memmap(self.paths[i], dtype, offset, count)
        if not documents:
            return tokens, 0, None
        if self.eos_id is None:
            ends = np.zeros(0, dtype=np.int64)
        else:
            ends = np.flatnonzero(tokens == self.eos_id) + 1  # a document ends with its eos token
        offsets = np.concatenate([[0], ends[ends < count], [count]]).astype(np.int64) if count else np.zeros(1, np.int64)
        return tokens, 0, offsets


def _flat_layout(path: str, dtype: Any) -> tuple[np.dtype, int, int]:
    """``(token dtype, byte offset of the data, tokens)`` of a flat token file."""
    if path.endswith(".npy"):
        try:
            with open(path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, fortran, stored = read(f)
                offset = f.tell()
        except FileNotFoundError:
            raise ChuteError(f"{path} is missing") from None
        except ValueError as exc:
            raise ShardError(f"{path} is not a readable .npy file ({exc})") from None
        if len(shape) != 1:
            raise ChuteError(f"{path} holds an array of shape {shape}; a token file is one flat array (1-D)")
        if dtype is not None and np.dtype(dtype) != stored:
            raise ChuteError(f"{path} stores {stored} tokens, not the {np.dtype(dtype)} given")
        return _token_dtype(path, stored), offset, int(shape[0])
    if dtype is None:
        raise ChuteError(f"{path} is a raw token file: pass dtype= (e.g. 'uint16') to read it")
    dt = np.dtype(dtype)
    size = _size(path)
    if size % dt.itemsize:
        raise ShardError(f"{path} holds {size} bytes, not a whole number of {dt} tokens")
    return _token_dtype(path, dt), 0, size // dt.itemsize


def _token_dtype(path: str, dtype: np.dtype) -> np.dtype:
    if dtype == np.uint16:
        return np.dtype(np.uint16)
    if dtype in (np.dtype(np.uint32), np.dtype(np.int32)) and dtype.byteorder in "=<|":
        return np.dtype(np.uint32)  # int32 ids are never negative: read as uint32
    raise ChuteError(f"{path} stores {dtype} tokens; chute reads uint16, uint32 and int32 token files")


def megatron(prefixes: str | os.PathLike | Sequence[str | os.PathLike]) -> MegatronTokens:
    """Megatron-LM indexed datasets, read in place: ``prefix`` names ``prefix.bin`` and ``prefix.idx``.

    Several prefixes are read as one corpus (one shard each, in order). Pass the
    result to :func:`chute.tokens.sequences`.
    """
    return MegatronTokens(_paths(prefixes))


def flat(paths: str | os.PathLike | Sequence[str | os.PathLike], *, dtype: Any = None, eos_id: int | None = None) -> FlatTokens:
    """Flat token files read in place: ``.npy`` arrays or raw files of ``dtype`` (uint16, uint32, int32).

    ``eos_id``: each document ends with this token (its boundaries for
    ``pack="documents"``); without it a file is one document. Several files are
    read as one corpus (one shard each, in order).
    """
    return FlatTokens(_paths(paths), dtype, eos_id)
