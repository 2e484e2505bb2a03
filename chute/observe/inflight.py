"""Reads in flight: what each thread is reading right now, for the hang watchdog.

Storage code wraps every read that may block (a download, a byte range, a file
read on a network file system) in ``track(...)``; the watchdog calls
``snapshot()`` to name the file or URL, the byte range and how long it has been
waiting. Registering costs one dict insert and one delete under a lock.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Read:
    """One read in flight."""

    what: str  # "GET", "download", "read", ...
    target: str  # the URL or file path
    start: int | None  # first byte, if a range
    length: int | None  # bytes asked for, if known
    thread: str  # name of the thread doing it
    since: float  # time.monotonic() when it started

    def describe(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        where = self.target
        if self.start is not None:
            end = "" if self.length is None else str(self.start + self.length - 1)
            where += f" bytes={self.start}-{end}"
        elif self.length is not None:
            where += f" ({self.length} bytes)"
        return f"{self.what} {where}: {now - self.since:.1f} s in thread {self.thread!r}"


class Registry:
    """Thread-safe set of reads in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[int, Read] = {}
        self._ids = itertools.count()

    @contextmanager
    def track(self, what: str, target: str, start: int | None = None, length: int | None = None) -> Iterator[None]:
        key = next(self._ids)
        read = Read(what, str(target), start, length, threading.current_thread().name, time.monotonic())
        with self._lock:
            self._reads[key] = read
        try:
            yield
        finally:
            with self._lock:
                del self._reads[key]

    def snapshot(self) -> list[Read]:
        """The reads in flight now, oldest first."""
        with self._lock:
            reads = list(self._reads.values())
        return sorted(reads, key=lambda r: r.since)


#: The process-wide registry (one per process: worker processes have their own).
READS = Registry()
track = READS.track
snapshot = READS.snapshot
