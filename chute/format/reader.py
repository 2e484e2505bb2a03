"""The dataset reader: :class:`Dataset`, rows and batches of a chute dataset.

A dataset is its manifest plus a way to get each shard as a local file. For
a local dataset that is the file in the dataset's directory; for a remote one
it is a *shard source* the storage layer passes in (the node cache: it holds,
downloads and evicts shards; see ``chute.storage``). The reader only maps
files and reads them; it never decides where they come from, and imports
nothing from ``chute.storage``.

A shard is memory-mapped the first time a row of it is read. A batch is read
by the native kernels (``chute._native``) straight from the mapped shards:
every fixed-size column (tensors, scalars) with one call that copies the rows
into the caller's output blocks with the GIL released, and each variable-size
column with one or two calls for the whole batch (``chute.format.columns``).

Views of the mapped files never leave this module: every value handed to the
caller is a copy it may write to.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch

from chute.errors import ShardError
from chute.format import validate
from chute.format.columns import (
    CorruptShard,
    JsonError,
    Unmapped,
    _native,
    fixed_source,
    numpy_dtype,
    reader_for,
    torch_dtype,
)
from chute.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, checksum_file, parse_manifest
from chute.format.schema import FIXED_SIZE, Scalar, Schema, Tensor

__all__ = ["Dataset", "ShardSource", "torch_dtype"]

class ShardSource(Protocol):
    """Where a dataset's shards come from when they are not files in its directory (the node cache,
    ``chute.storage.node.cache.ShardCache``).

    ``acquire(i)`` makes shard ``i`` a complete local file at ``path(i)`` and
    holds it there until ``release(i)``; ``held(i)`` counts the holds of this
    process. A direct read maps a shard inside ``hold_for_read(i)`` (the source
    decides how long it stays held after) and a batch read runs inside
    ``reading()``; ``release_direct()`` lets go of what direct reads kept.
    ``on_unpin(i)`` is set by the dataset and called when shard ``i`` stops being
    held (its mapping must go). Picklable.
    """

    on_unpin: Any

    def path(self, i: int) -> str: ...
    def acquire(self, i: int) -> str: ...
    def release(self, i: int) -> None: ...
    def held(self, i: int) -> int: ...
    def hold_for_read(self, i: int) -> AbstractContextManager[str]: ...
    def reading(self) -> AbstractContextManager[None]: ...
    def release_direct(self) -> None: ...


class _Shard:
    """One memory-mapped shard: each column as the buffers the native kernels read."""

    def __init__(
        self, path: str, info: ShardInfo, schema: Schema, arrow_schema: pa.Schema, where: str, readers: dict,
        checks: validate.ShardChecks | None = None, offsets_checked: frozenset[str] = frozenset(),
    ) -> None:
        try:
            # pa.memory_map, not Python's mmap + py_buffer: with the latter, Arrow touched
            # every page of a column when it was first sliced (docs/benchmarks.md, design figures).
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
            checks.structure(batches, self.mmap, info, schema, where, offsets_checked)
        rows = sum(b.num_rows for b in batches)
        if rows != info.rows:
            raise ShardError(f"{where}: shard {info.file} holds {rows} rows, the manifest says {info.rows}; write the dataset again")
        if len(batches) == 1:
            batch = batches[0]
        else:  # not written by chute: combine (a copy) so each column is one buffer
            batch = pa.Table.from_batches(batches, schema=file_schema).combine_chunks().to_batches()[0] if batches else None
        self.sources: dict[str, Any] = {}
        try:
            for name, ctype in schema:
                column = batch.column(name) if batch is not None else pa.array([], type=arrow_schema.field(name).type)
                if isinstance(ctype, FIXED_SIZE):
                    self.sources[name] = fixed_source(column, ctype)
                else:
                    self.sources[name] = readers[name].source(column)
        except (ValueError, IndexError, TypeError, pa.ArrowException) as exc:  # buffers shorter than the rows need
            raise ShardError(
                f"{where}: shard {info.file} is damaged: column {name!r} cannot be read ({exc}); "
                "run `chute inspect --verify` on the dataset and write it again"
            ) from None


class BatchReader:
    """Reads batches of rows spread over many shards, with the native kernels, from each shard's buffers.

    ``sources[column][shard]`` holds what the kernels read of that column in
    that shard, or None while the shard is not mapped; a read that needs an
    unmapped shard calls ``map_shard(shard)`` (which must :meth:`publish` it)
    and tries again. A :class:`chute.Dataset` has one over its own shards; a
    mixture has one over all its sources' shards.
    """

    def __init__(self, schema: Schema, offsets: np.ndarray, map_shard: Any, describe_shard: Any, root: str) -> None:
        self.schema, self.offsets, self.root = schema, offsets, root
        self._map_shard, self._describe_shard = map_shard, describe_shard
        count = len(offsets) - 1
        self.fixed = [(name, ctype) for name, ctype in schema if isinstance(ctype, FIXED_SIZE)]
        self.variable = [(name, ctype) for name, ctype in schema if not isinstance(ctype, FIXED_SIZE)]
        self.readers = {name: reader_for(name, ctype) for name, ctype in self.variable}
        self.sources: dict[str, list[Any]] = {name: [None] * count for name in schema.names}
        self._fixed_sources = [self.sources[name] for name, _ in self.fixed]
        self._row_bytes = [ctype.row_bytes for _, ctype in self.fixed]
        self._var_plan = [(self.readers[name], self.sources[name]) for name, _ in self.variable]

    def publish(self, i: int, sources: Mapping[str, Any]) -> None:
        """Shard ``i`` is mapped: its buffers, by column."""
        for name, column in self.sources.items():
            column[i] = sources[name]

    def unpublish(self, i: int | None = None) -> None:
        """Shard ``i`` (every shard if None) is no longer mapped."""
        for column in self.sources.values():
            if i is None:
                column[:] = [None] * len(column)
            else:
                column[i] = None

    def read(self, indices: np.ndarray, outs: Sequence[np.ndarray], columnar: bool = False) -> list[Any]:
        """Read rows ``indices`` (int64, C-contiguous): the hot path of the Loader.

        Fixed-size columns are copied into ``outs``, writable C-contiguous
        arrays of ``len(indices)`` rows, one per fixed-size column in schema
        order; the values of the variable-size columns are returned, in schema
        order (``columnar``: as Arrow arrays).
        """
        offsets = self.offsets
        if self.fixed:
            columns = tuple(zip(self._fixed_sources, outs, self._row_bytes))
            while True:
                try:
                    _native.gather(indices, offsets, columns)
                    break
                except Unmapped as missing:
                    self._map_shard(missing.shard)
                except CorruptShard as exc:
                    raise self._corrupt(exc) from None
        if not self._var_plan:
            return []
        values = []
        for reader, sources in self._var_plan:
            while True:
                try:
                    values.append(reader.read(indices, offsets, sources, columnar))
                    break
                except Unmapped as missing:
                    self._map_shard(missing.shard)
                except (CorruptShard, JsonError) as exc:
                    raise self._corrupt(exc, reader.name) from None
        return values

    def _corrupt(self, exc: CorruptShard | JsonError, column: str | None = None) -> ShardError:
        shard = exc.shard
        where = f"shard {self._describe_shard(shard)}" if 0 <= shard < len(self.offsets) - 1 else "a shard of this batch"
        row = f", row {exc.row}" if exc.row >= 0 else ""
        col = f", column {column!r}" if column else ""
        return ShardError(
            f"dataset {self.root}: {where}{row}{col} is corrupt ({exc}); run `chute inspect --verify` "
            "on the dataset and write or download it again"
        )

    @property
    def fixed_columns(self) -> list[tuple[str, tuple[int, ...], np.dtype, torch.dtype]]:
        """``(name, shape of one row, numpy dtype a batch is built in, torch dtype)`` of each fixed-size column."""
        return [
            (name, tuple(ctype.shape) if isinstance(ctype, Tensor) else (), numpy_dtype(ctype.dtype), torch_dtype(ctype.dtype))
            for name, ctype in self.fixed
        ]

    @property
    def variable_columns(self) -> list[str]:
        return [name for name, _ in self.variable]


class _BatchPlan:
    """What ``get_batch`` needs of a source, worked out once (per source object): names, shapes, dtypes.

    ``native``: the source's ``read`` checks every index in its native call
    (IndexError for one out of range or negative, ValueError for indices that are
    not an int64 buffer) before anything is written, so ``get_batch`` passes an
    int64 array straight through and checks in Python only when that call refuses.
    """

    __slots__ = ("names", "fixed", "variable", "native", "in_order", "plain")

    def __init__(self, source: Any) -> None:
        self.names = list(source.schema.names)
        self.fixed = source.fixed_columns  # (name, row shape, numpy dtype a batch is built in, torch dtype)
        self.variable = list(source.variable_columns)
        self.native = getattr(source, "native_indices", False)
        self.in_order = not self.variable and [name for name, _, _, _ in self.fixed] == self.names
        # each fixed column's (row shape, numpy dtype) when every one is a plain numpy array (no bfloat16)
        self.plain = None if any(dtype == torch.bfloat16 for *_, dtype in self.fixed) else [(s, d) for _, s, d, _ in self.fixed]

    def batch(self, source: Any, indices: np.ndarray, out: Mapping[str, torch.Tensor] | None, columnar: bool) -> dict[str, Any]:
        """Rows ``indices`` (int64, 1-D) of ``source``, by column name in schema order.

        New outputs are numpy arrays shared with their tensors (``torch.from_numpy``:
        a third of the cost of ``torch.empty`` and ``.numpy()``).
        """
        n = len(indices)
        if out is None and self.plain is not None:
            arrays = [np.empty((n, *shape), dtype) for shape, dtype in self.plain]
            tensors = [torch.from_numpy(array) for array in arrays]
        else:
            tensors, arrays = self._outputs(n, out)
        values = source.read(indices, arrays, columnar)
        if self.in_order:
            return dict(zip(self.names, tensors))
        by_name = dict(zip([name for name, _, _, _ in self.fixed], tensors))
        by_name.update(zip(self.variable, values))
        return {name: by_name[name] for name in self.names}

    def _outputs(self, n: int, out: Mapping[str, torch.Tensor] | None) -> tuple[list[torch.Tensor], list[np.ndarray]]:
        """The tensors of the fixed-size columns (``out``'s, checked, or new) and the arrays the gather writes."""
        tensors, arrays = [], []
        for name, shape, np_dtype, dtype in self.fixed:
            if out is not None and name in out:
                tensor = _output(name, (n, *shape), dtype, out[name])
                array = tensor.view(torch.uint8).numpy() if dtype == torch.bfloat16 else tensor.numpy()
            else:
                array = np.empty((n, *shape), np_dtype)
                tensor = torch.from_numpy(array).view(dtype) if dtype == torch.bfloat16 else torch.from_numpy(array)
            tensors.append(tensor)
            arrays.append(array)
        return tensors, arrays


def _new_plan(source: Any) -> _BatchPlan:
    plan = source.__dict__["_batch_plan"] = _BatchPlan(source)
    return plan


def get_batch(source: Any, indices: Any, out: Mapping[str, torch.Tensor] | None = None, columnar: bool = False) -> dict[str, Any]:
    """``get_batch`` of a dataset or mixture: rows ``indices`` as a dict of column name to values.

    A 1-D numpy array (or CPU tensor) of int64 goes straight to the source's one
    native call, which checks every index before it writes anything; anything
    else, or a call that refuses the indices, goes through :func:`check_indices`
    (which converts them, or raises the error that names the bad row).
    """
    plan = source.__dict__.get("_batch_plan") or _new_plan(source)
    if type(indices) is not np.ndarray and type(indices) is torch.Tensor:
        indices = indices.detach().cpu().numpy()
    if type(indices) is np.ndarray and indices.ndim == 1 and plan.native:
        try:
            return plan.batch(source, indices, out, columnar)
        except (IndexError, ValueError):  # not int64, not contiguous, a row out of range: convert, or say which
            pass
    return plan.batch(source, check_indices(indices, len(source), source.root), out, columnar)


def get_item(source: Any, index: Any) -> dict[str, Any]:
    """``source[index]``: one row as a dict (scalars as Python numbers)."""
    if isinstance(index, (np.integer, torch.Tensor)):
        index = int(index)
    if not isinstance(index, int):
        raise TypeError(f"dataset indices must be integers, not {type(index).__name__}; use get_batch for many rows")
    if index < 0:
        index += len(source)
    if not 0 <= index < len(source):
        raise IndexError(f"row {index} is out of range for a dataset of {len(source)} rows")
    batch = get_batch(source, np.array([index], dtype=np.int64))
    sample: dict[str, Any] = {}
    for name, ctype in source.schema:
        value = batch[name][0]
        sample[name] = value.item() if isinstance(ctype, Scalar) else value
    return sample


def check_indices(indices: Any, rows: int, root: str) -> np.ndarray:
    """``indices`` as a C-contiguous int64 array, every one in ``[0, rows)``."""
    if isinstance(indices, torch.Tensor):
        indices = indices.detach().cpu().numpy()
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise TypeError(f"indices must be a 1-D sequence of integers, got shape {idx.shape} of {idx.dtype}")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= rows:
            bad = lo if lo < 0 else hi
            raise IndexError(f"row {bad} is out of range for dataset {root} of {rows} rows")
    return idx


def _output(name: str, shape: tuple[int, ...], dtype: torch.dtype, buffer: torch.Tensor) -> torch.Tensor:
    """``out[name]`` if it fits the column's batch (shape, dtype, contiguous, on the CPU); ValueError otherwise."""
    if tuple(buffer.shape) != shape or buffer.dtype != dtype or not buffer.is_contiguous() or buffer.device.type != "cpu":
        raise ValueError(
            f"out[{name!r}] must be a contiguous CPU tensor of shape {shape} and dtype {dtype}, "
            f"got {tuple(buffer.shape)} {buffer.dtype} on {buffer.device}"
        )
    return buffer


class Dataset:
    """A chute dataset opened for reading. Create it with :func:`chute.open`.

    ``len(ds)`` rows; ``ds[i]`` is one sample as a dict; ``ds.get_batch(indices)``
    gathers many at once (tensor and scalar columns as one tensor each, other columns
    as lists). Safe to share between threads; picklable (it maps its shards again in
    the process that unpickles it).
    """

    def __init__(
        self, root: str, manifest: Manifest, manifest_text: str, cache: ShardSource | None = None, *, verify: bool = True,
    ) -> None:
        self.root = root
        self._checks = validate.ShardChecks(verify)  # each shard's bytes and structure, once per process
        self._offsets_checked: frozenset[str] = frozenset()  # columns whose offsets a reader above checks (defer_offset_checks)
        self.manifest = manifest
        self._manifest_text = manifest_text
        self.cache = cache  # the shard source of a remote dataset (the node cache); None: files under root
        self.progressive = False  # opened with progressive=True (chute.open): each epoch covers what the cache holds
        if cache is not None:
            cache.on_unpin = self._unmap
        self.offsets = np.zeros(len(manifest.shards) + 1, dtype=np.int64)
        np.cumsum([s.rows for s in manifest.shards], out=self.offsets[1:])
        self._starts = self.offsets[:-1]
        self._shards: list[_Shard | None] = [None] * len(manifest.shards)
        self._lock = threading.Lock()
        self._batches = BatchReader(manifest.schema, self.offsets, self.shard, lambda i: manifest.shards[i].file, root)
        # the Loader's per-batch call: straight to the batch reader (no method of its own in between) for a local dataset
        self.read = self._batches.read if cache is None else self._read_held
        self.native_indices = True  # read() checks every index natively (get_batch's fast path)

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

    @property
    def fixed_columns(self) -> list[tuple[str, tuple[int, ...], np.dtype, torch.dtype]]:
        """``(name, shape of one row, numpy dtype a batch is built in, torch dtype)`` of each fixed-size column."""
        return self._batches.fixed_columns

    @property
    def variable_columns(self) -> list[str]:
        """Names of the variable-size columns (bytes, strings, maps, JSON, ragged arrays)."""
        return self._batches.variable_columns

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"chute.Dataset({self.root!r}, rows={len(self)}, shards={len(self.shards)}, columns={self.schema.names})"

    def __reduce__(self):
        return (_restore, (self.root, self._manifest_text, self.cache, self._checks.verify))

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

    def shards_of(self, indices: np.ndarray) -> list[int]:
        """The shards rows ``indices`` are in, once each, ascending."""
        return np.unique(np.searchsorted(self._starts, indices, side="right") - 1).tolist()

    # ------------------------------------------------------------------ mapping shards

    def shard(self, i: int) -> _Shard:
        """Shard ``i``, memory-mapped on first use."""
        shard = self._shards[i]
        if shard is not None:
            return shard
        if self.cache is not None:
            return self._cached_shard(i)
        with self._lock:
            shard = self._shards[i]
            if shard is None:
                shard = self._open(i, self.shard_path(i))
        return shard

    def check_ahead(self, indices: Sequence[int]) -> None:
        """Verify the checksums of the local shards ``indices`` that are not mapped yet, now, skipping those another
        process is hashing at this moment (their first read waits for its result, as before).

        For a reader about to map several shards at once (a batch over a shuffle window): the processes of a job
        that open the same dataset together then hash different shards side by side, each shard once on the
        machine, instead of all queueing on the first shard, then on the second. Nothing is served from a shard
        before its checksum matched: this only moves the hashing earlier."""
        if self.cache is not None or not self._checks.verify:
            return
        todo = [int(i) for i in indices if self._shards[int(i)] is None]
        if len(todo) < 2:
            return
        start = os.getpid() % len(todo)  # processes start on different shards
        for i in todo[start:] + todo[:start]:
            path = self.shard_path(i)
            try:
                mapped = pa.memory_map(path, "r")
            except (OSError, pa.ArrowException):
                continue  # the read that maps it says what is wrong
            try:
                self._checks.bytes_if_free(mapped, path, self.manifest.shards[i], f"dataset {self.root}")
            finally:
                mapped.close()

    def _open(self, i: int, path: str) -> _Shard:
        """Map shard ``i`` from ``path`` and publish its buffers (called with ``_lock`` held)."""
        shard = _Shard(
            path, self.manifest.shards[i], self.schema, self.manifest.arrow_schema, f"dataset {self.root}", self._batches.readers,
            self._checks, self._offsets_checked,
        )
        self._batches.publish(i, shard.sources)
        self._shards[i] = shard
        return shard

    def _cached_shard(self, i: int) -> _Shard:
        """Shard ``i`` of a remote dataset, mapped from the cache while the shard source holds it.

        A loader's downloader already holds the shards its batches read; a direct
        read (``ds[i]``, ``get_batch`` outside a loader) is held by the source for
        as long as it decides (chute/storage/node/direct.py).
        """
        assert self.cache is not None  # a remote dataset's
        with self.cache.hold_for_read(i) as path, self._lock:
            shard = self._shards[i]
            if shard is None:
                shard = self._open(i, path)
        return shard

    def _read_held(self, indices: np.ndarray, outs: Sequence[np.ndarray], columnar: bool = False) -> list[Any]:
        """:meth:`BatchReader.read` for a remote dataset: the shards the batch maps stay held until it is read."""
        assert self.cache is not None  # a remote dataset's
        with self.cache.reading():
            return self._batches.read(indices, outs, columnar)

    def _unmap(self, i: int) -> None:
        """Called by the shard source when shard ``i`` is no longer held: drop its mapping.

        A read in progress keeps the memory it reads from (the kernels hold the
        buffers for the duration of the call); the next read maps the shard again.
        """
        with self._lock:
            self._shards[i] = None
            self._batches.unpublish(i)

    # ------------------------------------------------------------------ reading

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, out: Mapping[str, torch.Tensor] | None = None,
                  *, columnar: bool = False) -> dict[str, Any]:
        """Gather rows ``indices`` (in that order) into a dict of column name to values.

        Tensor columns come back as one tensor of shape ``[len(indices), *shape]``,
        scalar columns as a tensor of shape ``[len(indices)]``, other columns as lists
        (``columnar=True``: as Arrow arrays, see ``chute.format.columns``). ``out``
        may hold preallocated tensors for fixed-size columns (reused buffers,
        possibly pinned); they are filled in place and returned.
        """
        return get_batch(self, indices, out, columnar)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return get_item(self, index)

    # ------------------------------------------------------------------ validation

    def defer_offset_checks(self, columns: Sequence[str]) -> None:
        """The caller checks the row offsets of ``columns`` (variable-size ones) itself before it trusts them.

        From now on, in this process, the first read of a shard runs Arrow's basic
        validation on these columns (buffer sizes, first and last offset inside the
        values: O(1)) instead of the full one that walks every offset (O(rows)).
        chute.tokens asks it for the ``tokens`` column, whose offsets its native
        packing pass checks as it walks them. Reads through the dataset itself stay
        safe: the native kernels check each row's offsets as they read it. Not
        pickled (the caller asks again in the process that unpickles it).
        """
        names = frozenset(columns)
        unknown = sorted(names - set(self.schema.names))
        fixed = sorted(name for name in names if name in {n for n, _ in self._batches.fixed})
        if unknown or fixed:
            raise ValueError(f"defer_offset_checks takes variable-size columns of {self.root}, got {unknown + fixed}")
        self._offsets_checked = self._offsets_checked | names

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

    def release_direct_holds(self) -> None:
        """Let go of the shards kept held after direct reads (remote): a loader's pass holds its own.

        Called when a loader's pass starts, so that a process waiting for its turn
        in a cache shared with other processes holds nothing while it waits.
        """
        if self.cache is not None:
            self.cache.release_direct()

    def close(self) -> None:
        """Unmap the shards (they are mapped again if the dataset is read later)."""
        with self._lock:
            self._shards = [None] * len(self._shards)
            self._batches.unpublish()
        self.release_direct_holds()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _restore(root: str, manifest_text: str, cache: ShardSource | None, verify: bool = True) -> Dataset:
    where = f"{root}/{MANIFEST_NAME}" if cache is not None else os.path.join(root, MANIFEST_NAME)
    return Dataset(root, parse_manifest(manifest_text, where), manifest_text, cache, verify=verify)
