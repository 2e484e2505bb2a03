"""Direct reads of a remote dataset (``ds[i]``, ``ds.get_batch`` outside a loader): which shards stay held.

A loader's downloader (chute/storage/node/fetcher.py) holds the shards its batches
read. A direct read has no downloader: it holds each shard it maps itself, and
keeps the last ``DIRECT_HOLDS`` held after the read so that neighbouring reads do
not download again. While one batch read is in progress (``reading()``), every
shard it maps stays held until it is done (one batch may span more shards than
are kept between reads, and releasing one to map the next would never end).
This is the ShardSource side of the reader's direct reads
(``chute.format.reader.ShardSource``); the reader only maps what it is given.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

#: Shards kept held between direct reads.
DIRECT_HOLDS = 2


class Holds(Protocol):
    """What direct reads need of a ShardCache (chute/storage/node/cache.py, which owns a DirectReads)."""

    manifest: Any
    limit: int | None

    def held(self, i: int) -> int: ...
    def acquire(self, i: int) -> str: ...
    def release(self, i: int) -> None: ...


class DirectReads:
    """The holds one ShardCache keeps for direct reads. Thread-safe."""

    def __init__(self, cache: Holds) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._recent: collections.deque[int] = collections.deque()  # kept after their read, oldest first
        self._local = threading.local()  # the batch read in progress in this thread: the shards it holds

    @contextlib.contextmanager
    def hold(self, i: int) -> Iterator[str]:
        """Shard ``i`` held while the caller maps it (its local path); then kept for a while if
        nobody else in this process holds it, else released (the other hold keeps it mapped)."""
        cache = self.cache
        reading = getattr(self._local, "reading", None)
        if not cache.held(i):  # make room among these holds first
            size = cache.manifest.shards[i].bytes
            while True:
                with self._lock:
                    kept = sum(cache.manifest.shards[j].bytes for j in self._recent)
                    full = len(self._recent) >= DIRECT_HOLDS or (cache.limit is not None and kept + size > cache.limit)
                    drop = next((j for j in self._recent if reading is None or j not in reading), None) if full else None
                    if drop is not None:
                        self._recent.remove(drop)
                if drop is None:
                    break
                cache.release(drop)
        if reading is not None:
            reading.add(i)
        path = cache.acquire(i)
        keep = cache.held(i) == 1
        try:
            yield path
        except BaseException:
            cache.release(i)
            raise
        if not keep:
            cache.release(i)
            return
        with self._lock:
            self._recent.append(i)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """One batch read: the shards it holds stay held until it ends; then back to the few kept."""
        self._local.reading = set()
        try:
            yield
        finally:
            self._local.reading = None
            while True:
                with self._lock:
                    drop = self._recent.popleft() if len(self._recent) > DIRECT_HOLDS else None
                if drop is None:
                    break
                self.cache.release(drop)

    def release_all(self) -> None:
        """Let go of every shard kept after direct reads (a loader's pass holds its own)."""
        with self._lock:
            recent, self._recent = list(self._recent), collections.deque()
        for i in recent:
            self.cache.release(i)


__all__ = ["DirectReads", "DIRECT_HOLDS"]
