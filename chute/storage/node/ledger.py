"""What a node cache directory holds, known without listing it at every reservation.

The files that count against a cache's byte limit are the complete shards
(``<key>/<file>.arrow``) and the downloads in progress (``<key>/<...>.part``,
counted at the size they reserve). Every change to them (a ``.part`` created,
renamed into place or removed; a shard evicted; a dead download's leftover
removed) is made under the cache lock, and the process making it appends a line
to the directory's journal (``.chute-cache.journal``) before it lets the lock go
(a ``.part`` is counted before it is created or renamed into being, so a process
killed in the middle of a reservation leaves it counted)::

    + <key>/<file> <bytes>      the file counts <bytes> from now on
    - <key>/<file>              it no longer counts

The journal's first line, ``# <16 hex digits>``, is new at every rewrite. A
process that read the journal up to some offset reads on from there only if
the file is still the one it read: the same inode and the same first line. The
inode alone is not enough: a file system gives a freed inode number to the next
file it makes (ext4 alternates two numbers between successive rewrites), so
after two rewrites by others the journal can be a new file under the old
number, and the process would read on from the middle of a snapshot it never
saw the start of, missing what that start counts (the cache then goes over
its limit by what it missed, until a scan).

Each process keeps what the journal says in memory (:class:`Ledger`) and, each
time it takes the lock, reads only the lines added since it last looked: a
reservation costs a ``stat`` and a short read, not a listing of every dataset
directory with a ``stat`` per shard (a cost that grows with the cached shards,
all of it under the one lock every process's downloads take; its figure is in
docs/benchmarks.md, "Design figures").

The journal is rewritten from a full :func:`scan` of the directory when a
process finds it missing, unreadable or much longer than the state it describes,
at least every ``RESCAN_S`` seconds, and when an eviction cannot make room. A
scan is also what removes the ``.part`` files of downloads whose process died
(their download lock is free) and forgets files removed by hand: until then the
journal still counts them, so it may count too much, never too little, and the
limit holds. (A shard file put into the directory by other means is counted
from the next scan.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
import time
from collections.abc import Callable

PART_SUFFIX = ".part"
READ_LOCK = ".lock"  # held shared by readers of a shard, exclusive by its eviction
DOWNLOAD_LOCK = ".download"  # held exclusive by the one process downloading a shard
JOURNAL = ".chute-cache.journal"
#: The longest a process trusts the journal without a scan of the directory (seconds).
RESCAN_S = 30.0
#: A journal this many lines longer than the state it describes is rewritten as that state.
COMPACT_LINES = 4096
#: The length of the journal's first line, ``# <hex>\n``, new at every rewrite (see the module docstring).
HEAD_BYTES = 19


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def lock_path(directory: str, file: str, kind: str = READ_LOCK) -> str:
    return os.path.join(directory, "locks", file.replace("/", "%2F") + kind)


def try_exclusive(directory: str, file: str, action: Callable[[], None], kind: str = READ_LOCK) -> bool:
    """Run ``action`` holding ``file``'s lock ``kind`` exclusive if nobody holds it; whether it ran."""
    fd = os.open(lock_path(directory, file, kind), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        action()
        return True
    finally:
        os.close(fd)


def part_of(name: str) -> tuple[str | None, int]:
    """``(shard file, reserved bytes)`` of a ``.part`` file's name; ``(None, 0)`` if it is not one."""
    parts = name[: -len(PART_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None, 0
    return parts[0], int(parts[1])


class Downloads:
    """The ``.part`` files this process is writing now, and the download locks it holds.

    A scan counts this process's own ``.part`` files without probing their download locks (one open
    and ``flock`` each, the larger part of a scan's cost with many downloads in flight). And it must
    not probe the download locks this process holds: ``flock`` on a fresh descriptor fails against
    this process's own lock as against another's, so a dead process's ``.part`` of a shard this
    process is about to download would look alive, and count against the limit for as long as the
    download waits for the room it takes (a hang the stress test found). Holding a shard's download
    lock, this process is the only one downloading that shard: every ``.part`` of it that is not in
    :attr:`_parts` is a dead download's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._parts: set[str] = set()
        self._locks: set[str] = set()  # download lock paths held by this process

    def _forked(self) -> None:
        if self._pid != os.getpid():  # the parent's downloads and locks are not this process's
            self._pid, self._parts, self._locks = os.getpid(), set(), set()

    def add(self, part: str) -> None:
        with self._lock:
            self._forked()
            self._parts.add(part)

    def discard(self, part: str) -> None:
        with self._lock:
            self._parts.discard(part)

    def __contains__(self, part: str) -> bool:
        return self._pid == os.getpid() and part in self._parts

    def locked(self, path: str) -> None:
        """This process took the download lock ``path`` (a shard's, see :func:`lock_path`)."""
        with self._lock:
            self._forked()
            self._locks.add(os.path.normpath(path))

    def unlocked(self, path: str) -> None:
        with self._lock:
            self._locks.discard(os.path.normpath(path))

    def holds_lock(self, path: str) -> bool:
        return self._pid == os.getpid() and os.path.normpath(path) in self._locks


DOWNLOADS = Downloads()


def scan(cache_dir: str) -> dict[str, int]:
    """Every file under ``cache_dir`` that counts against its limit, as ``{"<key>/<file>": bytes}``
    (call it holding the cache lock).

    ``.part`` files count at the size their name reserves; those whose download
    died (their lock is free) are removed.
    """
    files: dict[str, int] = {}
    try:
        entries = list(os.scandir(cache_dir))
    except FileNotFoundError:
        return files
    for entry in entries:
        if not entry.is_dir() or not os.path.isdir(os.path.join(entry.path, "locks")):
            continue
        for item in os.scandir(entry.path):
            if not item.is_file():
                continue
            name = item.name
            if name.endswith(PART_SUFFIX):
                shard, size = part_of(name)
                if shard is None:
                    continue
                if item.path not in DOWNLOADS:
                    if DOWNLOADS.holds_lock(lock_path(entry.path, shard, DOWNLOAD_LOCK)):
                        unlink(item.path)  # this process downloads that shard: a dead download's leftover
                        continue
                    if try_exclusive(entry.path, shard, lambda: unlink(item.path), DOWNLOAD_LOCK):
                        continue  # a dead download's leftover
            elif name.endswith(".arrow"):
                try:
                    size = item.stat().st_size
                except FileNotFoundError:
                    continue
            else:
                continue
            files[f"{entry.name}/{name}"] = size
    return files


class Ledger:
    """One process's copy of a cache directory's journal (see the module docstring).

    Use it only holding the cache lock: :meth:`sync` first, then read
    :attr:`used` and :meth:`shards`, and report each change made with
    :meth:`add` or :meth:`remove`.
    """

    def __init__(self, cache_dir: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache_dir = cache_dir
        self.path = os.path.join(cache_dir, JOURNAL)
        self.clock = clock
        self.files: dict[str, int] = {}
        self.used = 0
        self._shards: dict[str, tuple[str, str, int]] = {}  # the complete shards of files, as shards() gives them
        self.scans = 0  # full scans of the directory this process made
        self._ident: tuple[int, int] | None = None  # (device, inode) of the journal file read
        self._head = b""  # and its first line (new at every rewrite; empty: none read yet)
        self._offset = 0  # bytes of it read
        self._lines = 0  # lines of it read (a snapshot's and the changes after it)
        self._scanned = -float("inf")
        self._stale = True  # the next sync scans

    def sync(self) -> None:
        """Bring the state up to date: the journal's new lines, or a scan when it is due or the journal is unusable."""
        if self._stale or self.clock() - self._scanned >= RESCAN_S:
            self.rescan()
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self.rescan()
            return
        try:
            st = os.fstat(fd)
            head = self._head
            if (st.st_dev, st.st_ino) != self._ident or st.st_size < self._offset or not head or (
                    os.pread(fd, len(head), 0) != head):
                self._reset((st.st_dev, st.st_ino))  # rewritten by another process's scan: read it whole
            data = os.pread(fd, st.st_size - self._offset, self._offset) if st.st_size > self._offset else b""
        finally:
            os.close(fd)
        start = 0
        if not self._offset:  # the file from its start: its first line names it
            start = data.find(b"\n") + 1
            if not data.startswith(b"# ") or start != HEAD_BYTES:
                self.rescan()  # a journal without one (an older chute's, or a line cut short): written anew
                return
            self._head = data[:start]
        end = data.rfind(b"\n") + 1  # a line still being written (never, under the lock) waits for the next look
        if end > start and not self._apply(data[start:end]):
            self.rescan()
            return
        self._offset += end
        if self._lines > COMPACT_LINES + 2 * len(self.files):
            self.rescan()

    def rescan(self) -> None:
        """Scan the directory and rewrite the journal as what it holds."""
        self.files = scan(self.cache_dir)
        self.used = sum(self.files.values())
        self._shards = {}
        for key, size in self.files.items():
            self._index(key, size)
        self.scans += 1
        self._scanned = self.clock()
        self._stale = False
        head = f"# {secrets.token_hex(8)}\n".encode()  # HEAD_BYTES long
        text = head + "".join(f"+ {key} {size}\n" for key, size in self.files.items()).encode("utf-8", "surrogateescape")
        tmp = f"{self.path}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(text)
                while view:  # never a torn snapshot in place: a full disk raises (then no journal at all)
                    written = os.write(fd, view)
                    if written <= 0:
                        raise OSError(f"cannot write {self.path}")
                    view = view[written:]
                st = os.fstat(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            unlink(tmp)
            self._invalidate()  # a full disk: scan at every look, as without a journal
            return
        self._ident, self._head, self._offset, self._lines = (st.st_dev, st.st_ino), head, len(text), len(self.files)

    def shards(self) -> list[tuple[str, str, int]]:
        """The complete shards as ``(dataset directory, file, bytes)`` (kept as the journal is read, so
        that this is a copy of a list, not a pass of Python code over every cached shard)."""
        return list(self._shards.values())

    def add(self, directory: str, name: str, size: int) -> None:
        """``directory/name`` counts ``size`` bytes from now on (made under the lock held since :meth:`sync`)."""
        key = self._key(directory, name)
        self._count(key, size)
        self._append(f"+ {key} {size}\n")

    def remove(self, directory: str, name: str) -> None:
        """``directory/name`` no longer counts (removed under the lock held since :meth:`sync`)."""
        key = self._key(directory, name)
        self._count(key, None)
        self._append(f"- {key}\n")

    def _key(self, directory: str, name: str) -> str:
        return f"{os.path.basename(directory)}/{name}"

    def _count(self, key: str, size: int | None) -> None:
        self.used -= self.files.pop(key, 0)
        self._shards.pop(key, None)
        if size is not None:
            self.files[key] = size
            self.used += size
            self._index(key, size)

    def _index(self, key: str, size: int) -> None:
        if key.endswith(".arrow"):
            directory, name = key.split("/", 1)
            self._shards[key] = (os.path.join(self.cache_dir, directory), name, size)

    def _append(self, line: str) -> None:
        if self._stale or "\n" in line[:-1]:
            self._invalidate()
            return
        data = line.encode("utf-8", "surrogateescape")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            self._invalidate()
            return
        try:
            st = os.fstat(fd)
            # Not the file read to the end at sync: written by a process that did not hold the lock. Trust nothing.
            written = os.write(fd, data) if ((st.st_dev, st.st_ino), st.st_size) == (self._ident, self._offset) else -1
        except OSError:
            written = -1
        finally:
            os.close(fd)
        if written != len(data):
            self._invalidate()
            return
        self._offset += written
        self._lines += 1

    def _invalidate(self) -> None:
        """A change the journal could not record: remove it, so that every process scans at its next look."""
        self._stale = True
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _reset(self, ident: tuple[int, int]) -> None:
        self.files, self.used, self._shards = {}, 0, {}
        self._ident, self._head, self._offset, self._lines = ident, b"", 0, 0

    def _apply(self, data: bytes) -> bool:
        """Apply whole journal lines; False if one cannot be read (the journal is then rewritten by a scan)."""
        for raw in data.decode("utf-8", "surrogateescape").split("\n")[:-1]:  # only "\n" ends a line
            op, _, rest = raw.partition(" ")
            if op == "+":
                key, _, size = rest.rpartition(" ")
                if not key or not size.isdigit():
                    return False
                self._count(key, int(size))
            elif op == "-" and rest:
                self._count(rest, None)
            else:
                return False
            self._lines += 1
        return True


_LEDGERS: dict[str, Ledger] = {}


def ledger(cache_dir: str) -> Ledger:
    """This process's ledger of ``cache_dir`` (one per directory, shared by every cache over it)."""
    found = _LEDGERS.get(cache_dir)
    if found is None:
        found = _LEDGERS.setdefault(cache_dir, Ledger(cache_dir))
    return found
