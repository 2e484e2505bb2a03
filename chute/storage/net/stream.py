"""One GET streamed from fsspec's event loop into the calling thread, with a floor speed.

    fsspec's IO loop ──(batches of chunks, a queue)──► the calling thread: writes them, watches the rate

fsspec's ``cat_file`` gives nothing back until a request is complete, so a
server that sends one byte every few seconds holds it forever (no timeout
fires: data keeps arriving). Here the request runs as a coroutine on the file
system's own event loop and hands its body over in batches; the thread that
asked writes them where they go (a shard's ``.part`` file at its offset) and
counts the bytes. When fewer than ``rate * window`` bytes arrived in a window of
``window`` seconds (curl's ``--speed-limit``/``--speed-time``), or the caller is
cancelled, the coroutine is cancelled (which closes the connection) and the
thread raises. No thread other than the caller's and fsspec's loop takes part.

Streaming is done for the backends whose requests chute makes itself (HTTP
through aiohttp, S3 through s3fs/aiobotocore); :func:`streams` says whether a
file system is one of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

#: Bytes asked of the socket per read, and bytes (or chunks) handed to the calling thread at once.
READ_SIZE = 1 << 20
BATCH_BYTES = 4 << 20
BATCH_CHUNKS = 256  # under IOV_MAX (1024) for os.pwritev

_DONE = object()
_WAKE = object()


class SlowTransfer(OSError):
    """A request moved less than the floor speed over the floor's window: worth retrying."""


class TooLong(OSError):
    """The server sent more than the bytes asked for (the manifest's size of an object, or a range's
    length): the transfer is cut at the first byte too many, nothing past the limit is written, and it
    is retried like a cut one."""

    def __init__(self, limit: int, message: str = "") -> None:
        super().__init__(message or f"the server sent more than the {limit:,} bytes asked for")
        self.limit = limit


class BadRange(OSError):
    """A 206 answer whose ``Content-Range`` is not the range asked for: retried like a damaged transfer."""


class RangeIgnored(Exception):
    """The server answered a byte-range request with the whole object (HTTP 200, not 206)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url}: the server ignored a Range request and answered with the whole object")


class Interrupted(Exception):
    """The caller's cancel event fired while the request ran (see :func:`get`)."""


@dataclasses.dataclass(frozen=True)
class Floor:
    """A request must move at least ``rate`` bytes/s on average over every ``window`` seconds (0: no floor)."""

    rate: int = 64 << 10
    window: float = 30.0

    @property
    def active(self) -> bool:
        return self.rate > 0 and self.window > 0


class Receiver:
    """One response's bytes on their way to ``sink(offset, chunks)``: handed over in batches (``BATCH_BYTES``
    or ``BATCH_CHUNKS`` at a time), never more than ``limit`` of them, and timed against the floor speed as
    they come. For the clients that read in the downloading thread (chute/storage/net/http.py,
    chute/storage/net/s3.py)."""

    def __init__(self, sink: Callable[[int, list[bytes]], None], offset: int, floor: Floor, limit: int) -> None:
        self.sink, self.offset, self.floor, self.limit = sink, offset, floor, limit
        self.received = 0  # bytes handed to the sink
        self._pending: list[bytes] = []
        self._size = 0
        self._mark, self._mark_bytes = time.monotonic(), 0

    def add(self, chunk: bytes) -> None:
        """Take ``chunk``; an empty one is the end: what is pending goes to the sink. Raises
        :class:`TooLong` at the first byte past ``limit`` (before the sink sees any of ``chunk``), and
        :class:`SlowTransfer` when less than the floor's rate arrived over its last window."""
        if chunk:
            if self.received + self._size + len(chunk) > self.limit:
                raise TooLong(self.limit)
            self._pending.append(chunk)
            self._size += len(chunk)
        if self._pending and (not chunk or self._size >= BATCH_BYTES or len(self._pending) >= BATCH_CHUNKS):
            self.sink(self.offset, self._pending)
            self.offset += self._size
            self.received += self._size
            self._pending, self._size = [], 0
        floor = self.floor
        if chunk and floor.active and (now := time.monotonic()) - self._mark >= floor.window:
            progressed = self.received + self._size - self._mark_bytes
            if progressed < floor.rate * floor.window:
                raise SlowTransfer(
                    f"moved {progressed:,} bytes in {now - self._mark:.3g} s, below the floor speed of "
                    f"{floor.rate:,} bytes/s over {floor.window:g} s"
                )
            self._mark, self._mark_bytes = now, self.received + self._size


_CONTENT_RANGE = re.compile(r"\s*bytes\s+(\d+)\s*-\s*(\d+)\s*/\s*(\d+|\*)\s*", re.IGNORECASE)


def check_range(header: str | None, start: int, length: int, url: str) -> None:
    """Raise :class:`BadRange` unless a 206's ``Content-Range`` header is exactly bytes ``start`` to
    ``start + length - 1`` (the range asked for)."""
    match = _CONTENT_RANGE.fullmatch(header or "")
    if match is None or (int(match[1]), int(match[2])) != (start, start + length - 1):
        raise BadRange(f"{url}: asked for bytes {start}-{start + length - 1}, the server answered 206 with "
                       f"Content-Range {header!r}")


def check_length(header: str | None, limit: int) -> None:
    """Raise :class:`TooLong` before any byte is read when ``Content-Length`` announces more than ``limit``."""
    if header is not None and header.strip().isdigit() and int(header) > limit:
        raise TooLong(limit)


def streams(fs: Any) -> bool:
    """Whether requests to ``fs`` can be streamed here (HTTP via fsspec, S3 via s3fs)."""
    return _chunks_of(fs) is not None


def _chunks_of(fs: Any) -> Callable[..., AsyncIterator[bytes]] | None:
    http = sys.modules.get("fsspec.implementations.http")
    if http is not None and isinstance(fs, http.HTTPFileSystem):
        return _http_chunks
    s3 = sys.modules.get("s3fs.core")
    if s3 is not None and isinstance(fs, s3.S3FileSystem):
        return _s3_chunks
    return None


def _range_header(start: int | None, length: int | None) -> dict[str, str]:
    return {} if start is None else {"Range": f"bytes={start}-{start + max(length or 0, 1) - 1}"}


async def _http_chunks(fs: Any, path: str, start: int | None, length: int | None) -> AsyncIterator[bytes]:
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    headers = dict(kw.pop("headers", None) or {})
    headers.update(_range_header(start, length))
    async with session.get(fs.encode_url(path), headers=headers, **kw) as response:
        if response.status == 404:
            raise FileNotFoundError(path)
        response.raise_for_status()  # aiohttp's ClientResponseError carries the status (is it retried: remote.py)
        if start is not None and response.status != 206:
            raise RangeIgnored(path)
        if start is not None:
            check_range(response.headers.get("Content-Range"), start, max(length or 0, 1), path)
        while chunk := await response.content.read(READ_SIZE):
            yield chunk


async def _s3_chunks(fs: Any, path: str, start: int | None, length: int | None) -> AsyncIterator[bytes]:
    # s3fs's _call_s3 is not part of fsspec's async API, but it is the one call that applies the file system's
    # own settings to a GET (the bucket's region, s3_additional_kwargs filtered to GetObject's, requester pays)
    # and turns botocore's errors into FileNotFoundError/PermissionError; its public open_async() takes no
    # byte range, version or request arguments.
    bucket, key, version = fs.split_path(path)
    kw = dict(fs.req_kw)
    kw.update(_range_header(start, length))
    if version:
        kw["VersionId"] = version
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    body = response["Body"]
    try:
        while chunk := await body.read(READ_SIZE):
            yield chunk
    finally:
        body.close()


def get(fs: Any, path: str, start: int | None, length: int | None, sink: Callable[[int, list[bytes]], None], *,
        floor: Floor, url: str, cancelled: Callable[[], bool],
        on_cancel: Callable[[Callable[[], None]], Callable[[], None]], limit: int) -> int:
    """GET ``length`` bytes of ``path`` from ``start`` (``start=None``: the whole object) into
    ``sink(offset, chunks)``, called in this thread; the bytes it received (at most ``limit``).

    Raises :class:`SlowTransfer` when the floor is not met, :class:`TooLong` at
    the first byte past ``limit``, :class:`Interrupted` when ``cancelled()`` turns
    true (``on_cancel(wake)`` registers a wake-up for that moment and returns its
    removal), or the request's own error.
    """
    chunks = _chunks_of(fs)
    assert chunks is not None, "get() needs a streaming file system (see streams())"
    handoff: queue.SimpleQueue = queue.SimpleQueue()
    moved = [0]  # bytes off the socket, counted on the loop (read here without a lock: one int)

    async def produce() -> None:
        try:
            pending: list[bytes] = []
            size = 0
            offset = start or 0
            async for chunk in chunks(fs, path, start, length):
                if moved[0] + len(chunk) > limit:
                    raise TooLong(limit)
                moved[0] += len(chunk)
                pending.append(chunk)
                size += len(chunk)
                if size >= BATCH_BYTES or len(pending) >= BATCH_CHUNKS:
                    handoff.put((offset, pending))
                    offset += size
                    pending, size = [], 0
            if pending:
                handoff.put((offset, pending))
            handoff.put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller (CancelledError: nobody listens)
            handoff.put(exc)

    future = asyncio.run_coroutine_threadsafe(produce(), fs.loop)
    remove = on_cancel(lambda: handoff.put(_WAKE))
    received = 0
    try:
        mark, mark_bytes = time.monotonic(), 0
        while True:
            if cancelled():
                raise Interrupted(url)
            timeout = max(0.0, mark + floor.window - time.monotonic()) if floor.active else None
            try:
                item = handoff.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _DONE:
                return received
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, tuple):
                offset, pending = item
                sink(offset, pending)
                received += sum(len(c) for c in pending)
            now = time.monotonic()
            if floor.active and now - mark >= floor.window:
                progressed = moved[0] - mark_bytes
                if progressed < floor.rate * floor.window:
                    raise SlowTransfer(
                        f"moved {progressed:,} bytes in {now - mark:.3g} s, below the floor speed of "
                        f"{floor.rate:,} bytes/s over {floor.window:g} s"
                    )
                mark, mark_bytes = now, moved[0]
    finally:
        remove()
        if not future.done():
            future.cancel()  # closes the response; its connection is not reused


__all__ = ["BadRange", "check_length", "check_range", "Floor", "SlowTransfer", "RangeIgnored", "Interrupted", "Receiver", "TooLong", "get", "streams"]
