"""The node cache: one directory per node holding downloaded shards, shared by every process.

Layout of ``cache_dir``::

    .chute-cache.lock                 held briefly while space is reserved or freed
    .chute-cache.journal              what the directory holds, line by line (chute/storage/node/ledger.py)
    .chute-members/                   the processes sharing the cache and their leases (chute/storage/node/share.py)
    <key>/source                      the dataset URL this directory caches
    <key>/<shard file>                a complete, verified shard (decompressed)
    <key>/<shard file>.<size>.<tag>.part   a download in progress, reserving <size> bytes
    <key>/locks/<shard file>.lock     the shard's read lock (never deleted)
    <key>/locks/<shard file>.download the shard's download lock (never deleted)

Coordination is by ``flock`` on the lock files, which the kernel releases when
a process dies, and by atomic renames:

* a process **reading** a shard (it has it mapped, or has claimed it for a
  coming batch, or is getting it) holds its read lock shared;
* a process **downloading** a shard holds its download lock exclusive, so the
  others that need it block on the download lock until the file is there (a
  blocking wait, not a poll), and find it complete. Waiting for a download
  never waits for readers: a shared read lock is never converted to an
  exclusive one (two processes each reading a shard the other waits to upgrade
  would deadlock). Nobody waits for room while holding a download lock: a
  download that finds no room lets the lock go before it waits;
* **eviction** takes the read lock exclusive without waiting: a shard anyone
  reads is never evicted. A ``.part`` file whose download lock is free is a
  dead download's leftover and is removed.

The byte limit covers every shard and reservation under ``cache_dir`` (all
datasets cached there). The cache lock is held while the files are counted, a
``.part`` file is created, a shard is evicted, or a ``.part`` file is renamed
into place or removed (a directory listing taken during a rename could miss the
file, and the count would come out low); each of these changes is written to
the directory's journal under the lock, so a count reads the journal's new lines
instead of listing the directory (chute/storage/node/ledger.py). A download reserves its full size, under the
cache lock, by creating its ``.part`` file at that size; if that would pass the
limit, shards nobody holds are evicted first: those no process will read soon
(every process publishes the next shards it reads) and this process never reads
again first, then the one whose next use is furthest away. Shards already in
the cache from an earlier run are reused (their names carry a per-write token,
so a rewritten dataset never matches stale files; the size is checked).

With a limit, a process holds shards only within its **lease** (see
chute/storage/node/share.py): leases together fit the limit, so the room a holder
needs is always there once the shards nobody holds are evicted; a process that
cannot get the lease its loader needs waits for its turn holding nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, cast

from chute._paths import default_cache_dir
from chute.errors import CacheFullError, ChuteError, ShardError
from chute.format import validate
from chute.format.manifest import Manifest, ShardInfo
from chute.observe import inflight
from chute.storage.net.remote import Cancelled, Remote, StreamHash, verify_fd
from chute.storage.net.stream import TooLong
from chute.storage.node import steps
from chute.storage.node.direct import DIRECT_HOLDS, DirectReads
from chute.storage.node.ledger import DOWNLOAD_LOCK, DOWNLOADS, PART_SUFFIX, ledger, lock_path, try_exclusive, unlink
from chute.storage.node.share import DEAD_PEER_CHECK_S, LOCK_NAME, Sharing, cache_lock

log = logging.getLogger("chute")

#: Most cached shards ranked for one eviction (see ShardCache._by_eviction_order).
EVICTION_SAMPLE = 256
_SAMPLER = random.Random()

class _Bounded:
    """The decompressed bytes of a shard on their way into its ``.part`` file: no more than the manifest's
    size of it (a damaged or hostile ``.zst`` that inflates further is a transfer error, retried), hashed
    as they are written (``digest``: a restart from offset 0 starts the hash again)."""

    def __init__(self, out: Any, limit: int, digest: StreamHash) -> None:
        self.out, self.limit, self.digest, self.written = out, limit, digest, 0

    def write(self, data: bytes) -> int:
        size = len(data)
        if self.written + size > self.limit:
            raise TooLong(self.limit, f"the shard decompresses to more than the {self.limit:,} bytes the manifest gives it")
        self.out.write(data)
        self.digest.feed(self.written, [data])
        self.written += size
        return size

    def flush(self) -> None:
        self.out.flush()


class ShardCache:
    """One dataset's shards in a node cache: ``acquire`` a shard (downloading it if needed), ``release`` it.

    A shard is held (shared lock, counted per process) from ``acquire`` to the
    matching ``release``; while held it is on disk and is not evicted. A loader's
    downloader first ``claim``s the shards it will acquire (within this process's
    lease, see chute/storage/node/share.py), so that it never waits on another process
    while holding shards. Thread-safe.

    ``share=False`` keeps the cache out of the leases (the progressive mode's
    snapshots, which hold only shards already complete).
    """

    def __init__(self, remote: Remote, manifest: Manifest, cache_dir: str | None = None, limit: int | None = None,
                 *, share: bool = True) -> None:
        self.remote = remote
        self.manifest = manifest
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
        self.limit = None if limit is None else int(limit)
        key = hashlib.blake2b(remote.url.encode("utf-8"), digest_size=8).hexdigest()
        self.dir = os.path.join(self.cache_dir, key)
        self._made = False  # the directory is made at the first hold, not here: opening touches no disk
        self._cond = threading.Condition()
        self._refs: dict[int, int] = {}
        self._fds: dict[int, int] = {}
        self._loading: set[int] = set()
        self._claims: dict[int, int] = {}  # shard -> claims not yet turned into holds
        self._reserved: set[int] = set()  # shards whose bytes this process's lease counts
        self._index: dict[str, int] | None = None  # cached file name -> shard (see _eviction_order)
        self.next_use: Callable[[int], float] | None = None  # set by the loader: step of a shard's next use
        self.on_no_room: Callable[[], None] | None = None  # set by the loader: a download of this process waits for room
        self.on_unpin: Callable[[int], None] | None = None  # called before a shard's lock is dropped
        # called after: the process's last hold on shard i is gone (a loader's worker processes are told)
        self.unpin_listeners: list[Callable[[int], None]] = []
        self._guests: frozenset[int] = frozenset()  # shards held for this process by its parent (see guest_reads)
        self.counts = {"hits": 0, "misses": 0, "shards_downloaded": 0, "bytes_downloaded": 0,
                       "evictions": 0, "recycled": 0, "checksum_failures": 0, "high_water": 0, "room_waits": 0}
        sizes = sorted((s.bytes for s in manifest.shards), reverse=True)
        largest = sizes[0] if sizes else 0
        if self.limit is not None and largest > self.limit:
            raise CacheFullError(
                f"cache_limit {self.limit:,} bytes is smaller than the largest shard of {remote.url} "
                f"({largest:,} bytes); the cache needs at least {largest:,} bytes (more to read ahead)"
            )
        self.sharing: Sharing | None = None
        if self.limit is not None and share:
            direct = sum(sizes[:DIRECT_HOLDS]) if sum(sizes[:DIRECT_HOLDS]) <= self.limit else largest
            self.sharing = Sharing(self.cache_dir, self.limit, name="chute-share", direct_minimum=direct)
        self._pid = os.getpid()
        self._inherited = False  # a forked child dropped its parent's holds (see _after_fork)
        self.direct = DirectReads(self)  # the holds of direct reads (chute/storage/node/direct.py)

    def _after_fork(self) -> None:
        """In a process forked from the one that used this cache (a DataLoader worker): forget the
        parent's holds and membership, which stay the parent's (closing our copies of its lock
        descriptors leaves its locks in place), and start afresh."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        for fd in self._fds.values():
            os.close(fd)
        self._fds, self._refs, self._claims, self._reserved, self._loading = {}, {}, {}, set(), set()
        self._cond = threading.Condition()
        self._inherited = True
        self.direct = DirectReads(self)
        self.unpin_listeners, self._guests = [], frozenset()
        if self.sharing is not None:
            self.sharing = Sharing(self.cache_dir, self.limit, name="chute-share", direct_minimum=self.sharing.direct_minimum)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"ShardCache({self.remote.url!r} in {self.dir!r}, limit={self.limit})"

    def __reduce__(self):  # a worker process gets its own view of the same node cache
        return (type(self), (self.remote, self.manifest, self.cache_dir, self.limit))

    # ------------------------------------------------------------------ paths and state

    def path(self, i: int) -> str:
        return os.path.join(self.dir, self._file(i))

    def _file(self, i: int) -> str:
        return self.manifest.shards[i].file.replace("/", "%2F")

    def ident(self, i: int) -> str:
        """Shard ``i`` as other processes sharing the cache name it: ``<dataset dir>/<file>``."""
        return f"{os.path.basename(self.dir)}/{self._file(i)}"

    def held(self, i: int) -> int:
        """How many holds this process has on shard ``i``."""
        return self._refs.get(i, 0)

    # the reader's direct reads (the ShardSource seam, chute.format.reader): see chute/storage/node/direct.py

    def hold_for_read(self, i: int) -> contextlib.AbstractContextManager[str]:
        """Shard ``i`` held while a direct read maps it; kept for a while after. A guest
        shard (:meth:`guest_reads`) is mapped without a hold of this process."""
        self._after_fork()
        if i in self._guests and not self._refs.get(i):
            return contextlib.nullcontext(self.path(i))
        return self.direct.hold(i)

    @contextlib.contextmanager
    def guest_reads(self, shards: Iterable[int]) -> Iterator[None]:
        """Reads of ``shards`` that another process holds for this one: a loader's worker process
        builds a batch only once its parent holds the batch's shards, and the parent lets them go
        only after the batch. Mapped without a hold of its own (no lock, no lease, no room), a
        guest shard stays mapped after the read until :meth:`let_go` (the parent's hold is gone)."""
        self._guests = frozenset(shards)
        try:
            yield
        finally:
            self._guests = frozenset()

    def let_go(self, i: int) -> None:
        """The process that held shard ``i`` for this one's guest reads has let go of it: unmap it
        (unless this process holds it itself: then the last release unmaps it)."""
        with self._cond:
            if self._refs.get(i):
                return
        if self.on_unpin is not None:
            self.on_unpin(i)

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """A direct batch read: the shards it maps stay held until it ends."""
        self._after_fork()
        return self.direct.reading()

    def release_direct(self) -> None:
        """Let go of the shards kept after direct reads."""
        self._after_fork()
        self.direct.release_all()

    def cached(self, i: int) -> bool:
        """Whether shard ``i`` is complete in the cache now (it may be evicted right after unless held)."""
        try:
            return os.path.getsize(self.path(i)) == self.manifest.shards[i].bytes
        except FileNotFoundError:
            return False

    def stats(self) -> dict[str, Any]:
        """Counters of this process's use of the cache, and the bytes the cache holds now (``bytes_cached``,
        as its journal counts them: with the leftovers of a dead download until the next scan removes them).

        ``high_water`` is the most bytes the cache held right after one of this
        process's reservations (every byte enters the cache through a reservation,
        so the largest over the processes sharing it is the cache's high-water mark).
        """
        with cache_lock(self.cache_dir):
            books = ledger(self.cache_dir)
            books.sync()  # as the journal counts it: a dead download's leftover until the next scan
            used = books.used
        out: dict[str, Any] = dict(self.counts)
        out["retries"] = self.remote.retries
        out["bytes_cached"] = used
        out["limit"] = self.limit
        if self.sharing is not None:
            out.update(self.sharing.counts)
            out["lease"] = self.sharing.lease
        lookups = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / lookups if lookups else None
        return out

    # ------------------------------------------------------------------ holding shards

    def claim(self, i: int) -> bool:
        """Count shard ``i`` in this process's lease ahead of :meth:`acquire`, if the lease has room
        now (no waiting); whether it did. Each claim is used by one ``acquire`` or dropped by
        :meth:`unclaim`."""
        self._after_fork()
        with self._cond:
            if self.sharing is not None and i not in self._reserved:
                if not self.sharing.try_reserve(self.manifest.shards[i].bytes):
                    return False
                self._reserved.add(i)
            self._claims[i] = self._claims.get(i, 0) + 1
            return True

    def unclaim(self, i: int) -> None:
        """Drop a claim that will not be acquired."""
        with self._cond:
            self._claims[i] -= 1
            if not self._claims[i]:
                del self._claims[i]
            gone = self._uncommit(i)
        self._settle(gone)

    def acquire(self, i: int) -> str:
        """Hold shard ``i`` in the cache, downloading it if needed; its local path."""
        self._after_fork()
        with self._cond:
            while True:
                if self._refs.get(i, 0) > 0:
                    self._refs[i] += 1
                    self._use_claim(i)
                    return self.path(i)
                if i not in self._loading:
                    self._loading.add(i)
                    self._use_claim(i)
                    break
                self._cond.wait()  # another thread of this process is getting it
            reserved = i in self._reserved or self.sharing is None
        fd = None
        try:
            if not reserved:  # a direct read: wait for room in the lease (holding nothing new)
                size = self.manifest.shards[i].bytes
                self.sharing.reserve(size, cancelled=self.remote.cancelled)  # type: ignore[union-attr]
                with self._cond:
                    twice = i in self._reserved  # a claim counted it meanwhile
                    self._reserved.add(i)
                if twice:
                    self.sharing.unreserve(size)  # type: ignore[union-attr]
            fd = self._hold(i)
        finally:
            with self._cond:
                self._loading.discard(i)
                if fd is not None:
                    self._refs[i] = 1
                    self._fds[i] = fd
                gone = self._uncommit(i)
                self._cond.notify_all()
            self._settle(gone)
        if steps.HOOK is not None:
            steps.HOOK("held", shard=i, path=self.path(i))
        return self.path(i)

    def _use_claim(self, i: int) -> None:
        if self._claims.get(i):
            self._claims[i] -= 1
            if not self._claims[i]:
                del self._claims[i]

    def _uncommit(self, i: int) -> int:
        """Under ``_cond``: stop counting shard ``i`` in the lease if nothing holds, gets or claims it; its bytes."""
        if i in self._reserved and not (self._refs.get(i) or i in self._loading or self._claims.get(i)):
            self._reserved.discard(i)
            size = self.manifest.shards[i].bytes
            self.sharing.unreserve(size)  # type: ignore[union-attr]
            return size
        return 0

    def _settle(self, freed: int) -> None:
        if freed and self.sharing is not None:
            self.sharing.settle()

    def release(self, i: int) -> None:
        """Drop one hold on shard ``i``; with the last one it becomes evictable."""
        self._after_fork()
        with self._cond:
            count = self._refs.get(i, 0) - 1
            if count > 0:
                self._refs[i] = count
                return
            if count < 0:
                if self._inherited:
                    return  # a hold the parent process took before this one was forked
                raise AssertionError(f"shard {i} released more often than acquired")
            del self._refs[i]
            fd = self._fds.pop(i)
        if steps.HOOK is not None:
            steps.HOOK("release", shard=i, path=self.path(i))
        if self.on_unpin is not None:
            self.on_unpin(i)
        os.close(fd)  # drops the shared lock
        for listener in list(self.unpin_listeners):
            listener(i)
        with self._cond:
            gone = self._uncommit(i)
            self._cond.notify_all()
        self._settle(gone)

    def close(self) -> None:
        """Drop every hold (shards stay cached for the next run) and leave the cache's members."""
        self._after_fork()
        with self._cond:
            fds = list(self._fds.values())
            self._fds.clear()
            self._refs.clear()
            self._claims.clear()
            self._reserved.clear()
        for fd in fds:
            os.close(fd)
        if self.sharing is not None:
            self.sharing.close()

    def _make_dir(self) -> None:
        """This dataset's cache directory, its lock folder and its ``source`` file."""
        if self._made:
            return
        os.makedirs(os.path.join(self.dir, "locks"), exist_ok=True)
        source = os.path.join(self.dir, "source")
        if not os.path.exists(source):
            tmp = f"{source}.{secrets.token_hex(4)}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.remote.url + "\n")
            os.replace(tmp, source)
        self._made = True

    def _hold(self, i: int) -> int:
        """Take the read lock on shard ``i`` (shared) with the file complete on disk; its descriptor.

        Held from before the shard is looked for, so it cannot be evicted between
        being found and being read. A missing shard is downloaded under its
        download lock: the one process that takes it downloads, the others wait
        on it and then find the file. A download that finds no room lets the
        download lock go before it waits for room.
        """
        self._make_dir()
        info = self.manifest.shards[i]
        fd = os.open(lock_path(self.dir, self._file(i)), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an eviction removes the file
            while True:
                if self.cached(i):
                    self.counts["hits"] += 1
                    return fd
                download_lock = lock_path(self.dir, self._file(i), DOWNLOAD_LOCK)
                download = os.open(download_lock, os.O_RDWR | os.O_CREAT, 0o644)
                locked = False
                try:
                    with inflight.track("wait for another process's download of", self.remote.url + "/" + info.file):
                        fcntl.flock(download, fcntl.LOCK_EX)  # blocks while another process downloads it
                    DOWNLOADS.locked(download_lock)  # a scan meanwhile removes a dead download's .part of it
                    locked = True
                    if self.cached(i):
                        self.counts["hits"] += 1
                        return fd
                    part = self._reserve(i, info.bytes)
                    if part is not None:
                        self.counts["misses"] += 1
                        self._download(i, info, part)
                        return fd
                finally:
                    if locked:
                        DOWNLOADS.unlocked(download_lock)
                    os.close(download)  # drops the download lock; the read lock stays
                self._wait_for_room(i)
        except BaseException:
            os.close(fd)
            raise

    # ------------------------------------------------------------------ downloading

    def _download(self, i: int, info: ShardInfo, part: str) -> None:
        """Download shard ``i`` into ``part`` (its download lock is held); verify; rename into place."""
        final = self.path(i)
        url = self.remote.url + "/" + info.stored_file
        try:
            for attempt in (1, 2):
                streamed = self._fetch(info, part)
                problem = self._place(part, final, info, url, streamed)
                if problem is None:
                    break
                self.counts["checksum_failures"] += 1
                if attempt == 2:
                    raise ShardError(
                        f"{problem}, twice in a row: the remote copy of shard {info.file} is damaged. "
                        "Write the dataset to the remote store again"
                    )
                log.warning("chute: %s; downloading it again", problem)
        except BaseException:
            with cache_lock(self.cache_dir):
                unlink(part)
                books = ledger(self.cache_dir)
                books.sync()
                books.remove(self.dir, os.path.basename(part))
            raise
        finally:
            DOWNLOADS.discard(part)
        self.counts["shards_downloaded"] += 1
        self.counts["bytes_downloaded"] += info.stored_bytes if info.compression else info.bytes  # type: ignore[operator]

    def _place(self, part: str, final: str, info: ShardInfo, url: str, streamed: str | None) -> str | None:
        """Check the downloaded ``part`` against the manifest (``streamed``: the checksum of its bytes,
        hashed as they were written; None: hash the file) and, when it matches, rename it into place and
        remember its checksum for the readers; else what is wrong with it (``part`` stays)."""
        fd = os.open(part, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            hashed = os.fstat(fd)
            problem = verify_fd(fd, info.checksum, url, info.bytes, streamed)
            if problem is not None:
                return problem
            if steps.HOOK is not None:
                steps.HOOK("downloaded", part=part, final=final)
            with cache_lock(self.cache_dir):  # a concurrent scan sees the .part or the shard, never neither
                os.replace(part, final)
                books = ledger(self.cache_dir)
                books.sync()
                books.remove(self.dir, os.path.basename(part))
                books.add(self.dir, os.path.basename(final), info.bytes)
            # The bytes just hashed are the shard's: remembered (with the file's identity after the rename),
            # the reader's mapping of it does not hash them again; a file changed since no longer matches.
            now = os.fstat(fd)
            if (now.st_size, now.st_mtime_ns) == (hashed.st_size, hashed.st_mtime_ns):
                validate.remember(final, fd, info.checksum)
            return None
        finally:
            os.close(fd)

    def _fetch(self, info: ShardInfo, part: str) -> str | None:
        """Download shard ``info`` into ``part``; the checksum of its bytes when hashed on the way (else None)."""
        if info.compression is None:
            return self.remote.download(info.file, part, info.bytes, info.checksum.split(":", 1)[0])
        try:
            import zstandard
        except ImportError:
            raise ChuteError(f"{self.remote.url} stores its shards compressed with zstd: pip install 'chute[zstd]'") from None
        with open(part, "r+b") as out:
            bounded = _Bounded(out, info.bytes, StreamHash(info.checksum.split(":", 1)[0]))
            decompressor = [zstandard.ZstdDecompressor().stream_writer(cast("IO[bytes]", bounded), closefd=False)]

            def restart() -> None:
                out.seek(0)
                bounded.written = 0
                decompressor[0] = zstandard.ZstdDecompressor().stream_writer(cast("IO[bytes]", bounded), closefd=False)

            def write(chunk: bytes) -> None:
                decompressor[0].write(chunk)  # decompressed in pieces: never more than the shard's size written

            self.remote.download_stream(info.stored_file, write, restart, info.stored_bytes)
            decompressor[0].flush()
            if bounded.written < info.bytes:  # a short stream: the checksum check will catch it; keep the reservation size
                out.truncate(info.bytes)
        return bounded.digest.result(info.bytes)

    def _reserve(self, i: int, size: int) -> str | None:
        """Create shard ``i``'s ``.part`` file at full size, evicting to stay under the limit; None
        if there is no room (only holds outside any lease can cause that, see chute/storage/node/share.py).

        The journal counts the ``.part`` before it exists (a recycled file: before it is renamed), so a
        process killed at any point here leaves the journal counting too much, never too little."""
        if self.remote.cancelled():  # closed, or this thread's loader was closed: evict nothing for it
            raise Cancelled(f"{self.remote.url}: download of shard {self.manifest.shards[i].file} cancelled (closed)")
        part = os.path.join(self.dir, f"{self._file(i)}.{size}.{secrets.token_hex(4)}{PART_SUFFIX}")
        name = os.path.basename(part)
        with cache_lock(self.cache_dir):
            books = ledger(self.cache_dir)
            room, recycled = self._make_room(i, size, part)
            if not room:
                if recycled:
                    unlink(part)
                    books.remove(self.dir, name)
                return None
            if not recycled:
                books.add(self.dir, name, size)
            try:
                # a recycled file keeps its blocks and its pages in the page cache: the download overwrites
                # them instead of the kernel freeing the evicted shard's and allocating the new one's
                fd = os.open(part, os.O_RDWR | (0 if recycled else os.O_CREAT | os.O_EXCL), 0o644)
            except OSError as exc:
                unlink(part)
                books.remove(self.dir, name)
                raise ChuteError(f"cannot reserve {size:,} bytes in the cache {self.cache_dir}: {exc}") from None
            try:
                if recycled:
                    os.ftruncate(fd, size)
                if size:
                    os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                os.close(fd)
                unlink(part)
                books.remove(self.dir, name)
                raise ChuteError(f"cannot reserve {size:,} bytes in the cache {self.cache_dir}: {exc}") from None
            os.close(fd)
            DOWNLOADS.add(part)
            self.counts["high_water"] = max(self.counts["high_water"], books.used)
            if steps.HOOK is not None:
                steps.HOOK("reserved", path=part, size=size)
        return part

    def _wait_for_room(self, i: int) -> None:
        """Wait until a shard is released here or in another process (holding no download lock)."""
        self.counts["room_waits"] += 1
        if self.remote.cancelled():
            raise Cancelled(f"{self.remote.url}: download of shard {self.manifest.shards[i].file} cancelled (closed)")
        on_no_room = self.on_no_room
        if on_no_room is not None:  # this process's read-ahead may be what fills the cache
            on_no_room()
        with inflight.track("wait for room in the cache", self.cache_dir):
            if self.sharing is not None:
                self.sharing.await_room()
            else:
                with self._cond:
                    began = time.monotonic()
                    rung = self._cond.wait(DEAD_PEER_CHECK_S)
                if steps.HOOK is not None:
                    steps.HOOK("woken", rung=rung, seconds=time.monotonic() - began)

    def _make_room(self, i: int, size: int, part: str) -> tuple[bool, bool]:
        """Evict until ``size`` more bytes fit under the limit (holding the cache lock): ``(whether they
        fit, whether the first shard evicted was renamed to ``part`` for the download to overwrite, instead
        of removed)``; a recycled ``part`` is already in the journal at ``size``. What the cache holds comes
        from its journal (chute/storage/node/ledger.py); when evicting every shard nobody holds is not
        enough, a scan of the directory (which removes dead downloads' leftovers) decides."""
        books = ledger(self.cache_dir)
        books.sync()
        if self.limit is None or books.used + size <= self.limit:
            return True, False
        mine = {self._file(j) for j in list(self._refs)} | {self._file(j) for j in list(self._loading) if j != i}
        if self.sharing is None:
            held = sum(self.manifest.shards[j].bytes for j in list(self._refs))
            if held + size > self.limit:
                raise CacheFullError(
                    f"cache_limit {self.limit:,} bytes cannot hold shard {self.manifest.shards[i].file} "
                    f"({size:,} bytes) beside the {held:,} bytes this process must keep at once; "
                    f"raise cache_limit to at least {held + size:,} bytes"
                )
        recycled = [False]
        name = os.path.basename(part)

        def evict(path: str) -> None:
            if not recycled[0]:
                try:
                    # nobody holds it (its read lock is ours, exclusive): nobody reads it. Cut to the reservation
                    # and counted as the .part before it is named one: no .part is ever larger than its name
                    # reserves or missing from the journal, even one left by a process killed here (a cut shard
                    # under its own name is never taken as complete, its size is checked; the journal counts
                    # it at its old size until it is removed from it below, or a scan)
                    if os.path.getsize(path) > size:
                        os.truncate(path, size)
                    books.add(self.dir, name, size)
                    os.rename(path, part)
                    recycled[0] = True
                    self.counts["recycled"] += 1
                    return
                except OSError:
                    books.remove(self.dir, name)
            unlink(path)

        def fits() -> bool:
            return books.used + (0 if recycled[0] else size) <= self.limit  # type: ignore[operator]

        for attempt in (1, 2):
            for directory, shard, _ in self._by_eviction_order(books.shards(), mine):
                path = os.path.join(directory, shard)
                if try_exclusive(directory, shard, lambda p=path: evict(p)):  # type: ignore[misc]
                    books.remove(directory, shard)
                    self.counts["evictions"] += 1
                    if fits():
                        return True, recycled[0]
            if attempt == 1:
                if recycled[0]:  # the scan would count it as a download of its own: removed, as evicted
                    unlink(part)
                    books.remove(self.dir, name)
                    recycled[0] = False
                books.rescan()
                if fits():
                    return True, False
        return False, recycled[0]

    def _by_eviction_order(self, shards: list[tuple[str, str, int]], mine: set[str]) -> Iterator[tuple[str, str, int]]:
        """The cached ``shards`` but this dataset's files in ``mine``, in the order to evict them, the best first.

        Up to ``EVICTION_SAMPLE`` of them are ranked exactly. Beyond that, the
        order's key (a Python call per shard) would grow with the cache, under the
        lock every download takes: the best of a random sample of that many come
        first (as Redis approximates LRU), then, if more room is needed, the rest
        in exact order. benchmarks/cache_scale.py simulates what this costs in
        downloads.
        """
        order = self._eviction_order()
        here = self.dir

        def allowed(shard: tuple[str, str, int]) -> bool:
            return not (shard[1] in mine and shard[0] == here)

        if len(shards) <= EVICTION_SAMPLE:
            yield from sorted(filter(allowed, shards), key=order, reverse=True)
            return
        picked = set(_SAMPLER.sample(range(len(shards)), EVICTION_SAMPLE))
        yield from sorted(filter(allowed, (shards[k] for k in picked)), key=order, reverse=True)
        yield from sorted((c for k, c in enumerate(shards) if k not in picked and allowed(c)), key=order, reverse=True)

    def _eviction_order(self) -> Callable[[tuple[str, str, int]], tuple[float, float]]:
        """Sort key of cached shards, largest evicted first: ``(rank, next use)``, where rank is the
        shard's place in the soonest list of shards any sharing process reads next (inf: in none)
        and next use is this process's next step reading it (inf: never)."""
        index = self._index
        if index is None:  # once per cache: a dataset of many shards would pay it at every eviction
            index = self._index = {s.file.replace("/", "%2F"): j for j, s in enumerate(self.manifest.shards)}
        next_use = self.next_use
        ranks = self.sharing.others_soon() if self.sharing is not None else {}
        own = self.sharing.soon() if self.sharing is not None else []
        for k, ident in enumerate(own):
            ranks[ident] = min(k, ranks.get(ident, k))
        key = os.path.basename(self.dir)

        def order(item: tuple[str, str, int]) -> tuple[float, float]:
            directory, name, _ = item
            rank = ranks.get(f"{os.path.basename(directory)}/{name}", math.inf)
            mine = directory == self.dir and os.path.basename(directory) == key and name in index
            return rank, (next_use(index[name]) if mine and next_use is not None else math.inf)

        return order


__all__ = ["ShardCache", "CacheFullError", "default_cache_dir", "LOCK_NAME"]
