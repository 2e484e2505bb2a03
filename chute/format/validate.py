"""What the reader relies on in a shard, checked before anything is decoded.

A shard is an Arrow IPC file that chute memory-maps and reads zero-copy, so a
damaged or hostile file must be refused before its bytes are trusted: a wrong
offset in a string column would otherwise make Arrow read outside its buffer
(a crash), allocate without bound, or return another sample's value. Each
shard is checked once per process, when it is first mapped:

1. **Bytes** (``verify=True``, the default): its size and its checksum equal the
   manifest's, hashed by reading the descriptor the mapping was made from (the
   bytes the reader maps, even if the path is replaced meanwhile). This catches every flipped byte, a cached copy damaged after its
   download, and two same-size shards swapped on disk.
2. **Structure** (always, also when the bytes are not hashed): the file's
   schema and row count are the manifest's, no column has nulls, and Arrow's
   full validation passes on every column: offsets start at 0, never decrease
   and stay inside their data buffers, every buffer is as long as its rows
   need, strings are UTF-8, map keys are present, a ragged row's shape matches
   its number of values. This is what a hostile file
   whose checksum was written to match would still be refused for.
   (A reader that checks a column's offsets itself may ask for Arrow's basic
   validation of that column instead, O(1) per shard:
   ``Dataset.defer_offset_checks``; chute.tokens does, in the native pass that
   plans its sequences.)

Every failure is a :class:`chute.ShardError` naming the shard and the dataset.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import ShardError
from chute.format.manifest import Manifest, ShardInfo, checksum_fd
from chute.format.schema import ColumnType, Nullable, Ragged, Schema


def _advice(info: ShardInfo) -> str:
    return f"shard {info.file} is damaged or was replaced: run `chute inspect --verify` on the dataset and write it again"


def checksum_buffer(buffer: Any, algorithm: str) -> str:
    """The ``"<algorithm>:<hex>"`` checksum of a buffer's bytes (a mapped file: no copy)."""
    if algorithm == "xxh3_128":
        import xxhash

        hasher: Any = xxhash.xxh3_128()
    else:
        import hashlib

        hasher = hashlib.blake2b(digest_size=16)
    hasher.update(memoryview(buffer))
    return f"{algorithm}:{hasher.hexdigest()}"


def check_bytes(mapped: pa.MemoryMappedFile, path: str, info: ShardInfo, where: str) -> None:
    """The mapped shard has the manifest's size and checksum; ShardError otherwise."""
    size = mapped.size()
    if size != info.bytes:
        raise ShardError(f"{where}: shard {info.file} ({path}) is {size:,} bytes, the manifest says {info.bytes:,}; " + _advice(info))
    digest = checksum_fd(mapped.fileno(), info.checksum.split(":", 1)[0])
    if digest != info.checksum:
        raise ShardError(
            f"{where}: shard {info.file} ({path}) has checksum {digest}, the manifest says {info.checksum} "
            f"(its bytes changed on disk, or another shard's file is in its place); {_advice(info)} "
            "(a remote dataset's shard: delete this copy in the node cache and it is downloaded again)"
        )


def check_batches(batches: list[pa.RecordBatch], info: ShardInfo, schema: Schema, where: str,
                  offsets_checked: Collection[str] = ()) -> None:
    """Everything the reader takes for granted in a shard's record batches; ShardError otherwise.

    ``offsets_checked``: columns whose caller checks the offsets itself before it trusts them
    (``Dataset.defer_offset_checks``): Arrow's basic validation (buffer sizes, first and last
    offset inside the values, O(1)) instead of the full one that walks every offset."""
    rows = sum(batch.num_rows for batch in batches)
    if rows != info.rows:
        raise ShardError(f"{where}: shard {info.file} holds {rows} rows, the manifest says {info.rows}; write the dataset again")
    for batch in batches:
        for name, ctype in schema:
            column = batch.column(name)
            try:
                column.validate(full=name not in offsets_checked)
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


#: Most markers kept in one dataset directory's bucket; past it the oldest go (each marker saves one hash).
MAX_MARKERS = 100_000
HASH_WAIT = 60.0  # s: the longest a process waits for another one hashing the same shard, then hashes it itself
#: Records remembered by this process (see :func:`remember`), oldest first: its own readers skip the marker file.
_REMEMBERED: dict[str, None] = {}
_REMEMBERED_LOCK = threading.Lock()


class ShardChecks:
    """The shards one dataset has checked in this process (each once, see the module docstring).

    A shard file is identified by what ``fstat`` says of the descriptor the
    reader maps: device, inode, size, modification and change times
    (``st_ctime_ns`` moves with any write, ``utime`` or rename, and cannot be set
    back by a user). The checksum is taken by reading that same descriptor, so
    it covers the bytes the mapping shows, not whatever the path names later.

    A matching checksum is also remembered on this machine, as a marker file
    ``<chute cache dir>/verified/<dir>/<file>`` (one bucket per dataset
    directory, one marker per shard file) holding that identity and the
    checksum: other processes reading the same unchanged file do not hash it
    again. A marker whose identity differs is ignored and replaced; the first
    look into a bucket in a process removes the markers of files that are gone
    or changed, and buckets of directories that are gone, so the markers never
    outnumber the shard files checked (plus those checked since).

    Processes that open a dataset at once (the ranks of a job) share the work:
    a process that finds no marker takes the shard's lock file (``flock`` on
    ``.<file>.lock`` beside the marker) before hashing, so a second one waits
    for the first's marker instead of hashing the same bytes again; each shard
    is hashed once on the machine, not once per rank. A lock held past
    ``HASH_WAIT`` seconds (its holder stopped) is not waited for any longer.
    ``hashed`` counts the shards this object hashed.
    """

    def __init__(self, verify: bool = True) -> None:
        self.verify = bool(verify)
        self.hashed = 0
        self._done: set[tuple[Any, ...]] = set()  # (file identity..., checksum): a reused inode is another key
        self._pruned: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"verify": self.verify}  # another process checks again

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["verify"])

    def bytes(self, mapped: pa.MemoryMappedFile, path: str, info: ShardInfo, where: str) -> None:
        """Check a newly mapped shard's size and checksum (unless verification is off, or done)."""
        identity = _identity(mapped.fileno())
        if not self.verify or (*identity, info.checksum) in self._done:
            return
        record = _record(identity, info.checksum)
        if record in _REMEMBERED:  # this process downloaded and hashed these very bytes
            return
        marker = _marker_path(path)
        if marker is None:
            check_bytes(mapped, path, info, where)
            self.hashed += 1
            return
        self._prune_once(os.path.dirname(marker))
        if _read(marker) == record:
            return
        with _hashing(marker):
            if _read(marker) == record:  # another process hashed it while this one waited
                return
            check_bytes(mapped, path, info, where)
            self.hashed += 1
            _write_marker(marker, record, os.path.dirname(os.path.realpath(path)))

    def bytes_if_free(self, mapped: pa.MemoryMappedFile, path: str, info: ShardInfo, where: str) -> bool:
        """:meth:`bytes` unless another process is hashing this shard now: then nothing, and False (the shard's
        first read waits for that process's marker). Lets processes that need the same shards at once (the
        ranks of a job opening a dataset) hash different ones side by side instead of queueing on each in turn."""
        identity = _identity(mapped.fileno())
        if not self.verify or identity in self._done:
            return True
        record = _record(identity, info.checksum)
        marker = _marker_path(path)
        if record in _REMEMBERED or marker is None:
            return record in _REMEMBERED
        self._prune_once(os.path.dirname(marker))
        if _read(marker) == record:
            return True
        with _hashing(marker, wait=False) as held:
            if not held:
                return False
            if _read(marker) != record:
                check_bytes(mapped, path, info, where)
                self.hashed += 1
                _write_marker(marker, record, os.path.dirname(os.path.realpath(path)))
        return True

    def structure(self, batches: list[pa.RecordBatch], mapped: pa.MemoryMappedFile, info: ShardInfo, schema: Schema,
                  where: str, offsets_checked: Collection[str] = ()) -> None:
        """Check a newly mapped shard's record batches (unless done); from here on it counts as checked.
        ``offsets_checked``: see :func:`check_batches`."""
        key = (*_identity(mapped.fileno()), info.checksum)
        if key in self._done:
            return
        check_batches(batches, info, schema, where, offsets_checked)
        with self._lock:
            self._done.add(key)

    def _prune_once(self, bucket: str) -> None:
        with self._lock:
            if bucket in self._pruned:
                return
            self._pruned.add(bucket)
        prune_markers(bucket)


def remember(path: str, fd: int, checksum: str) -> None:
    """Record on this machine that the file open at ``fd``, named ``path``, has ``checksum`` (hashed from
    ``fd`` by the caller, unchanged since: a node cache's verified download), so that a reader mapping it
    later does not hash the same bytes again: in this process it finds the record in memory, in another the
    marker file. Failures to write the marker only cost that hash."""
    record = _record(_identity(fd), checksum)
    with _REMEMBERED_LOCK:
        _REMEMBERED[record] = None
        while len(_REMEMBERED) > MAX_MARKERS:
            del _REMEMBERED[next(iter(_REMEMBERED))]
    marker = _marker_path(path)
    if marker is not None:
        _write_marker(marker, record, os.path.dirname(os.path.realpath(path)))


def _identity(fd: int) -> tuple[int, int, int, int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _record(identity: tuple[int, ...], checksum: str) -> str:
    return " ".join(map(str, identity)) + f" {checksum}"


def _bucket_name(directory: str) -> str:
    import hashlib

    return hashlib.blake2b(directory.encode("utf-8", "surrogateescape"), digest_size=12).hexdigest()


def _marker_path(path: str) -> str | None:
    """Where the marker of the shard file at ``path`` lives (None: chute has no cache directory)."""
    from chute._paths import default_cache_dir

    try:
        real = os.path.realpath(path)
        root = default_cache_dir()
    except (OSError, RuntimeError):
        return None
    directory, name = os.path.split(real)
    return os.path.join(root, "verified", _bucket_name(directory), name)


def _lock_path(marker: str) -> str:
    return os.path.join(os.path.dirname(marker), f".{os.path.basename(marker)}.lock")


def _pause(seconds: float) -> None:
    time.sleep(seconds)


@contextlib.contextmanager
def _hashing(marker: str, wait: bool = True) -> Iterator[bool]:
    """Hold the lock of the shard behind ``marker`` (another process hashing it: wait, up to ``HASH_WAIT``; with
    ``wait=False`` give up at once). Yields whether the lock is held (or there is no lock to take). Without a
    usable lock file (no fcntl, a read-only cache) nothing is held: the shard is hashed anyway.

    The wait polls (1 ms, doubling to 50 ms) because ``flock`` has no timeout: a blocking wait on a stopped
    holder would never end, and the hash it waits for takes milliseconds to a second."""
    try:
        import fcntl

        try:
            fd = os.open(_lock_path(marker), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the first shard of its bucket
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            fd = os.open(_lock_path(marker), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except (ImportError, OSError):
        yield True
        return
    try:
        deadline = time.monotonic() + HASH_WAIT
        pause = 0.001
        held = True
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    held = False
                    break
                if time.monotonic() >= deadline:
                    break
                _pause(pause)
                pause = min(2 * pause, 0.05)
            except OSError:
                break
        yield held
    finally:
        os.close(fd)  # releases the lock


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(512)
    except (OSError, ValueError):
        return None


def _write_marker(marker: str, record: str, directory: str) -> None:
    """Write the marker atomically (a reader never sees half a record); failures only cost a hash later."""
    bucket = os.path.dirname(marker)
    try:
        os.makedirs(bucket, exist_ok=True)
        source = os.path.join(bucket, ".dir")
        new = not os.path.exists(source)
        if new:
            _atomic_write(source, directory)
        _atomic_write(marker, record)
    except OSError:
        return
    if new:  # a bucket is added only here: a sweep as each is added keeps them to the directories that exist
        sweep_buckets(os.path.dirname(bucket), keep=os.path.basename(bucket))


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def prune_markers(bucket: str) -> int:
    """Remove the markers in ``bucket`` whose shard file is gone or changed (and the lock files of those
    gone) and the oldest past ``MAX_MARKERS``; how many markers went. (The buckets beside it are swept
    when a bucket is added, :func:`sweep_buckets`: not on every process's first read, whose first batch
    would wait for one read per dataset directory this machine ever verified.)"""
    removed = 0
    directory = _read(os.path.join(bucket, ".dir"))
    try:
        entries = os.listdir(bucket)
    except OSError:
        entries = []
    names = [n for n in entries if not n.startswith(".")]
    for lock in entries:  # the lock files of shard files that are gone
        if lock.startswith(".") and lock.endswith(".lock") and directory:
            if not os.path.exists(os.path.join(directory, lock[1:-5])):
                _unlink(os.path.join(bucket, lock))
    live = []
    for name in names:
        marker = os.path.join(bucket, name)
        if name.endswith(".tmp"):
            continue
        record = _read(marker)
        try:
            now = " ".join(map(str, _stat_identity(os.path.join(directory, name)))) if directory else None
        except OSError:
            now = None  # the shard file is gone
        if now is None or record is None or record.rsplit(" ", 1)[0] != now:
            removed += _unlink(marker)
        else:
            live.append(marker)
    if len(live) > MAX_MARKERS:
        live.sort(key=lambda m: os.stat(m).st_mtime_ns if os.path.exists(m) else 0)
        for marker in live[: len(live) - MAX_MARKERS]:
            removed += _unlink(marker)
    return removed


def sweep_buckets(verified: str, keep: str | None = None) -> int:
    """Remove the buckets in ``verified`` whose dataset directory is gone (and the markers of the earlier flat
    layout), all but ``keep`` (the one just added, whose directory is there); how many markers of that layout went."""
    removed = 0
    try:
        buckets = os.listdir(verified)
    except OSError:
        buckets = []
    for other in buckets:
        if other == keep:
            continue
        path = os.path.join(verified, other)
        source = _read(os.path.join(path, ".dir"))
        if source is not None and not os.path.isdir(source):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
        elif os.path.isfile(path):  # a marker of the earlier flat layout (one file per shard)
            removed += _unlink(path)
    return removed


def _stat_identity(path: str) -> tuple[int, int, int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _unlink(path: str) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


__all__ = ["ShardChecks", "check_batches", "check_bytes", "check_empty_shards", "check_file", "checksum_buffer", "prune_markers",
           "remember", "sweep_buckets"]
