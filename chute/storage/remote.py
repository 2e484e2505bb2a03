"""Remote datasets through fsspec: read the manifest, download shards, upload shards.

Every request may fail for a while and then work again (a timeout, a reset
connection, HTTP 5xx, throttling): those are retried with exponential backoff
and full jitter. Errors that will not go away by themselves (404, 403, a bad
URL) fail at once. After the retry budget a :class:`RemoteError` names the URL,
the status or exception and the attempts made.

A shard is downloaded into a file the caller names, in parallel byte ranges
when it is large, then checked against the manifest's checksum.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from chute.errors import RemoteError
from chute.observe import inflight

T = TypeVar("T")

#: Protocols fsspec serves from this machine's own file system.
LOCAL_PROTOCOLS = ("file", "local")

_BACKENDS = {"s3": "s3fs (pip install 'chute[s3]')", "s3a": "s3fs (pip install 'chute[s3]')",
             "gs": "gcsfs (pip install 'chute[gcs]')", "gcs": "gcsfs (pip install 'chute[gcs]')",
             "http": "aiohttp (pip install 'chute[http]')", "https": "aiohttp (pip install 'chute[http]')"}


class NotFound(RemoteError):
    """The object does not exist (HTTP 404, no such key)."""


class Cancelled(RemoteError):
    """A request was not made, or not retried, because its loader or dataset was closed."""


class ShortRead(OSError):
    """The server sent fewer bytes than asked for (a cut connection): worth retrying."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a request that failed transiently.

    ``attempts`` requests in all; before attempt ``k`` (from 1) a random wait in
    ``[0, min(cap, base * 2**k)]`` (full jitter: many clients retrying at once do
    not come back in lockstep). The defaults ride out about 20 s of outage.
    """

    attempts: int = 8
    base: float = 0.25
    cap: float = 8.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * (2**attempt)))


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, if any (aiohttp, botocore, requests-like)."""
    for attr in ("status", "status_code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError", "ServiceUnavailable"}


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` may succeed: network errors, timeouts, 5xx, 408 and 429."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # s3fs and fsspec wrap the original error
        seen.add(id(exc))
        if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        status = status_of(exc)
        if status is not None:
            return (status >= 500 and status not in (501, 505)) or status in (408, 429)
        code = getattr(exc, "response", None)
        if isinstance(code, dict) and code.get("Error", {}).get("Code") in _THROTTLE_CODES:
            return True
        if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError, EOFError, ShortRead)):
            return True
        name = type(exc).__name__
        if name.endswith(("ConnectionError", "Timeout", "TimeoutError", "Disconnected", "PayloadError",
                          "ServerDisconnectedError", "ConnectionClosedError", "IncompleteRead")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def describe(exc: BaseException) -> str:
    status = status_of(exc)
    text = f"{type(exc).__name__}: {exc}".strip()
    if len(text) > 300:
        text = text[:300] + "..."
    return f"HTTP {status} ({text})" if status is not None else text


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class Remote:
    """A dataset's location in remote storage: an fsspec file system and a base URL.

    Thread-safe; picklable (the file system is made again in the process that
    unpickles it). No request is made at construction.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None,
                 part_size: int = 16 << 20, parallel: int = 8) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.part_size = int(part_size)
        self.parallel = max(1, int(parallel))
        self._fs = None
        self._path = ""
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._stop = threading.Event()
        self._local = threading.local()  # .cancel: the event that stops this thread's requests (see cancelled_by)
        self._cancels: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        self.retries = 0  # transient failures retried, over this object's life

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options, "retry": self.retry,
                "part_size": self.part_size, "parallel": self.parallel}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else "file"

    @property
    def fs(self):
        """The fsspec file system (made on first use: importing a backend can be slow)."""
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs, self._path = self._make_fs()
        return self._fs

    def _make_fs(self):
        import fsspec.core

        options = dict(self.storage_options)
        if self.protocol in ("http", "https"):
            options.setdefault("client_kwargs", {})
            if "timeout" not in options["client_kwargs"]:
                import aiohttp

                # fsspec's default is no read timeout: a server that stops answering would hang a download
                options["client_kwargs"]["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
        try:
            fs, path = fsspec.core.url_to_fs(self.url, **options)
        except ImportError as exc:
            need = _BACKENDS.get(self.protocol, f"the fsspec backend for {self.protocol}://")
            raise RemoteError(f"cannot open {self.url}: it needs {need} ({exc})") from None
        except ValueError as exc:
            raise RemoteError(f"cannot open {self.url}: {exc}") from None
        return fs, path

    def path(self, name: str) -> str:
        """The backend path (what fsspec methods take) of ``name`` under the base URL."""
        _ = self.fs
        if self.protocol in ("http", "https"):
            return join(self.url, name)
        return join(self._path, name)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """Cut retry waits short (a download in progress still finishes its current request)."""
        with self._lock:
            self._stop.set()
            for event in list(self._cancels):
                event.set()

    @contextlib.contextmanager
    def cancelled_by(self, event: threading.Event | None) -> Iterator[None]:
        """Within this block, the calling thread's requests stop once ``event`` is set.

        A request not yet made raises :class:`Cancelled`, and so does a retry wait,
        at once. A loader's downloader runs its downloads in such a block, so that
        closing the loader (or an error) ends them within one request instead of
        after the whole retry budget, and no download thread outlives the loader.
        """
        if event is None:
            yield
            return
        with self._lock:
            self._cancels.add(event)
            if self._stop.is_set():
                event.set()
        previous = getattr(self._local, "cancel", None)
        self._local.cancel = event
        try:
            yield
        finally:
            self._local.cancel = previous

    def cancelled(self) -> bool:
        """Whether the calling thread's requests should stop (see :meth:`cancelled_by`, :meth:`close`)."""
        cancel = getattr(self._local, "cancel", None)
        return self._stop.is_set() or (cancel is not None and cancel.is_set())

    # ------------------------------------------------------------------ requests with retries

    def call(self, what: str, url: str, fn: Callable[[], T]) -> T:
        """``fn()`` with retries of transient failures; ``what`` and ``url`` name it in errors."""
        errors: list[str] = []
        stop = getattr(self._local, "cancel", None) or self._stop
        for attempt in range(1, self.retry.attempts + 1):
            if self.cancelled():
                raise Cancelled(f"{what} {url}: cancelled (the loader or dataset was closed)"
                                + (f" after {attempt - 1} attempt(s): {errors[-1]}" if errors else ""))
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    if isinstance(exc, FileNotFoundError):
                        raise NotFound(f"{what} {url}: not found (HTTP 404 / no such object). Check the URL and that the dataset was written completely") from None
                    raise RemoteError(f"{what} {url} failed: {describe(exc)}; not retried (the error will not go away by itself)") from exc
                errors.append(describe(exc))
                if attempt == self.retry.attempts:
                    break
                with self._lock:
                    self.retries += 1
                stop.wait(self.retry.delay(attempt, self._rng))  # cut short by close() or the thread's cancel event
        raise RemoteError(
            f"{what} {url} failed after {len(errors)} attempts; last error: {errors[-1]}"
            + (f"; earlier: {'; '.join(dict.fromkeys(errors[:-1]))}" if len(errors) > 1 else "")
            + ". Check that the server is reachable, or raise the retry budget"
        )

    def read(self, name: str) -> bytes:
        """The whole object ``name`` (the manifest), with retries."""
        path, url = self.path(name), join(self.url, name)

        def get() -> bytes:
            with inflight.track("GET", url):
                return self.fs.cat_file(path)

        return self.call("GET", url, get)

    def _range(self, path: str, url: str, start: int, length: int) -> bytes:
        def get() -> bytes:
            with inflight.track("GET", url, start, length):
                data = self.fs.cat_file(path, start=start, end=start + length)  # keywords: s3fs takes version_id second
            if len(data) != length:
                raise ShortRead(f"got {len(data)} of {length} bytes")
            return data

        return self.call("GET", url, get)

    def download(self, name: str, dest: str, size: int, pool: concurrent.futures.Executor | None = None) -> None:
        """Write object ``name`` (``size`` bytes) into the existing file ``dest``.

        Objects larger than ``part_size`` are fetched as parallel byte ranges on
        ``pool`` (each range retried on its own); smaller ones in one request.
        """
        path, url = self.path(name), join(self.url, name)
        cancel = getattr(self._local, "cancel", None)  # the byte ranges run on pool threads: pass it on
        fd = os.open(dest, os.O_WRONLY)
        try:
            parts = [(start, min(self.part_size, size - start)) for start in range(0, size, self.part_size)] or [(0, 0)]

            def fetch(part: tuple[int, int]) -> None:
                start, length = part
                with self.cancelled_by(cancel):
                    data = self._range(path, url, start, length) if len(parts) > 1 else self._whole(path, url, size)
                os.pwrite(fd, data, start)

            if len(parts) == 1 or pool is None:
                for part in parts:
                    fetch(part)
            else:
                for future in [pool.submit(fetch, part) for part in parts]:
                    future.result()
        finally:
            os.close(fd)

    def _whole(self, path: str, url: str, size: int) -> bytes:
        def get() -> bytes:
            with inflight.track("GET", url, None, size):
                data = self.fs.cat_file(path)
            if len(data) != size:
                raise ShortRead(f"got {len(data)} of {size} bytes")
            return data

        return self.call("GET", url, get)

    def download_stream(self, name: str, write: Callable[[bytes], None], restart: Callable[[], None]) -> None:
        """Stream object ``name`` to ``write`` in chunks (for decompression); on a transient
        failure ``restart()`` is called and the stream starts over."""
        path, url = self.path(name), join(self.url, name)

        def get() -> None:
            restart()
            with inflight.track("GET", url), self.fs.open(path, "rb", block_size=self.part_size) as f:
                while chunk := f.read(self.part_size):
                    write(chunk)

        self.call("GET", url, get)

    def upload(self, local: str, name: str) -> None:
        """Upload a local file as object ``name`` (with retries)."""
        path, url = self.path(name), join(self.url, name)

        def put() -> None:
            with inflight.track("PUT", url, None, os.path.getsize(local)):
                self.fs.put_file(local, path)

        self.call("PUT", url, put)

    def write_text(self, name: str, text: str) -> None:
        path, url = self.path(name), join(self.url, name)

        def put() -> None:
            with inflight.track("PUT", url):
                self.fs.pipe_file(path, text.encode("utf-8"))

        self.call("PUT", url, put)

    def exists(self, name: str) -> bool:
        path, url = self.path(name), join(self.url, name)
        return self.call("HEAD", url, lambda: self.fs.exists(path))

    def remove(self, name: str) -> None:
        path, url = self.path(name), join(self.url, name)
        try:
            self.call("DELETE", url, lambda: self.fs.rm_file(path))
        except RemoteError:
            pass  # leftovers of a replaced dataset are harmless; the manifest no longer lists them


def verify_file(path: str, checksum: str, url: str, expected_size: int) -> str | None:
    """What is wrong with a downloaded file, or None when it matches the manifest."""
    from chute.format.manifest import checksum_file

    size = os.path.getsize(path)
    if size != expected_size:
        return f"{url}: downloaded {size} bytes, the manifest says {expected_size}"
    digest = checksum_file(path, checksum.split(":", 1)[0])
    if digest != checksum:
        return f"{url}: checksum {digest} does not match the manifest's {checksum}"
    return None


def is_remote(url: str) -> bool:
    """Whether ``url`` names remote storage (anything but a local path or file://)."""
    return "://" in url and url.split("://", 1)[0] not in LOCAL_PROTOCOLS


__all__ = ["Remote", "RemoteError", "RetryPolicy", "is_remote", "is_transient", "verify_file"]
