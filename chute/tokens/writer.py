"""Writing a token dataset: documents of token ids in, a chute dataset out.

A token dataset is an ordinary chute dataset (docs/format.md, "Token
datasets") with one column, ``tokens``, a :class:`chute.Ragged` column of
the narrowest unsigned dtype that holds the vocabulary (``uint16`` up to
65,536 ids, else ``uint32``) and one row per document. In each shard that is
one flat token buffer plus the documents' int64 offsets (Arrow's
``large_list``), both memory-mapped by readers. The manifest's metadata key
``"tokens"`` records the dtype, vocabulary, end-of-document id and the number
of tokens of every shard, so a reader learns where each shard's tokens sit in
the corpus from the manifest alone (O(shards), no shard opened).

Writing goes through :class:`chute.Writer` (lock, temporary names, checksums,
manifest last, remote upload), so a token dataset is as atomic as any other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from chute import _native
from chute._sizes import parse_size
from chute.errors import ChuteError, SchemaError
from chute.format.manifest import Manifest
from chute.format.schema import ColumnType, Json, Ragged, Scalar, Schema, String
from chute.format.writer import ShardWriter
from chute.storage.write import Writer
from chute.tokens._args import optional_integer

__all__ = ["TokenWriter", "write", "METADATA_KEY", "COLUMN", "dtype_for"]

METADATA_KEY = "tokens"
COLUMN = "tokens"
DEFAULT_SHARD_SIZE = "128MB"
#: Sequence lengths whose document packing the writer counts per shard (``metadata["tokens"]["packed"]``), so
#: that ``sequences(..., pack="documents")`` learns its length from the manifest alone.
PACKED_LENGTHS = tuple(2**k for k in range(4, 17))
_UINT16_IDS = 1 << 16
_UINT32_IDS = 1 << 32


def dtype_for(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds token ids ``0 .. vocab_size - 1``."""
    if vocab_size <= _UINT16_IDS:
        return "uint16"
    if vocab_size <= _UINT32_IDS:
        return "uint32"
    raise SchemaError(f"a vocabulary of {vocab_size} ids does not fit uint32; token datasets hold at most 2**32 ids")


class _TokenShards(ShardWriter):
    """A :class:`ShardWriter` fed whole documents (arrays), building each shard with a few numpy calls.

    Columns beside ``tokens`` (a converted corpus's origin and kept fields) come as one value per document,
    already in their Arrow form (int64s, or strings for ``String``/``Json`` columns)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        column = self.schema[COLUMN]
        assert isinstance(column, Ragged), column  # TokenWriter._start's schema
        self.numpy = np.dtype(column.dtype)
        self.extra_names = [name for name in self.schema.names if name != COLUMN]
        self.parts: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.extra: dict[str, list[Any]] = {name: [] for name in self.extra_names}
        self.shard_tokens: list[int] = []
        self.packed: dict[int, list[int]] = {n: [] for n in PACKED_LENGTHS}

    def add(self, flat: np.ndarray, lengths: np.ndarray, extra: Mapping[str, Any] | None = None,
            extra_bytes: np.ndarray | None = None) -> None:
        """Documents ``lengths`` (int64) whose tokens are ``flat`` one after the other (already checked), with
        ``extra[name]`` (one value per document, ``extra_bytes`` their sizes) for the other columns."""
        itemsize = self.numpy.itemsize
        while len(lengths):
            room = max(0, self.shard_size - self.bytes)
            sizes = lengths * itemsize + 8 if extra_bytes is None else lengths * itemsize + 8 + extra_bytes
            ends = np.cumsum(sizes)
            take = int(np.searchsorted(ends, room, side="left")) + 1  # the document that fills the shard goes in it
            take = min(take, len(lengths))
            count = int(lengths[:take].sum())
            self.parts.append(flat[:count].astype(self.numpy, copy=False))
            self.lengths.append(lengths[:take])
            if extra is not None:
                for name in self.extra_names:
                    self.extra[name].append(extra[name][:take])
                    extra = {**extra, name: extra[name][take:]}
                extra_bytes = None if extra_bytes is None else extra_bytes[take:]
            self.rows += take
            self.bytes += int(ends[take - 1])
            flat, lengths = flat[count:], lengths[take:]
            if self.bytes >= self.shard_size:
                self.flush()

    def flush(self) -> None:
        if self.rows == 0:
            return
        lengths = np.concatenate(self.lengths)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(self.parts) if self.parts else np.empty(0, self.numpy)
        columns = [pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))]
        for name in self.extra_names:
            field = self.arrow_schema.field(name)
            parts = self.extra[name]
            if pa.types.is_integer(field.type):
                columns.append(pa.array(np.concatenate(parts) if parts else np.zeros(0, np.int64), type=field.type))
            else:
                columns.append(pa.array([v for part in parts for v in part], type=field.type))
        self.write_batch(pa.record_batch(columns, schema=self.arrow_schema))
        self.shard_tokens.append(int(offsets[-1]))
        for n, counts in self.packed.items():
            counts.append(_native.tokens_plan(offsets, n))
        self.parts, self.lengths, self.rows, self.bytes = [], [], 0, 0
        self.extra = {name: [] for name in self.extra_names}

    def discard(self) -> None:
        super().discard()
        self.shard_tokens.clear()
        for counts in self.packed.values():
            counts.clear()


class TokenWriter:
    """Writes documents of token ids into a token dataset at ``path``; see :func:`write`.

    Use as a context manager (an exception discards everything written)::

        with chute.tokens.TokenWriter("/data/corpus", vocab_size=50257, eos_id=50256) as w:
            for ids in documents:
                w.append(ids)
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        vocab_size: int | None = None,
        eos_id: int | None = None,
        shard_size: int | str = DEFAULT_SHARD_SIZE,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        compression: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        durable: bool = True,
        columns: Mapping[str, ColumnType] | None = None,
    ) -> None:
        self.columns = _check_columns(columns)
        vocab_size = optional_integer(vocab_size, "vocab_size", 1, _UINT32_IDS)
        eos_id = optional_integer(eos_id, "eos_id", 0, _UINT32_IDS - 1)
        if eos_id is not None and vocab_size is not None and eos_id >= vocab_size:
            raise ValueError(f"eos_id {eos_id} is not a token id of a vocabulary of {vocab_size} ids")
        metadata = dict(metadata or {})
        if METADATA_KEY in metadata:
            raise ValueError(f"metadata key {METADATA_KEY!r} is reserved for the token dataset's description")
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.shard_size = max(1, parse_size(shard_size))
        self._writer = Writer(
            path, shard_size=self.shard_size, metadata=metadata, overwrite=overwrite, compression=compression,
            storage_options=storage_options, durable=durable,
        )
        self.url = self._writer.url
        self.dtype: str | None = None
        self._limit = vocab_size  # token ids must be below this
        self._shards: _TokenShards | None = None
        self._pending: list[tuple[np.ndarray, dict[str, Any] | None, np.ndarray | None]] = []  # before the dtype is
        # known (no vocab_size): the first shard's documents (tokens, other columns' values, their bytes)
        self._pending_bytes = 0
        self.documents = 0
        self.tokens = 0
        if vocab_size is not None:
            self._start(dtype_for(vocab_size))

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _start(self, dtype: str) -> _TokenShards:
        self.dtype = dtype
        if self._limit is None:
            self._limit = _UINT16_IDS if dtype == "uint16" else _UINT32_IDS
        w = self._writer
        schema = Schema.from_dict({COLUMN: Ragged(dtype), **self.columns})
        w._set_schema(schema)
        w.part = self._shards = _TokenShards(
            w.root, schema, token=w.token, shard_size=w.shard_size, checksum=w.checksum, durable=w.durable, upload=w.upload,
        )
        return self._shards

    def _check(self, doc: Any, position: int | None = None) -> np.ndarray:
        """Document ``doc`` as a 1-D int64 array with its end token, or SchemaError naming it (``position``)."""
        position = self.documents if position is None else position
        if hasattr(doc, "detach"):  # a torch tensor
            doc = doc.detach().cpu().numpy()
        array = np.asarray(doc)
        if array.ndim != 1:
            raise SchemaError(
                f"document {position} is a {array.ndim}-D array of shape {array.shape}; chute.tokens.write takes "
                "1-D arrays of token ids, one per document"
            )
        array = self._ids(array, lambda at: position)
        if self.eos_id is not None:
            array = np.append(array, np.int64(self.eos_id))
        return array

    def _ids(self, array: np.ndarray, document: Any) -> np.ndarray:
        """``array`` (1-D) as int64 token ids, each checked against the dtype and vocabulary *before* it is converted
        (a uint64 or Python int of 2**32 or more never wraps); ``document(i)`` numbers the document of element ``i``."""
        if not array.size:
            return np.zeros(0, np.int64)
        if array.dtype == object:  # Python ints too large for int64, or values that are no integers at all
            for i, value in enumerate(array.tolist()):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise SchemaError(f"document {document(i)} holds a {type(value).__name__} value; token ids must be integers")
                self._check_id(int(value), document(i))
            return np.asarray(array.tolist(), dtype=np.int64)  # all checked: they fit
        if not (np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_):
            raise SchemaError(f"document {document(0)} holds {array.dtype} values; token ids must be integers")
        lo, hi = int(array.min()), int(array.max())  # exact Python ints, whatever the dtype
        limit = self._limit if self._limit is not None else _UINT32_IDS
        if lo < 0 or hi >= limit:
            bad = int(np.flatnonzero((array < 0) | (array >= limit))[0])
            self._check_id(int(array[bad]), document(bad))
        return array.astype(np.int64, copy=False)

    def _check_id(self, value: int, document: int) -> None:
        """SchemaError naming ``document`` unless ``value`` is a token id this dataset can store."""
        if value < 0:
            raise SchemaError(f"document {document} holds token id {value}; token ids cannot be negative")
        if self.vocab_size is not None and value >= self.vocab_size:
            raise SchemaError(f"document {document} holds token id {value}, outside the vocabulary of {self.vocab_size} ids")
        if value >= _UINT32_IDS:
            raise SchemaError(
                f"document {document} holds token id {value}; token ids must be below 2**32 (uint32, the widest "
                "token dtype): is this array token ids?"
            )
        if self._limit is not None and value >= self._limit:
            raise SchemaError(
                f"document {document} holds token id {value}, which does not fit the {self.dtype} chosen from the "
                f"first shard's tokens; pass vocab_size= so the dtype is chosen from the vocabulary"
            )

    def append(self, doc: Any, values: Mapping[str, Any] | None = None) -> None:
        """Add one document (a 1-D array of token ids), with ``values[name]`` for each column declared in ``columns=``."""
        if self._writer.closed:
            raise ChuteError(f"the token writer for {self.url} is closed")
        array = self._check(doc)
        encoded, nbytes = self._encode(None if values is None else {k: [v] for k, v in values.items()}, 1)
        self._add(array, np.array([len(array)], dtype=np.int64), encoded, nbytes, int(array.max()) if array.size else 0)

    def extend(self, tokens: Any, lengths: Any, values: Mapping[str, Any] | None = None) -> None:
        """Add many documents at once: ``tokens`` (1-D integers) holds them one after the other, ``lengths`` their sizes
        (and ``values[name]`` one value per document for each column declared in ``columns=``).

        The same as appending each document, in a few numpy calls instead of one per document.
        """
        sizes = self._lengths(tokens, lengths)
        self._extend_encoded(tokens, sizes, *self._encode(values, len(sizes)))

    def _lengths(self, tokens: Any, lengths: Any) -> np.ndarray:
        if self._writer.closed:
            raise ChuteError(f"the token writer for {self.url} is closed")
        sizes = np.asarray(lengths)
        if sizes.ndim != 1:
            raise SchemaError("extend takes a 1-D array of tokens and a 1-D array of document lengths")
        if sizes.size and sizes.dtype.kind not in "iu":
            raise SchemaError(f"lengths must be integers >= 0; got {sizes.dtype} lengths")
        return sizes.astype(np.int64)

    def _extend_encoded(self, tokens: Any, sizes: np.ndarray, encoded: dict[str, Any] | None,
                        nbytes: np.ndarray | None) -> None:
        """:meth:`extend` with the other columns' values already in their stored form (:meth:`_encode`)."""
        flat = np.asarray(tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens)
        if flat.ndim != 1:
            raise SchemaError("extend takes a 1-D array of tokens and a 1-D array of document lengths")
        if (sizes.size and int(sizes.min()) < 0) or int(sizes.sum()) != flat.size:
            raise SchemaError(
                f"lengths must be integers >= 0 that sum to the {flat.size} tokens given; they sum to {int(sizes.sum())}"
            )
        ends = np.cumsum(sizes)
        flat = self._ids(flat, lambda at: self.documents + int(np.searchsorted(ends, at, side="right")))
        hi = int(flat.max()) if flat.size else 0
        if self.eos_id is not None:
            flat = np.insert(flat, ends, self.eos_id)
            sizes = sizes + 1
        self._add(flat, sizes, encoded, nbytes, hi)

    def _add(self, flat: np.ndarray, sizes: np.ndarray, encoded: dict[str, Any] | None, nbytes: np.ndarray | None,
             largest: int) -> None:
        self.documents += len(sizes)
        self.tokens += int(flat.size)
        if self._shards is None and self.vocab_size is None and len(sizes) == 1:  # append: wait for the first shard
            self._pending.append((flat, encoded, nbytes))
            self._pending_bytes += 4 * len(flat) + 8 + (0 if nbytes is None else int(nbytes.sum()))
            if self._pending_bytes >= self.shard_size:
                self._decide()
            return
        shards = self._decide(largest) if self._shards is None else self._shards
        shards.add(flat, sizes, encoded, nbytes)

    def _encode(self, values: Mapping[str, Any] | None, count: int) -> tuple[dict[str, Any] | None, np.ndarray | None]:
        """The other columns' values (one per document) in their stored form, and their sizes in bytes."""
        if not self.columns:
            if values:
                raise SchemaError(f"values for {sorted(values)} given, but this token writer has no columns beside "
                                  f"{COLUMN!r}; declare them with columns=")
            return None, None
        given = dict(values or {})
        if set(given) != set(self.columns):
            raise SchemaError(f"each document needs values for the columns {sorted(self.columns)}, got {sorted(given)}")
        out: dict[str, Any] = {}
        nbytes = np.zeros(count, dtype=np.int64)
        for name, ctype in self.columns.items():
            column = given[name]
            if len(column) != count:
                raise SchemaError(f"column {name!r}: {len(column)} values for {count} documents")
            if isinstance(ctype, Scalar):
                ints = np.asarray(column)
                if ints.size and (ints.dtype.kind not in "iu" or int(ints.min()) < -(2**63) or int(ints.max()) >= 2**63):
                    raise SchemaError(f"column {name!r} holds int64 values, got {ints.dtype}")
                out[name] = ints.astype(np.int64)
                nbytes += 8
                continue
            if isinstance(ctype, String):
                texts = list(column)
                bad = next((v for v in texts if not isinstance(v, str)), None)
                if bad is not None:
                    raise SchemaError(f"column {name!r} holds strings, got a {type(bad).__name__}")
            else:
                texts = [_json(v, name) for v in column]
            out[name] = texts
            nbytes += np.fromiter((len(t) + 8 for t in texts), dtype=np.int64, count=count)
        return out, nbytes

    def _decide(self, largest: int = 0) -> _TokenShards:
        """No vocab_size: the dtype from the largest token seen so far; then write what waited."""
        pending, self._pending = self._pending, []
        hi = max([largest] + [int(a.max()) for a, _, _ in pending if a.size])
        shards = self._start("uint16" if hi < _UINT16_IDS else "uint32")
        for flat, encoded, nbytes in pending:
            shards.add(flat, np.array([len(flat)], dtype=np.int64), encoded, nbytes)
        return shards

    def close(self) -> Manifest:
        """Write the last shard and the manifest; the dataset is valid from here on."""
        try:
            shards = self._decide() if self._shards is None else self._shards
            shards.flush()
            self._writer.metadata[METADATA_KEY] = {
                "version": 1,
                "dtype": self.dtype,
                "vocab_size": self.vocab_size,
                "eos_id": self.eos_id,
                "documents": self.documents,
                "tokens": self.tokens,
                "shard_tokens": list(shards.shard_tokens),
                "packed": {str(n): counts for n, counts in shards.packed.items()},
            }
        except BaseException:
            self.abort()
            raise
        return self._writer.close()

    def abort(self) -> None:
        """Discard everything this writer wrote; a previous dataset at the path stays valid."""
        self._writer.abort()


def _check_columns(columns: Mapping[str, ColumnType] | None) -> dict[str, ColumnType]:
    """Columns a token dataset may hold beside ``tokens``: strings, JSON values and int64 scalars."""
    out = dict(columns or {})
    for name, ctype in out.items():
        if name == COLUMN:
            raise SchemaError(f"column name {COLUMN!r} is the token column's; name the other columns otherwise")
        if not (isinstance(ctype, (String, Json)) or ctype == Scalar("int64")):
            raise SchemaError(f"column {name!r}: a token dataset's other columns are chute.String(), chute.Json() or "
                              f"chute.Scalar('int64'), got {ctype!r}")
    return out


def _json(value: Any, name: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"column {name!r} holds JSON values, got {type(value).__name__} ({exc})") from None


def write(
    docs: Iterable[Any],
    path: str | os.PathLike,
    *,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    compression: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """Write documents of token ids (1-D integer arrays, one per document) as a token dataset at ``path``; open it.

    The tokens are stored as ``uint16`` when ``vocab_size <= 65536``, else
    ``uint32`` (no ``vocab_size``: chosen from the largest id of the first
    shard). ``eos_id``, if given, is appended to every document as it is
    stored. ``path`` may be a local directory or a writable URL
    (``s3://...``), exactly as for :func:`chute.write`, and the result is the
    same: the written dataset, opened (``ds[i]["tokens"]`` is document ``i``).
    Read it as fixed-length training samples with :func:`chute.tokens.sequences`.
    """
    with TokenWriter(
        path, vocab_size=vocab_size, eos_id=eos_id, shard_size=shard_size, metadata=metadata, overwrite=overwrite,
        compression=compression, storage_options=storage_options,
    ) as writer:
        for doc in docs:
            writer.append(doc)
    from chute.storage.open import open_dataset

    return open_dataset(writer.url, storage_options=storage_options)
