"""Remote datasets through fsspec: read the manifest, download shards, upload shards.

Every request may fail for a while and then work again (a timeout, a reset
connection, HTTP 5xx, throttling): those are retried with exponential backoff
and full jitter. Errors that will not go away by themselves (404, 403, a bad
URL) fail at once. After the retry budget a :class:`RemoteError` names the URL,
the status or exception and the attempts made.

A shard is downloaded into a file the caller names: in one GET, or in parallel
byte ranges when it is larger than ``whole_max``, then checked against the
manifest's checksum. Over HTTP and S3 every request is streamed
(chute/storage/net/stream.py): it must move at least ``RetryPolicy.min_speed``
bytes/s over every ``min_speed_window`` seconds, or it is cancelled and retried.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import http.client
import logging
import os
import random
import socket
import ssl
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from chute._bounded import read_within
from chute.errors import ChuteError, RemoteError
from chute.observe import inflight
from chute.storage.net import http as http_get, s3, stream
from chute.storage.net.pools import pools
from chute.storage.net.stream import BadRange, Floor, RangeIgnored, SlowTransfer, TooLong

log = logging.getLogger("chute")

T = TypeVar("T")

#: The size of a byte range, and the largest object fetched in one GET (larger ones: parallel ranges).
#: Measured with benchmarks/remote.py (docs/remote.md, "Performance").
PART_SIZE = 16 << 20
WHOLE_MAX = 128 << 20

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


class TooLarge(RemoteError):
    """An object read whole (:meth:`Remote.read`) is larger than the bytes allowed for it."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a request that failed transiently.

    ``attempts`` requests in all; before attempt ``k`` (from 1) a random wait in
    ``[0, min(cap, base * 2**k)]`` (full jitter: many clients retrying at once do
    not come back in lockstep). The defaults ride out about 20 s of outage.

    ``min_speed`` and ``min_speed_window`` are the floor speed of every request
    (streamed ones: HTTP and S3): less than ``min_speed`` bytes/s on average
    over ``min_speed_window`` seconds cancels the request, and it is retried
    (curl's ``--speed-limit``/``--speed-time``). ``min_speed=0`` turns it off.
    """

    attempts: int = 8
    base: float = 0.25
    cap: float = 8.0
    min_speed: int = 64 << 10
    min_speed_window: float = 30.0

    @property
    def floor(self) -> Floor:
        return Floor(int(self.min_speed), float(self.min_speed_window))

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap, self.base * (2**attempt)))

    def budget_s(self) -> float:
        """The longest the waits between attempts can add up to."""
        return sum(min(self.cap, self.base * (2**k)) for k in range(1, self.attempts))


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

#: errno values of "nobody listens there" and "no route to it": a retry cannot help a URL
#: that never worked (a wrong host or port); after a success they mean an outage.
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH}


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it wraps (s3fs and fsspec wrap the backend's error)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _loaded(module: str) -> Any:
    """A backend module if something imported it already (an error cannot come from one that is not)."""
    return sys.modules.get(module)


def _permanent_types() -> tuple[type[BaseException], ...]:
    """Errors no retry cures: missing or forbidden objects, bad certificates or credentials."""
    types: list[type[BaseException]] = [FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                                        ssl.SSLCertVerificationError]
    if (aiohttp := _loaded("aiohttp")) is not None:
        types += [aiohttp.ClientConnectorCertificateError, aiohttp.InvalidURL]
    if (botocore := _loaded("botocore.exceptions")) is not None:
        types += [botocore.NoCredentialsError, botocore.PartialCredentialsError, botocore.ParamValidationError,
                  botocore.SSLError]
    return tuple(types)


def _transient_types() -> tuple[type[BaseException], ...]:
    """Errors of the network, and of the backends' own integrity checks, that a retry may cure."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, asyncio.TimeoutError, EOFError, ShortRead, SlowTransfer,
                                        TooLong, BadRange, http.client.IncompleteRead]
    if (aiohttp := _loaded("aiohttp")) is not None:
        # ClientConnectionError: refused, reset and dropped connections, timeouts; ClientPayloadError: a cut body
        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
    if (botocore := _loaded("botocore.exceptions")) is not None:
        # a damaged body fails botocore's checksum: downloading it again is the cure
        types += [botocore.ConnectionError, botocore.HTTPClientError, botocore.IncompleteReadError,
                  botocore.FlexibleChecksumError, botocore.ChecksumError]
    if (urllib3 := _loaded("urllib3.exceptions")) is not None:
        types += [urllib3.ProtocolError, urllib3.TimeoutError]
    if (google := _loaded("google.auth.exceptions")) is not None:
        types += [google.TransportError]
    return tuple(types)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` may succeed: network errors, timeouts, a damaged body, 5xx, 408 and 429.

    Decided from the exception types of Python and of the storage backends
    (aiohttp, botocore, urllib3, google-auth), looking through the errors s3fs
    and fsspec wrap them in; an HTTP status, where one is carried, decides first.
    """
    permanent, transient = _permanent_types(), _transient_types()
    for error in _chain(exc):
        if isinstance(error, permanent):
            return False
        status = status_of(error)
        if status is not None:
            return (status >= 500 and status not in (501, 505)) or status in (408, 429)
        response = getattr(error, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in _THROTTLE_CODES:
            return True
        if isinstance(error, transient):
            return True
    return False


def unreachable(exc: BaseException) -> str | None:
    """Why the host of ``exc`` cannot be reached at all (connection refused, no route, unknown
    name), or None if the error is of another kind."""
    for error in _chain(exc):
        if isinstance(error, socket.gaierror):
            return "unknown host name"
        os_error = getattr(error, "os_error", None)  # aiohttp.ClientConnectorError keeps the OSError
        for candidate in (error, os_error):
            if isinstance(candidate, OSError) and candidate.errno in _UNREACHABLE_ERRNOS:
                return {errno.ECONNREFUSED: "connection refused"}.get(candidate.errno, "no route to host")
    return None


def _through_proxy(exc: BaseException) -> bool:
    """Whether ``exc`` is urllib3's failure to reach a proxy (not the server behind it)."""
    urllib3 = _loaded("urllib3.exceptions")
    return urllib3 is not None and any(isinstance(error, urllib3.ProxyError) for error in _chain(exc))


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
                 part_size: int = PART_SIZE, parallel: int = 8, whole_max: int = WHOLE_MAX) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.part_size = int(part_size)  # the size of a byte range, for objects fetched in ranges
        self.whole_max = int(whole_max)  # objects up to this size are fetched in one GET
        self.parallel = max(1, int(parallel))  # concurrent downloads (and ranges of one download)
        self._fs = None
        self._fs_pid = 0
        # made once per process, on first use (chute/storage/net/s3.py, chute/storage/net/http.py); False: does not apply
        self._made: dict[str, tuple[int, Any]] = {}
        self._leave: Callable[[], Any] | None = None  # leaves the process's pools (see _client)
        self._path = ""
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._stop = threading.Event()
        self._local = threading.local()  # .cancel: the event that stops this thread's requests (see cancelled_by)
        self._cancels: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        self._wakers: list[tuple[threading.Event | None, Callable[[], None]]] = []  # streams to wake on a cancel
        self.retries = 0  # transient failures retried, over this object's life
        self.reached = False  # a request has succeeded: an unreachable host is an outage, not a wrong URL
        self.ranges = True  # False once the server was seen to ignore Range requests: whole-object GETs
        self.requests = 0  # GET requests made (attempts included), over this object's life

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options, "retry": self.retry,
                "part_size": self.part_size, "parallel": self.parallel, "whole_max": self.whole_max,
                "reached": self.reached, "ranges": self.ranges}

    def __setstate__(self, state: dict) -> None:
        reached, ranges = state.pop("reached", False), state.pop("ranges", True)
        Remote.__init__(self, **state)
        self.reached, self.ranges = reached, ranges

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else "file"

    @property
    def fs(self):
        """The fsspec file system (made on first use: importing a backend can be slow; made again
        in a forked child, as fsspec's async clients are not fork-safe)."""
        if self._fs is None or self._fs_pid != os.getpid():
            with self._lock:
                if self._fs is None or self._fs_pid != os.getpid():
                    self._fs, self._path = self._make_fs()
                    self._fs_pid = os.getpid()
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
        """Cut retry waits short and end streamed requests in progress (others finish their current request)."""
        with self._lock:
            self._stop.set()
            for event in list(self._cancels):
                event.set()
            wakers = [wake for _, wake in self._wakers]
        for wake in wakers:
            wake()
        leave = self._leave
        if leave is not None:
            leave()  # (once: a finalizer) this Remote no longer uses the process's connections

    def cancel(self, event: threading.Event) -> None:
        """Set ``event`` (see :meth:`cancelled_by`) and wake the streamed requests it stops, at once."""
        event.set()
        with self._lock:
            wakers = [wake for owner, wake in self._wakers if owner is event]
        for wake in wakers:
            wake()

    def _on_cancel(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when the calling thread's requests are cancelled; returns its removal."""
        entry = (getattr(self._local, "cancel", None), wake)
        with self._lock:
            self._wakers.append(entry)
            stopped = self._stop.is_set()

        def remove() -> None:
            with self._lock:
                with contextlib.suppress(ValueError):
                    self._wakers.remove(entry)

        if stopped:
            wake()
        return remove

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
        """``fn()`` with retries of transient failures; ``what`` and ``url`` name it in errors.

        A host that cannot be reached (connection refused, no route, unknown
        name) fails at once while nothing has ever succeeded here (a wrong URL or
        port), and is retried after that (an outage, a restart).
        """
        errors: list[str] = []
        stop = getattr(self._local, "cancel", None) or self._stop
        for attempt in range(1, self.retry.attempts + 1):
            if self.cancelled():
                raise Cancelled(f"{what} {url}: cancelled (the loader or dataset was closed)"
                                + (f" after {attempt - 1} attempt(s): {errors[-1]}" if errors else ""))
            try:
                result = fn()
            except RangeIgnored:
                self.reached = True
                raise  # an answer, not a failure: download() uses it
            except stream.Interrupted:
                raise Cancelled(f"{what} {url}: cancelled (the loader or dataset was closed)") from None
            except ChuteError:
                raise  # already says what happened and what to do (an object over its size limit)
            except Exception as exc:
                reason = None if self.reached else unreachable(exc)
                if reason is not None:
                    check = ("check the proxy the environment names (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY; NO_PROXY "
                             "lists the hosts reached without it)" if _through_proxy(exc)
                             else "check the host, the port and that the server is running")
                    raise RemoteError(
                        f"{what} {url}: cannot connect, {reason} ({describe(exc)}); not retried, as nothing "
                        f"was ever reached there: {check}"
                    ) from exc
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
            else:
                self.reached = True
                return result
        raise RemoteError(
            f"{what} {url} failed after {len(errors)} attempts; last error: {errors[-1]}"
            + (f"; earlier: {'; '.join(dict.fromkeys(errors[:-1]))}" if len(errors) > 1 else "")
            + ". " + self._advice(errors)
        )

    def _advice(self, errors: list[str]) -> str:
        """What to change when the retries ran out: the settings, named as chute.open takes them."""
        advice = (f"Check that the server is reachable, or raise the retry budget: chute.open(..., retries=N) "
                  f"(now {self.retry.attempts} attempts, about {self.retry.budget_s():.0f} s of backoff)")
        if any(e.startswith("SlowTransfer") for e in errors):
            floor = self.retry.floor
            advice += (f"; requests slower than the floor speed are cut: lower it or lengthen its window with "
                       f"chute.open(..., min_speed=BYTES_PER_S, min_speed_window=SECONDS) (now {floor.rate:,} "
                       f"bytes/s over {floor.window:g} s; min_speed=0 turns it off)")
        if any("Timeout" in e or "timed out" in e for e in errors) and self.protocol in ("http", "https"):
            advice += ("; HTTP reads time out after 60 s without data: raise it with storage_options="
                       "{'client_kwargs': {'timeout': aiohttp.ClientTimeout(sock_read=SECONDS)}} (requests then go "
                       "through fsspec's aiohttp client)")
        return advice

    def _once(self, what: str, make: Callable[[], Any]) -> Any:
        """``make()``'s result, made once per process (clients and their connections are not fork-safe)."""
        made = self._made.get(what)
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._made.get(what)
                if made is None or made[0] != os.getpid():
                    made = self._made[what] = (os.getpid(), make())
        return made[1]

    def _client(self, client: http_get.Client) -> http_get.Client:
        """``client``, of chute's connection layer: the process's pools count this Remote among their users
        until it is closed or collected (then, if it was the last, their kept connections are closed)."""
        self._leave = pools().join(self)
        return client

    @property
    def s3_client(self) -> Any:
        """botocore's S3 client for this dataset's GETs (chute/storage/net/s3.py), or None: the fsspec path."""
        if self.protocol not in ("s3", "s3a"):
            return None
        return self._once("s3", lambda: s3.client_for(self.storage_options, self.parallel, self.retry.floor) or False) or None

    @property
    def s3_mode(self) -> str | None:
        """How S3 GETs are made (:func:`chute.storage.net.s3.mode`), or None: the fsspec path."""
        if self.s3_client is None:
            return None
        return self._once("s3-mode", lambda: s3.mode(self.storage_options))

    @property
    def http_client(self) -> http_get.Client | None:
        """The client of this dataset's GETs through chute's connection layer (chute/storage/net/http.py:
        HTTP datasets, and S3 GETs that are presigned or signed by botocore), or None: the fsspec path
        (HTTP storage options only aiohttp takes) or botocore's own GETs."""
        if self.protocol in ("http", "https"):
            return self._once("http", lambda: self._client(http_get.Client(dict(self.storage_options.get("headers") or {})))
                              if http_get.applies(self.storage_options) else False) or None
        if self.s3_mode in ("presigned", "signed"):
            options = self.storage_options
            return self._once("s3-http", lambda: self._client(http_get.Client(verify=s3.verify_of(options), proxies=s3.proxies_of(options))))
        return None

    def _get(self, path: str, url: str, start: int | None, length: int | None,
             sink: Callable[[int, list[bytes]], None], limit: int) -> int:
        """One streamed GET of at most ``limit`` bytes (chute/storage/net/http.py for HTTP and S3, botocore's
        for ``CHUTE_S3_CLIENT=botocore``, else chute/storage/net/stream.py) into ``sink``; the bytes received."""
        with self._lock:
            self.requests += 1
        floor = self.retry.floor
        client = self.http_client
        if client is not None and self.protocol in ("http", "https"):
            return client.get(path, start, length, sink, limit=limit, floor=floor, cancelled=self.cancelled,
                              on_cancel=self._on_cancel)
        mode = self.s3_mode
        if mode is not None:
            bucket, key, version = self.fs.split_path(path)
            kw = s3.params(bucket, key, version, s3.get_kwargs(self.storage_options))
            if mode == "presigned":
                target = s3.presigned_url(self.s3_client, bucket, key, version)
                return client.get(target, start, length, sink, limit=limit, floor=floor,  # type: ignore[union-attr]
                                  cancelled=self.cancelled, on_cancel=self._on_cancel, label=url)
            if mode == "signed":
                if start is not None:  # signed with the request: the same header the client sends
                    kw["Range"] = f"bytes={start}-{start + max(length or 0, 1) - 1}"
                signer = self._once("s3-signer", lambda: s3.signer_for(self.storage_options, self.parallel, floor))
                target, headers = s3.signed_request(signer, kw)
                return client.get(target, start, length, sink, limit=limit, floor=floor,  # type: ignore[union-attr]
                                  cancelled=self.cancelled, on_cancel=self._on_cancel, label=url, headers=headers)
            return s3.get(self.s3_client, kw, start, length, sink, limit=limit, floor=floor, url=url,
                          cancelled=self.cancelled, on_cancel=self._on_cancel)
        return stream.get(self.fs, path, start, length, sink, floor=floor, url=url,
                          cancelled=self.cancelled, on_cancel=self._on_cancel, limit=limit)

    def read(self, name: str, limit: int | None = None) -> bytes:
        """The whole object ``name`` (the manifest), with retries; one GET (no HEAD first). With
        ``limit``, an object larger than ``limit`` bytes is :class:`TooLarge` once ``limit + 1`` bytes have
        arrived (nothing more is read or kept), and not retried."""
        path, url = self.path(name), join(self.url, name)
        bound = (1 << 62) if limit is None else int(limit)

        def get() -> bytes:
            parts: list[bytes] = []
            with inflight.track("GET", url):
                try:
                    if not stream.streams(self.fs):
                        with self.fs.open(path, "rb") as f:  # read in blocks: never more than the limit in memory
                            if read_within(f.read, bound, parts.append, self.part_size) > bound:
                                raise TooLong(bound)
                    else:
                        self._get(path, url, None, None, lambda _, chunks: parts.extend(chunks), bound)
                except TooLong:
                    raise TooLarge(f"GET {url}: the object is larger than {bound:,} bytes; not read further") from None
            return b"".join(parts)

        return self.call("GET", url, get)

    def plan(self, size: int) -> list[tuple[int, int]]:
        """The byte ranges ``(start, length)`` an object of ``size`` bytes is fetched in: one (a
        whole-object GET) up to ``whole_max`` or when the server ignores ranges, else ``part_size`` each."""
        if size <= self.whole_max or not self.ranges or self.part_size <= 0:
            return [(0, size)]
        return [(start, min(self.part_size, size - start)) for start in range(0, size, self.part_size)]

    def download(self, name: str, dest: str, size: int, algorithm: str | None = None) -> str | None:
        """Write object ``name`` (``size`` bytes) into the existing file ``dest``; with ``algorithm``, the
        ``"<algorithm>:<hex>"`` checksum of the bytes written, hashed as they arrived, when they came in
        order in one GET (else None: the caller hashes the file).

        In one GET, or as byte ranges (see :meth:`plan`) fetched ``parallel`` at
        a time by threads that end with the download (no pool is kept: it would
        outlive the loader), each range retried on its
        own. A server that answers a range with the whole object (no Range
        support, such as ``python -m http.server``) gets whole-object requests
        from then on.
        """
        path, url = self.path(name), join(self.url, name)
        cancel = getattr(self._local, "cancel", None)  # the byte ranges run on their own threads: pass it on
        fd = os.open(dest, os.O_WRONLY)
        try:
            parts = self.plan(size)
            if len(parts) > 1:
                try:
                    self._ranges(fd, path, url, parts, cancel)
                    return None
                except RangeIgnored as exc:
                    if self.ranges:
                        log.info("chute: %s; downloading whole objects from %s from now on", exc, self.url)
                    self.ranges = False
            digest = None if algorithm is None else StreamHash(algorithm)
            self._whole(fd, path, url, size, digest)
            return None if digest is None else digest.result(size)
        finally:
            os.close(fd)

    def _ranges(self, fd: int, path: str, url: str, parts: list[tuple[int, int]], cancel: threading.Event | None) -> None:
        def fetch(part: tuple[int, int]) -> None:
            with self.cancelled_by(cancel):
                self._part(fd, path, url, *part)

        with concurrent.futures.ThreadPoolExecutor(min(self.parallel, len(parts)), thread_name_prefix="chute-range") as pool:
            futures = [pool.submit(fetch, part) for part in parts]
            errors = [f.exception() for f in futures]
        ignored = next((e for e in errors if isinstance(e, RangeIgnored)), None)
        if ignored is not None:
            raise ignored
        for error in errors:
            if error is not None:
                raise error

    def _part(self, fd: int, path: str, url: str, start: int, length: int) -> None:
        def get() -> None:
            with inflight.track("GET", url, start, length):
                if stream.streams(self.fs):
                    got = self._get(path, url, start, length, lambda offset, chunks: _pwritev(fd, chunks, offset), length)
                else:
                    data = self.fs.cat_file(path, start=start, end=start + length)  # keywords: s3fs takes version_id second
                    if len(data) > length:
                        raise RangeIgnored(url)  # fsspec does not check for 206: a 200 sends everything
                    os.pwrite(fd, data, start)
                    got = len(data)
            if got != length:
                raise ShortRead(f"got {got} of {length} bytes")

        self.call("GET", url, get)

    def _whole(self, fd: int, path: str, url: str, size: int, digest: StreamHash | None = None) -> None:
        def write(offset: int, chunks: list[bytes]) -> None:
            _pwritev(fd, chunks, offset)
            if digest is not None:
                digest.feed(offset, chunks)

        def get() -> None:
            with inflight.track("GET", url, None, size):
                if stream.streams(self.fs):
                    got = self._get(path, url, None, None, write, size)
                else:
                    data = self.fs.cat_file(path)
                    if len(data) > size:
                        raise TooLong(size)
                    write(0, [data])
                    got = len(data)
            if got != size:
                raise ShortRead(f"got {got} of {size} bytes")

        self.call("GET", url, get)

    def download_stream(self, name: str, write: Callable[[bytes], None], restart: Callable[[], None],
                        size: int | None = None) -> None:
        """Stream object ``name`` to ``write`` in chunks (for decompression); on a transient failure
        ``restart()`` is called and the stream starts over. With ``size`` (the manifest's), no more than
        ``size`` bytes are read and fewer are a transfer error (retried)."""
        path, url = self.path(name), join(self.url, name)
        bound = (1 << 62) if size is None else size

        def write_all(_: int, chunks: list[bytes]) -> None:
            for chunk in chunks:
                write(chunk)

        def get() -> None:
            restart()
            with inflight.track("GET", url, None, size):
                if stream.streams(self.fs):
                    got = self._get(path, url, None, None, write_all, bound)
                else:
                    with self.fs.open(path, "rb", block_size=self.part_size) as f:
                        got = read_within(f.read, bound, write, self.part_size)
                    if got > bound:
                        raise TooLong(bound)
            if size is not None and got != size:
                raise ShortRead(f"got {got} of {size} bytes")

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

    def size(self, name: str) -> int | None:
        """The size object ``name`` says it has (a HEAD; None where the server does not say)."""
        path, url = self.path(name), join(self.url, name)
        size = self.call("HEAD", url, lambda: self.fs.size(path))
        return None if size is None else int(size)

    def remove(self, name: str) -> None:
        path, url = self.path(name), join(self.url, name)
        try:
            self.call("DELETE", url, lambda: self.fs.rm_file(path))
        except RemoteError:
            pass  # leftovers of a replaced dataset are harmless; the manifest no longer lists them


class StreamHash:
    """The checksum of a download's bytes, fed as they are written (no second read of the file).

    Valid only for bytes fed in order from offset 0: a retry that starts the object
    again (offset 0) starts the hash again; bytes fed anywhere else make it unusable
    (``result`` is None and the caller hashes the file instead)."""

    def __init__(self, algorithm: str) -> None:
        from chute.format.manifest import new_hasher

        self.algorithm = algorithm
        self._new = new_hasher
        self._hasher = new_hasher(algorithm)
        self.position = 0
        self.broken = False

    def feed(self, offset: int, chunks: list[bytes]) -> None:
        if offset == 0 and self.position:  # a retry from the start
            self._hasher, self.position, self.broken = self._new(self.algorithm), 0, False
        if self.broken or offset != self.position:
            self.broken = True
            return
        update = self._hasher.update
        for chunk in chunks:
            update(chunk)
            self.position += len(chunk)

    def result(self, size: int) -> str | None:
        """The checksum, if every byte of the ``size``-byte object was fed in order."""
        if self.broken or self.position != size:
            return None
        return f"{self.algorithm}:{self._hasher.hexdigest()}"


#: Most bytes one write system call puts into a shard file, each call ending at a multiple of it. The page
#: cache gives a write a folio (a block of pages) as large as the write and its alignment allow; folios of
#: up to this size are taken from the small free blocks the kernel keeps, where multi-megabyte ones take
#: whole free blocks, which a VM's host may have reclaimed and faults back in page by page
#: (docs/remote.md, "Performance").
WRITE_MAX = 256 << 10


def _pwritev(fd: int, chunks: list[bytes], offset: int) -> None:
    """Write ``chunks`` one after another at ``offset`` of ``fd``, no joined copy: one system call per
    :data:`WRITE_MAX`-aligned stretch of the file."""
    pending: list[memoryview] = []
    start = offset
    end = (offset // WRITE_MAX + 1) * WRITE_MAX  # where the stretch being gathered ends
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            piece, view = view[:end - offset], view[end - offset:]
            pending.append(piece)
            offset += len(piece)
            if offset == end:
                _write_all(fd, pending, start)
                pending, start, end = [], offset, end + WRITE_MAX
    if pending:
        _write_all(fd, pending, start)


def _write_all(fd: int, pieces: list[memoryview], offset: int) -> None:
    """``os.pwritev`` of ``pieces`` at ``offset``, finished with plain writes if it falls short (a full disk)."""
    total = sum(len(p) for p in pieces)
    written = os.pwritev(fd, pieces, offset)
    if written != total:  # a regular file takes it all unless the disk is full
        data = memoryview(b"".join(pieces))
        while written < total:
            written += os.pwrite(fd, data[written:], offset + written)


def verify_fd(fd: int, checksum: str, url: str, expected_size: int, digest: str | None = None) -> str | None:
    """What is wrong with the downloaded file open at ``fd``, or None when it matches the manifest.
    ``digest``: the checksum of its bytes taken as they were written (see :class:`StreamHash`); None: hash the file."""
    from chute.format.manifest import checksum_fd

    size = os.fstat(fd).st_size
    if size != expected_size:
        return f"{url}: downloaded {size} bytes, the manifest says {expected_size}"
    if digest is None:
        digest = checksum_fd(fd, checksum.split(":", 1)[0])
    if digest != checksum:
        return f"{url}: checksum {digest} does not match the manifest's {checksum}"
    return None


def is_remote(url: str) -> bool:
    """Whether ``url`` names remote storage (anything but a local path or file://)."""
    return "://" in url and url.split("://", 1)[0] not in LOCAL_PROTOCOLS


__all__ = ["Remote", "RemoteError", "RetryPolicy", "is_remote", "is_transient", "verify_fd"]
