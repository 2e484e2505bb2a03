"""What the reader relies on in a shard, checked before anything is decoded.

A shard is an Arrow IPC file that chute memory-maps and reads zero-copy, so a
damaged or hostile file must be refused before its bytes are trusted: a wrong
offset in a string column would otherwise make Arrow read outside its buffer
(a crash), allocate without bound, or return another sample's value. Each
shard is checked once per process, when it is first mapped:

1. **Bytes** (``verify=True``, the default): its size and its checksum equal the
   manifest's, hashed over the mapping itself (no copy; xxh3 runs at memory
   speed). This catches every flipped byte, a cached copy damaged after its
   download, and two same-size shards swapped on disk.
2. **Structure** (always, also when the bytes are not hashed): the file's
   schema and row count are the manifest's, no column has nulls, and Arrow's
   full validation passes on every column: offsets start at 0, never decrease
   and stay inside their data buffers, every buffer is as long as its rows
   need, strings are UTF-8, map keys are present, a ragged row's shape matches
   its number of values. This is what a hostile file
   whose checksum was written to match would still be refused for.

Every failure is a :class:`chute.ShardError` naming the shard and the dataset.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import ShardError
from chute.format.manifest import Manifest, ShardInfo
from chute.format.schema import ColumnType, Nullable, Ragged, Schema


def _advice(info: ShardInfo) -> str:
    return f"shard {info.file} is damaged or was replaced: run `chute inspect --verify` on the dataset and write it again"


def checksum_buffer(buffer: Any, algorithm: str) -> str:
    """The ``"<algorithm>:<hex>"`` checksum of a buffer's bytes (a mapped file: no copy)."""
    if algorithm == "xxh3_128":
        import xxhash

        hasher = xxhash.xxh3_128()
    else:
        import hashlib

        hasher = hashlib.blake2b(digest_size=16)
    hasher.update(memoryview(buffer))
    return f"{algorithm}:{hasher.hexdigest()}"


def checksum_read(path: str, algorithm: str, chunk: int = 8 << 20) -> str:
    """The ``"<algorithm>:<hex>"`` checksum of a file, read in chunks into one reused buffer.

    Three times faster than hashing through a fresh mapping of the file (measured
    on a 128 MiB shard in the page cache: 26-34 ms against 85-88 ms), which pays
    a page fault per 4 KiB.
    """
    if algorithm == "xxh3_128":
        import xxhash

        hasher = xxhash.xxh3_128()
    else:
        import hashlib

        hasher = hashlib.blake2b(digest_size=16)
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            hasher.update(view[:n])
    return f"{algorithm}:{hasher.hexdigest()}"


def check_bytes(mapped: pa.MemoryMappedFile, path: str, info: ShardInfo, where: str) -> None:
    """The mapped shard has the manifest's size and checksum; ShardError otherwise."""
    size = mapped.size()
    if size != info.bytes:
        raise ShardError(f"{where}: shard {info.file} ({path}) is {size:,} bytes, the manifest says {info.bytes:,}; " + _advice(info))
    digest = checksum_read(path, info.checksum.split(":", 1)[0])
    if digest != info.checksum:
        raise ShardError(
            f"{where}: shard {info.file} ({path}) has checksum {digest}, the manifest says {info.checksum} "
            f"(its bytes changed on disk, or another shard's file is in its place); {_advice(info)} "
            "(a remote dataset's shard: delete this copy in the node cache and it is downloaded again)"
        )


def check_batches(batches: list[pa.RecordBatch], info: ShardInfo, schema: Schema, where: str) -> None:
    """Everything the reader takes for granted in a shard's record batches; ShardError otherwise."""
    rows = sum(batch.num_rows for batch in batches)
    if rows != info.rows:
        raise ShardError(f"{where}: shard {info.file} holds {rows} rows, the manifest says {info.rows}; write the dataset again")
    for batch in batches:
        for name, ctype in schema:
            column = batch.column(name)
            try:
                column.validate(full=True)
            except (pa.ArrowException, ValueError) as exc:
                raise ShardError(f"{where}: shard {info.file}, column {name!r} is not valid Arrow data ({exc}); " + _advice(info)) from None
            if _has_nulls(column, top=not isinstance(ctype, Nullable)):
                raise ShardError(f"{where}: shard {info.file}, column {name!r} has missing values, which chute never writes; " + _advice(info))
            problem = _shape_problem(column, ctype)
            if problem:
                raise ShardError(f"{where}: shard {info.file}, column {name!r}: {problem}; " + _advice(info))


def _shape_problem(column: pa.Array, ctype: ColumnType) -> str | None:
    """A ragged column of several dimensions stores each row's shape beside its data: their sizes must agree."""
    if not isinstance(ctype, Ragged) or ctype.ndim == 1 or not len(column):
        return None
    data, shape = column.field("data"), column.field("shape")
    dims = np.frombuffer(shape.values.buffers()[1], dtype=np.int32, count=len(shape.values),
                         offset=shape.values.offset * 4).reshape(-1, ctype.ndim)
    dims = dims[shape.offset : shape.offset + len(shape)]
    if (dims < 0).any():
        return "a row has a negative size in its shape"
    lengths = np.diff(np.frombuffer(data.offsets.buffers()[1], dtype=np.int64, count=len(data) + 1, offset=data.offset * 8))
    if (dims.astype(np.int64).prod(axis=1) != lengths).any():
        return "a row's shape does not match the number of values it holds"
    return None


def _has_nulls(array: pa.Array, top: bool = True) -> bool:
    """Whether ``array`` or any of its children has a null (``top``: the array itself too; a
    Nullable column's rows may be null, nothing inside them)."""
    if top and array.null_count:
        return True
    if isinstance(array, pa.ExtensionArray):
        return _has_nulls(array.storage, top)
    if isinstance(array, pa.StructArray):
        return any(_has_nulls(array.field(k)) for k in range(array.type.num_fields))
    if isinstance(array, pa.MapArray):
        return _has_nulls(array.keys) or _has_nulls(array.items)
    if isinstance(array, (pa.ListArray, pa.LargeListArray, pa.FixedSizeListArray)):
        return _has_nulls(array.values)
    return False


def check_file(path: str, info: ShardInfo, schema: Schema, arrow_schema: pa.Schema, where: str) -> str | None:
    """What is wrong with the structure of the shard file at ``path`` (schema, rows, Arrow
    validity), or None: what ``Dataset.verify`` adds to the checksum."""
    try:
        with pa.memory_map(path, "r") as mapped:
            reader = pa.ipc.open_file(mapped)
            if not reader.schema.equals(arrow_schema, check_metadata=False):
                return f"shard {info.file} has schema {reader.schema}, the manifest says {arrow_schema}"
            check_batches([reader.get_batch(k) for k in range(reader.num_record_batches)], info, schema, where)
    except ShardError as exc:
        return str(exc).removeprefix(f"{where}: ")
    except (pa.ArrowException, OSError, ValueError) as exc:
        return f"shard {info.file} is not a readable Arrow IPC file ({exc})"
    return None


def check_empty_shards(root: str, manifest: Manifest, where: str) -> None:
    """Open the shards the manifest says are empty (a loader never reads them, so a row count
    edited to 0 would drop their rows silently); ShardError if one is not."""
    for info in manifest.shards:
        if info.rows == 0:
            problem = check_file(os.path.join(root, *info.file.split("/")), info, manifest.schema, manifest.arrow_schema, where)
            if problem is not None:
                raise ShardError(f"{where}: {problem}; write the dataset again")


class ShardChecks:
    """The shards one dataset has checked in this process (each once, see the module docstring).

    A shard is identified by its file's inode, size and modification time, so a
    file replaced in the cache (evicted, downloaded again) is checked again.
    A checksum that matched is also remembered on this machine (an empty
    marker file in ``<chute cache dir>/verified/``, named after the file's path,
    inode, size, modification time and checksum), so other processes reading
    the same unchanged file do not hash it again: the first read of a shard on
    a machine pays for the hash, later ones (another epoch's processes, another
    run) do not. A file rewritten in any way is hashed again; silent decay of
    an unchanged file afterwards is what ``chute inspect --verify`` checks.
    """

    def __init__(self, verify: bool = True) -> None:
        self.verify = bool(verify)
        self._done: set[tuple[str, int, int, int]] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"verify": self.verify}  # another process checks again

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["verify"])

    def bytes(self, mapped: pa.MemoryMappedFile, path: str, info: ShardInfo, where: str) -> None:
        """Check a newly mapped shard's size and checksum (unless verification is off, or done)."""
        if not self.verify or self._key(path) in self._done:
            return
        marker = _marker(path, info)
        if marker is not None and os.path.exists(marker):
            return
        check_bytes(mapped, path, info, where)
        if marker is not None:
            try:
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                with open(marker, "x"):
                    pass
            except OSError:  # not writable, or made meanwhile: the next process hashes again, or finds it
                pass

    def structure(self, batches: list[pa.RecordBatch], path: str, info: ShardInfo, schema: Schema, where: str) -> None:
        """Check a newly mapped shard's record batches (unless done); from here on it counts as checked."""
        key = self._key(path)
        if key in self._done:
            return
        check_batches(batches, info, schema, where)
        with self._lock:
            self._done.add(key)

    @staticmethod
    def _key(path: str) -> tuple[str, int, int, int]:
        st = os.stat(path)
        return path, st.st_ino, st.st_size, st.st_mtime_ns


def _marker(path: str, info: ShardInfo) -> str | None:
    """The file that says this exact version of ``path`` matched ``info``'s checksum on this machine."""
    import hashlib

    from chute._paths import default_cache_dir

    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{info.checksum}"
    return os.path.join(default_cache_dir(), "verified", hashlib.blake2b(key.encode(), digest_size=16).hexdigest())


__all__ = ["ShardChecks", "check_batches", "check_bytes", "check_empty_shards", "check_file", "checksum_buffer"]
