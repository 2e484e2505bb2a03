"""Run a per-chunk function in reader processes and get the results back in order.

The converters read and decode many small files (unpickle, gunzip, parse JSON).
That work holds the GIL, so it runs in a ``ProcessPoolExecutor`` while the main
process writes the shards. Items are sent in chunks (one task per file would cost
more in pickling than the read itself), a bounded number of chunks is in flight
(so memory stays flat however long the source is), and results are yielded in
submission order, so the dataset's row order is the source's order whatever the
number of workers.

Everything handed to the pool is a top-level function and picklable arguments,
so this works with every start method (``fork``, ``forkserver``, ``spawn``).

A reader process ends when the main process dies, even by ``SIGKILL``: a thread
in each reader blocks until the main process exits (a process file descriptor on
Linux, kqueue on macOS and the BSDs) and then ends the reader. Without it the
readers would sleep forever on their task queue.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import multiprocessing.connection
import os
import select
import selectors
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from chute.errors import ChuteError

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")  # a chunk OrderedPool.map hands to its function

MAX_CHUNK = 256
MIN_CHUNK = 8


def resolve_workers(workers: int | None) -> int:
    """The number of reader processes: None means one per CPU; 0 or 1 mean none (read in-process)."""
    if workers is None:
        return os.cpu_count() or 1
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    return workers


def chunk_size_for(total: int, workers: int) -> int:
    """A chunk size giving each worker several chunks (load balance) but not tiny ones (overhead)."""
    per_worker = total // max(1, workers * 4)
    return max(MIN_CHUNK, min(MAX_CHUNK, per_worker))


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


#: Seconds between checks of the parent's pid where the OS offers no way to wait for it.
_PARENT_CHECK_S = 1.0
#: Seconds a reader has to end after SIGTERM, then after SIGKILL.
_END_S = 5.0
#: Seconds between looks for a dead reader while a result is awaited.
_DEATH_CHECK_S = 1.0


def _init_reader(parent: int, setup: Callable[..., Any] | None = None, setup_args: tuple[Any, ...] = ()) -> None:
    """Reader process initializer: Ctrl-C is the main process's to handle (it shuts the pool down),
    and the reader ends when the main process ``parent`` dies. Then ``setup(*setup_args)``, if given."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="chute-reader-parent", daemon=True).start()
    if setup is not None:
        setup(*setup_args)


def _exit_with(parent: int) -> None:
    """Block until process ``parent`` has exited, then end this process at once."""
    _wait_for_exit(parent)
    os._exit(1)  # not sys.exit: the main thread may be blocked in a read of the source


def _wait_readable(fd: int, timeout: float | None = None) -> bool:
    """Wait until ``fd`` is readable (poll: select() fails for descriptors past 1024)."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def _wait_for_exit(pid: int) -> None:
    if os.getppid() != pid:
        return  # it died before we started watching (we were handed to another parent)
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        except OSError:
            fd = None  # an old kernel: fall through
        if fd is not None:
            try:
                if os.getppid() == pid:  # still ours: the pidfd names the right process
                    _wait_readable(fd)
            finally:
                os.close(fd)
            return
    if hasattr(select, "kqueue"):
        queue = select.kqueue()
        try:
            event = select.kevent(  # type: ignore[attr-defined]  # BSD and macOS only
                pid, select.KQ_FILTER_PROC, select.KQ_EV_ADD | select.KQ_EV_ONESHOT, select.KQ_NOTE_EXIT)  # type: ignore[attr-defined]
            queue.control([event], 1)
        except ProcessLookupError:
            pass
        finally:
            queue.close()
        return
    while os.getppid() == pid:  # neither: look now and then
        time.sleep(_PARENT_CHECK_S)


def _end_readers(executor: concurrent.futures.ProcessPoolExecutor) -> None:
    """End the pool's reader processes now (SIGTERM; SIGKILL for one still running ``_END_S`` seconds later).

    A reader ended while it writes a result (this SIGTERM can land there) leaves part of a message in
    the result pipe, and the pool's thread, which reads every result, would wait for the rest for
    ever: this process holds the pipe's write end too. Once every reader has ended, closing that end
    gives the thread an end of file instead; it then marks the pool broken, and ``shutdown`` returns.
    """
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    alive = {process.sentinel: process for process in processes}
    _wait_ended(alive, _END_S)
    for process in alive.values():
        process.kill()
    _wait_ended(alive, _END_S)
    writer = getattr(getattr(executor, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()


def _wait_ended(alive: dict[int, Any], timeout: float) -> None:
    """Wait at most ``timeout`` seconds for the processes of ``alive`` (by sentinel) to end, removing each that has."""
    deadline = time.monotonic() + timeout
    while alive and (left := deadline - time.monotonic()) > 0:
        for sentinel in multiprocessing.connection.wait(list(alive), left):
            del alive[sentinel]  # type: ignore[arg-type]


class OrderedPool:
    """``map`` a function over chunks in ``workers`` processes, results in input order.

    With ``workers`` 0 or 1 the function runs in this process (no pickling: handy in
    tests and for tiny sources). Use as a context manager: leaving the block after an
    error or a KeyboardInterrupt cancels the chunks not yet started and ends the reader
    processes without waiting for the chunks in hand; either way, every reader has
    ended when the block is left.

    ``setup(*setup_args)`` runs once in each reader process when it starts (to load
    what every chunk needs, such as a tokenizer, once per process rather than once
    per chunk); it must be a top-level function, ``setup_args`` picklable.
    """

    def __init__(
        self,
        workers: int | None,
        *,
        start_method: str | None = None,
        setup: Callable[..., Any] | None = None,
        setup_args: tuple[Any, ...] = (),
    ) -> None:
        self.workers = resolve_workers(workers)
        self.start_method = start_method
        self.setup = setup
        self.setup_args = setup_args
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def __enter__(self) -> OrderedPool:
        if self.workers > 1:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context(self.start_method),
                initializer=_init_reader,
                initargs=(os.getpid(), self.setup, self.setup_args),
            )
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if exc_type is not None:
            # after an error the chunks in hand are of no use: end the readers now rather than
            # wait for them (a reader may be blocked on a slow source), so that every reader
            # process has ended and been reaped when the error reaches the caller
            _end_readers(executor)
        executor.shutdown(wait=True, cancel_futures=True)

    def map(self, fn: Callable[[C], list[R]], chunks: Iterable[C]) -> Generator[R, None, None]:
        """Yield ``fn(chunk)``'s results, chunk after chunk, in the order of ``chunks``."""
        chunk: C | None
        if self._executor is None:
            for chunk in chunks:
                yield from fn(chunk)
            return
        pending: collections.deque[concurrent.futures.Future[list[R]]] = collections.deque()
        source = iter(chunks)
        limit = 2 * self.workers
        try:
            for chunk in source:
                pending.append(self._executor.submit(fn, chunk))
                if len(pending) >= limit:
                    break
            while pending:
                results = self._result(pending.popleft())
                chunk = next(source, None)
                if chunk is not None:  # keep the pool busy while the caller consumes
                    pending.append(self._executor.submit(fn, chunk))
                yield from results
        except BrokenProcessPool:
            raise ChuteError(
                "a reader process died (killed by the system, out of memory?); run again with "
                "fewer workers (--workers) or workers=0 to read in this process"
            ) from None
        finally:
            for future in pending:
                future.cancel()

    def _result(self, future: concurrent.futures.Future[list[R]]) -> list[R]:
        """``future.result()``; ``BrokenProcessPool`` once a reader has died, looked for every ``_DEATH_CHECK_S``
        seconds: the pool reports one itself, unless it died while it wrote a result, which leaves the pool's
        thread waiting for the rest of it (then :func:`_end_readers` ends the wait)."""
        executor = self._executor
        assert executor is not None
        while True:
            try:
                return future.result(timeout=_DEATH_CHECK_S)
            except concurrent.futures.TimeoutError:
                pass
            sentinels = [p.sentinel for p in list((getattr(executor, "_processes", None) or {}).values())]
            if sentinels and multiprocessing.connection.wait(sentinels, 0):  # (a reader never ends while in use)
                _end_readers(executor)
                raise BrokenProcessPool("a reader process ended")


def call_chunk(fn: Callable[..., Any], kwargs: dict[str, Any], chunk: Sequence[Any]) -> list[Any]:
    """``[fn(item, **kwargs) for item in chunk]``: a picklable per-item adapter for ``map``."""
    return [fn(item, **kwargs) for item in chunk]
