"""The dataset reader: ``chute.open`` and :class:`Dataset`.

Opening a dataset reads the manifest and stats each shard (O(number of shards));
a shard is memory-mapped the first time a row of it is read. Fixed-size columns
(tensors and scalars) are exposed as ``uint8[rows, row_bytes]`` torch views of the
mapped file, so a batch is one ``index_select`` per shard and column into the output
buffer: no per-sample Python objects and no deserialisation.

Views of the mapped files never leave this module: every tensor handed to the
caller is a copy it may write to (the mapping is read-only).
"""

from __future__ import annotations

import collections
import json
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from chute.errors import ManifestError, ShardError
from chute.format import validate
from chute.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, checksum_file, local_path, parse_manifest, read_manifest
from chute.format.schema import FIXED_SIZE, Bytes, ColumnType, Json, Map, Ragged, Scalar, Schema, String, Tensor

if TYPE_CHECKING:
    from chute.storage.cache import ShardCache
    from chute.storage.remote import Remote

_TORCH_DTYPES = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "uint16": torch.uint16,
    "int16": torch.int16,
    "uint32": torch.uint32,
    "int32": torch.int32,
    "uint64": torch.uint64,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


# Shards a remote dataset keeps held for direct reads (outside a loader).
_DIRECT_HOLDS = 2

# Rows at least this big are copied one by one to their place in the batch; smaller rows
# are gathered per shard into a scratch buffer, then reordered (see Dataset._gather_fixed).
_DIRECT_ROW_BYTES = 32 << 10


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a chute dtype name."""
    return _TORCH_DTYPES[dtype]


def _readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only numpy array (torch warns about those; we never write)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


class _Shard:
    """One memory-mapped shard: byte views of its fixed-size columns, Arrow arrays of the rest."""

    def __init__(self, path: str, info: ShardInfo, schema: Schema, arrow_schema: pa.Schema, where: str,
                 checks: validate.ShardChecks | None = None) -> None:
        try:
            # pa.memory_map, not Python's mmap + py_buffer: with the latter, Arrow touched
            # every page of a column when it was first sliced (0.4 s per 128 MiB shard).
            # It keeps one descriptor open per mapped shard until the dataset is closed.
            self.mmap = pa.memory_map(path, "r")
            if checks is not None:  # its size and checksum, before any of its bytes are parsed
                checks.bytes(self.mmap, path, info, where)
            reader = pa.ipc.open_file(self.mmap)
            file_schema = reader.schema
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except FileNotFoundError:
            raise ShardError(f"{where}: shard file {path} is missing; the dataset is incomplete: write or download it again") from None
        except (pa.ArrowException, OSError, ValueError) as exc:  # any Arrow error: a damaged footer can name any type
            raise ShardError(
                f"{where}: shard {info.file} is not a readable Arrow IPC file ({exc}); it is truncated "
                "or damaged: run `chute inspect --verify` on the dataset and write it again"
            ) from None
        if not file_schema.equals(arrow_schema, check_metadata=False):
            raise ShardError(
                f"{where}: shard {info.file} has schema {file_schema} but the manifest says "
                f"{arrow_schema}; the shard does not belong to this dataset: write it again"
            )
        if checks is not None:  # offsets, buffer bounds, rows and nulls, before anything is decoded
            checks.structure(batches, path, info, schema, where)
        rows = sum(b.num_rows for b in batches)
        if rows != info.rows:
            raise ShardError(f"{where}: shard {info.file} holds {rows} rows, the manifest says {info.rows}; write the dataset again")
        if len(batches) == 1:
            batch = batches[0]
        else:  # not written by chute: combine (a copy) so each column is one buffer
            batch = pa.Table.from_batches(batches, schema=file_schema).combine_chunks().to_batches()[0] if batches else None
        self.columns: dict[str, pa.Array] = {}
        self.fixed: dict[str, torch.Tensor] = {}
        for name, ctype in schema:
            column = batch.column(name) if batch is not None else pa.array([], type=arrow_schema.field(name).type)
            if isinstance(ctype, FIXED_SIZE):
                self.fixed[name] = self._byte_view(column, ctype, info.rows)
            else:
                self.columns[name] = column

    @staticmethod
    def _byte_view(column: pa.Array, ctype: Tensor | Scalar, rows: int) -> torch.Tensor:
        row_bytes = ctype.row_bytes
        if isinstance(ctype, Scalar) and ctype.dtype == "bool":  # Arrow packs bools as bits
            values = _numpy(column).astype(np.uint8)
        elif isinstance(ctype, Tensor):
            values = _list_values(column.storage)
        else:
            values = _numpy(column)
        return _readonly_tensor(values.view(np.uint8).reshape(rows, row_bytes))


class Dataset:
    """A chute dataset opened for reading. Create it with :func:`chute.open`.

    ``len(ds)`` rows; ``ds[i]`` is one sample as a dict; ``ds.get_batch(indices)``
    gathers many at once (tensor and scalar columns as one tensor each, other columns
    as lists). Safe to share between threads; picklable (it re-maps its shards in the
    process that unpickles it).
    """

    def __init__(self, root: str, manifest: Manifest, manifest_text: str, cache: ShardCache | None = None,
                 *, verify: bool = True) -> None:
        self.root = root
        self._checks = validate.ShardChecks(verify)  # each shard's bytes and structure, once per process
        self.manifest = manifest
        self._manifest_text = manifest_text
        self.cache = cache  # the node cache a remote dataset's shards are read through (None: local)
        self._recent: collections.deque[int] = collections.deque()  # shards held for direct reads (remote)
        if cache is not None:
            cache.on_unpin = self._unmap
        self.offsets = np.zeros(len(manifest.shards) + 1, dtype=np.int64)
        np.cumsum([s.rows for s in manifest.shards], out=self.offsets[1:])
        self._starts = self.offsets[:-1]
        self._shards: list[_Shard | None] = [None] * len(manifest.shards)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._fixed = [(name, ctype) for name, ctype in manifest.schema if isinstance(ctype, FIXED_SIZE)]
        self._variable = [(name, ctype) for name, ctype in manifest.schema if not isinstance(ctype, FIXED_SIZE)]

    # ------------------------------------------------------------------ description

    @property
    def schema(self) -> Schema:
        return self.manifest.schema

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        return self.manifest.shards

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest.metadata

    @property
    def nbytes(self) -> int:
        return sum(s.bytes for s in self.manifest.shards)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"chute.Dataset({self.root!r}, rows={len(self)}, shards={len(self.shards)}, columns={self.schema.names})"

    def __reduce__(self):
        if self.cache is not None:
            return (_restore_remote, (self.cache.remote, self._manifest_text, self.cache.cache_dir, self.cache.limit, self._checks.verify))
        return (_restore, (self.root, self._manifest_text, self._checks.verify))

    def shard_path(self, i: int) -> str:
        """The local file of shard ``i`` (for a remote dataset: its place in the cache)."""
        if self.cache is not None:
            return self.cache.path(i)
        return os.path.join(self.root, *self.manifest.shards[i].file.split("/"))

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, row within the shard)`` of global row ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} is out of range for a dataset of {len(self)} rows")
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        return shard, index - int(self.offsets[shard])

    # ------------------------------------------------------------------ reading

    def shard(self, i: int) -> _Shard:
        """Shard ``i``, memory-mapped on first use."""
        shard = self._shards[i]
        if shard is None and self.cache is not None:
            return self._cached_shard(i)
        if shard is None:
            with self._lock:
                shard = self._shards[i]
                if shard is None:
                    info = self.manifest.shards[i]
                    shard = _Shard(self.shard_path(i), info, self.schema, self.manifest.arrow_schema, f"dataset {self.root}", self._checks)
                    self._shards[i] = shard
        return shard

    def _cached_shard(self, i: int) -> _Shard:
        """Shard ``i`` of a remote dataset, mapped from the cache.

        A loader's downloader already holds the shards its batches read; a direct
        read (``ds[i]``, ``get_batch`` outside a loader) holds the shard itself and
        keeps the last few held, so neighbouring reads do not download again.
        """
        cache = self.cache
        if not cache.held(i):  # make room among this dataset's own holds first
            size = self.manifest.shards[i].bytes
            while True:
                with self._lock:
                    held = sum(self.manifest.shards[j].bytes for j in self._recent)
                    full = len(self._recent) >= _DIRECT_HOLDS or (cache.limit is not None and held + size > cache.limit)
                    drop = self._recent.popleft() if full and self._recent else None
                if drop is None:
                    break
                cache.release(drop)
        cache.acquire(i)
        keep = cache.held(i) == 1  # nobody else holds it: this read keeps it for a while
        try:
            with self._lock:
                shard = self._shards[i]
            if shard is None:
                shard = _Shard(cache.path(i), self.manifest.shards[i], self.schema, self.manifest.arrow_schema, f"dataset {self.root}", self._checks)
                with self._lock:
                    if self._shards[i] is None:
                        self._shards[i] = shard
                    shard = self._shards[i]
        except BaseException:
            cache.release(i)
            raise
        if not keep:
            cache.release(i)
            return shard
        with self._lock:
            self._recent.append(i)
        return shard

    def _unmap(self, i: int) -> None:
        """Called by the cache when shard ``i`` is no longer held: drop its mapping."""
        with self._lock:
            self._shards[i] = None

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, (np.integer, torch.Tensor)):
            index = int(index)
        if not isinstance(index, int):
            raise TypeError(f"dataset indices must be integers, not {type(index).__name__}; use get_batch for many rows")
        if index < 0:
            index += len(self)
        number, row = self.locate(index)
        shard = self.shard(number)
        sample: dict[str, Any] = {}
        for name, ctype in self.schema:
            if isinstance(ctype, FIXED_SIZE):
                value = shard.fixed[name][row].clone().view(torch_dtype(ctype.dtype))
                sample[name] = value.item() if isinstance(ctype, Scalar) else value.view(ctype.shape)
            else:
                sample[name] = _decode(shard.columns[name].slice(row, 1), ctype)[0]
        return sample

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Gather rows ``indices`` (in that order) into a dict of column name to values.

        Tensor columns come back as one tensor of shape ``[len(indices), *shape]``,
        scalar columns as a tensor of shape ``[len(indices)]``, other columns as lists.
        ``out`` may hold preallocated tensors for fixed-size columns (reused buffers,
        possibly pinned); they are filled in place and returned.
        """
        idx = self._check_indices(indices)
        n = len(idx)
        plan = self._plan(idx)
        result: dict[str, Any] = {}
        for name, ctype in self._fixed:
            buffer = self._output(name, ctype, n, out)
            self._gather_fixed(name, plan, buffer.view(torch.uint8).view(n, ctype.row_bytes) if n else None)
            result[name] = buffer
        for name, ctype in self._variable:
            result[name] = self._gather_variable(name, ctype, plan)
        return {name: result[name] for name in self.schema.names}

    def _check_indices(self, indices: Any) -> np.ndarray:
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(f"indices must be a 1-D sequence of integers, got shape {idx.shape} of {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        if idx.size:
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= len(self):
                bad = lo if lo < 0 else hi
                raise IndexError(f"row {bad} is out of range for dataset {self.root} of {len(self)} rows")
        return idx

    def _plan(self, idx: np.ndarray) -> _Plan:
        """Split rows into per-shard runs; sort them by shard first if they are not grouped."""
        if len(self._shards) == 1 or not len(idx):
            return _Plan([(0, 0, len(idx), idx)], None, None)
        shard_of = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self.offsets[shard_of]
        inverse = order = None
        if len(idx) > 1 and (shard_of[1:] < shard_of[:-1]).any():
            # Rows of one shard are gathered together, then put back in the order asked for.
            order = np.argsort(shard_of, kind="stable")
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            shard_of, local = shard_of[order], local[order]
        counts = np.bincount(shard_of, minlength=len(self._shards))
        runs = []
        a = 0
        for shard in np.flatnonzero(counts).tolist():
            b = a + int(counts[shard])
            runs.append((shard, a, b, local[a:b]))
            a = b
        return _Plan(runs, inverse, order if inverse is not None else None)

    def _output(self, name: str, ctype: Tensor | Scalar, n: int, out: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
        shape = (n, *ctype.shape) if isinstance(ctype, Tensor) else (n,)
        dtype = torch_dtype(ctype.dtype)
        if out is not None and name in out:
            buffer = out[name]
            if tuple(buffer.shape) != shape or buffer.dtype != dtype or not buffer.is_contiguous() or buffer.device.type != "cpu":
                raise ValueError(
                    f"out[{name!r}] must be a contiguous CPU tensor of shape {shape} and dtype {dtype}, "
                    f"got {tuple(buffer.shape)} {buffer.dtype} on {buffer.device}"
                )
            return buffer
        return torch.empty(shape, dtype=dtype)

    def _gather_fixed(self, name: str, plan: _Plan, out: torch.Tensor | None) -> None:
        if out is None:
            return
        if plan.inverse is not None and out.shape[1] >= _DIRECT_ROW_BYTES:
            # Big rows: a Python call per row costs less than copying the batch twice.
            positions = plan.order.tolist()
            for shard, a, b, local in plan.runs:
                source = self.shard(shard).fixed[name]
                for position, row in zip(positions[a:b], local.tolist()):
                    out[position].copy_(source[row])
            return
        target = out if plan.inverse is None else self._scratch(out)
        for (shard, a, b, _), local in zip(plan.runs, plan.indices):
            torch.index_select(self.shard(shard).fixed[name], 0, local, out=target[a:b])
        if plan.inverse is not None:
            torch.index_select(target, 0, plan.inverse_t, out=out)

    def _scratch(self, like: torch.Tensor) -> torch.Tensor:
        """A per-thread reusable buffer shaped like ``like`` (fresh allocations page-fault)."""
        buffers = self._local.__dict__.setdefault("scratch", {})
        key = tuple(like.shape)
        buffer = buffers.get(key)
        if buffer is None:
            if len(buffers) > 8:
                buffers.clear()
            buffer = buffers[key] = torch.empty(key, dtype=like.dtype)
        return buffer

    def _gather_variable(self, name: str, ctype: ColumnType, plan: _Plan) -> list[Any]:
        values: list[Any] = []
        for shard, _, _, local in plan.runs:
            column = self.shard(shard).columns[name]
            values.extend(_decode(column.take(pa.array(local)), ctype))
        if plan.inverse is not None:
            values = [values[i] for i in plan.inverse.tolist()]
        return values

    # ------------------------------------------------------------------ validation

    def check_shard(self, i: int) -> str | None:
        """A description of what is wrong with shard ``i`` on disk, or None if its bytes are intact."""
        if self.cache is not None:  # a download is verified; then check the cached copy as it is now
            self.cache.acquire(i)
            try:
                return self._check_file(i)
            finally:
                self.cache.release(i)
        return self._check_file(i)

    def _check_file(self, i: int) -> str | None:
        info = self.manifest.shards[i]
        path = self.shard_path(i)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return f"shard {info.file} is missing ({path})"
        if size != info.bytes:
            return f"shard {info.file} is {size} bytes, the manifest says {info.bytes} (truncated or replaced)"
        digest = checksum_file(path, info.checksum.split(":", 1)[0])
        if digest != info.checksum:
            return f"shard {info.file} has checksum {digest}, the manifest says {info.checksum} (corrupt)"
        return validate.check_file(path, info, self.schema, self.manifest.arrow_schema, f"dataset {self.root}")  # rows, schema

    def verify(self) -> None:
        """Check every shard's size, checksum, schema and row count; raise ShardError listing the bad ones."""
        problems = [p for i in range(len(self.shards)) if (p := self.check_shard(i))]
        if problems:
            raise ShardError(
                f"dataset {self.root} failed verification: " + "; ".join(problems)
                + ". Write or download the dataset again"
            )

    def close(self) -> None:
        """Unmap the shards (they are mapped again if the dataset is read later)."""
        with self._lock:
            self._shards = [None] * len(self._shards)
            recent, self._recent = list(self._recent), collections.deque()
        if self.cache is not None:
            for i in recent:
                self.cache.release(i)

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Plan:
    """How one batch's rows split into per-shard runs, and the reordering to apply after."""

    __slots__ = ("runs", "inverse", "order", "indices", "inverse_t")

    def __init__(self, runs: list[tuple[int, int, int, np.ndarray]], inverse: np.ndarray | None, order: np.ndarray | None) -> None:
        self.runs = runs  # (shard, first sorted position, end sorted position, rows within the shard)
        # When the rows were sorted by shard: sorted position j holds the row asked for at
        # position order[j], and position p is found at sorted position inverse[p].
        self.inverse = inverse
        self.order = order
        # torch views of the same indices, made once and shared by every column
        self.indices = [torch.from_numpy(local) for _, _, _, local in runs]
        self.inverse_t = None if inverse is None else torch.from_numpy(inverse)


def _decode(column: pa.Array, ctype: ColumnType) -> list[Any]:
    """Python values of a variable-size column's rows."""
    if isinstance(ctype, (Bytes, String)):
        return column.to_pylist()
    if isinstance(ctype, Json):
        return [json.loads(text) for text in column.to_pylist()]
    if isinstance(ctype, Map):
        rows = column.to_pylist(maps_as_pydicts="strict")
        if ctype.value == "json":
            return [{k: json.loads(v) for k, v in row.items()} for row in rows]
        return rows
    if isinstance(ctype, Ragged):
        return _decode_ragged(column, ctype)
    raise AssertionError(f"unexpected column type {ctype!r}")


def _decode_ragged(column: pa.Array, ctype: Ragged) -> list[torch.Tensor]:
    if ctype.ndim == 1:
        lists, shapes = column, None
    else:
        lists = column.field("data")
        shapes = _list_values(column.field("shape")).reshape(-1, ctype.ndim)
    offsets = _numpy(lists.offsets)
    values = _numpy(lists.values)
    dtype = torch_dtype(ctype.dtype)
    out = []
    for i in range(len(lists)):
        part = torch.from_numpy(values[offsets[i] : offsets[i + 1]].copy())
        part = part.view(dtype) if dtype in (torch.bool, torch.bfloat16) else part
        out.append(part if shapes is None else part.reshape(tuple(shapes[i])))
    return out


def _numpy(array: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of a primitive Arrow array without nulls (bools are unpacked).

    ``pa.Array.to_numpy`` imports pandas on first use (0.3 s); this reads the buffer.
    """
    data = array.buffers()[1]
    if pa.types.is_boolean(array.type):
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[array.offset : array.offset + len(array)].astype(np.bool_)
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def _list_values(array: pa.FixedSizeListArray) -> np.ndarray:
    """The values of a fixed-size-list array's rows, zero-copy (``flatten`` imports pyarrow.compute)."""
    size = array.type.list_size
    return _numpy(array.values)[array.offset * size : (array.offset + len(array)) * size]


def _restore(root: str, manifest_text: str, verify: bool = True) -> Dataset:
    return Dataset(root, parse_manifest(manifest_text, os.path.join(root, MANIFEST_NAME)), manifest_text, verify=verify)


def _restore_remote(remote: Remote, manifest_text: str, cache_dir: str, limit: int | None, verify: bool = True) -> Dataset:
    from chute.storage.cache import ShardCache

    manifest = parse_manifest(manifest_text, f"{remote.url}/{MANIFEST_NAME}")
    return Dataset(remote.url, manifest, manifest_text, ShardCache(remote, manifest, cache_dir, limit), verify=verify)


def open_dataset(
    path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int | None = None,
    verify: bool = True,
) -> Dataset:
    """Open the chute dataset at ``path``: a local directory holding ``manifest.json``, or a URL.

    A local dataset's shards are memory-mapped where they are. A remote one
    (``s3://``, ``gs://``, ``http(s)://``, any fsspec URL) has its manifest read
    now and its shards downloaded into the node cache ``cache_dir`` (default
    ``$CHUTE_CACHE_DIR`` or ``~/.cache/chute``) as they are needed, never holding
    more than ``cache_limit`` bytes there (a number or a string such as
    ``"20GB"``; default: no limit). ``storage_options`` go to fsspec (e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}`` for an S3-compatible store).
    A request that fails transiently (timeout, reset connection, HTTP 5xx,
    throttling) is tried up to ``retries`` times in all (default 8, about 20 s
    of backoff) before a :class:`chute.RemoteError` names the URL and the errors.

    Validates the manifest and, for a local dataset, that every shard exists with
    the size it lists. Each shard is checked once per process when it is first
    read: its checksum (``verify=True``, the default; ``verify=False`` skips it)
    and, always, the structure the reader relies on (offsets, buffer bounds, row
    count); see docs/format.md. :meth:`Dataset.verify` checks every shard at once.
    """
    from chute.storage.remote import is_remote

    if is_remote(os.fspath(path)):
        from chute.storage.open import open_remote

        return open_remote(os.fspath(path), cache_dir, cache_limit, storage_options, retries, verify=verify)
    root = os.path.abspath(local_path(path, "open"))
    manifest_path = os.path.join(root, MANIFEST_NAME)
    if not os.path.isdir(root):
        raise ManifestError(f"{root} does not exist or is not a directory; a chute dataset is a directory with a {MANIFEST_NAME}")
    try:
        text = read_manifest(manifest_path)
    except FileNotFoundError:
        raise ManifestError(
            f"{root} has no {MANIFEST_NAME}: it is not a chute dataset, or its writer did not "
            "finish (the manifest is written last). Write the dataset again"
        ) from None
    manifest = parse_manifest(text, manifest_path)
    if any(info.compression for info in manifest.shards):  # compressed shards are read through the cache
        from chute.storage.open import open_remote

        return open_remote("file://" + root, cache_dir, cache_limit, storage_options, retries, verify=verify)
    real_root = os.path.realpath(root)
    for info in manifest.shards:
        path_i = os.path.join(root, *info.file.split("/"))
        real = os.path.realpath(path_i)
        if os.path.commonpath([real, real_root]) != real_root:
            raise ManifestError(f"{manifest_path}: shard {info.file} resolves outside the dataset root ({real}); chute refuses to read it")
        try:
            size = os.path.getsize(path_i)
        except FileNotFoundError:
            raise ShardError(
                f"dataset {root}: shard {info.file} is missing; the dataset is incomplete: write or download it again"
            ) from None
        if size != info.bytes:
            raise ShardError(
                f"dataset {root}: shard {info.file} is {size} bytes but the manifest says {info.bytes}; "
                "it is truncated or was replaced: write or download the dataset again"
            )
    validate.check_empty_shards(root, manifest, f"dataset {root}")
    return Dataset(root, manifest, text, verify=verify)
