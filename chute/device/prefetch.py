"""The device stage's thread: batches copied ahead of the training loop, handed over in order.

``DevicePrefetcher`` runs one pass over an iterable of batches: a daemon thread
(``chute-device:<device>``) pulls each batch, starts its copy to the device
(:class:`DeviceCopier`) and puts it in a :class:`chute._channel.Channel`
of ``depth`` slots; the consumer takes batches in order and hands each over to
its current stream. ``DeviceLoader`` (what ``to_device`` returns) is the
re-iterable wrapper: one prefetcher per ``iter()``.

A host batch whose tensors were copied straight from pinned memory (the
Loader's own blocks, or a DataLoader's ``pin_memory=True`` batches) is kept
alive by the thread until the copy's event has completed, so the memory is not
reused while the copy may still read it.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from chute._channel import Channel, Closed, Failure
from chute.device.copier import DeviceCopier, DeviceLike, resolve_device

CopiedCallback = Callable[[Any, "torch.cuda.Event | None"], None]

#: Copies whose host batch may be in flight at once before the thread waits for the oldest.
HELD = 4

_END = object()  # end-of-pass marker (an immutable sentinel)


def _produce(iterator: Iterator[Any], copier: DeviceCopier, channel: Channel, on_copied: CopiedCallback | None) -> None:
    """Body of the copying thread: one pass over ``iterator``, then exit.

    Never calls ``iter()`` on the source again, so it cannot run into the next
    epoch. Every way out leaves a marker for the consumer (end or failure)
    unless the consumer closed the channel. Takes no reference to the
    prefetcher object, so dropping that object is what stops the thread.
    """
    held: deque[tuple[Any, Any]] = deque()  # (event, host batch): copies that may still read the host batch
    k = 0
    try:
        while channel.reserve(k):
            try:
                host = next(iterator)
            except StopIteration:
                channel.put(k, _END)
                return
            while held and held[0][0].query():
                held.popleft()
            batch, event = copier.copy(host)
            if on_copied is not None:
                on_copied(host, event)
            if event is not None:
                held.append((event, host))
                if len(held) > HELD:
                    held.popleft()[0].synchronize()
            del host
            channel.put(k, (batch, event))
            del batch, event
            k += 1
    except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer as is
        channel.put(k, Failure(exc))
    finally:
        for event, _ in held:  # the host batches go only once nothing reads them
            event.synchronize()
        held.clear()
        # Close generators here, in their own thread, so their finally blocks
        # run now; drop the references so a failure's traceback, which holds
        # this frame, does not keep the source alive.
        close = getattr(iterator, "close", None)
        del iterator
        if close is not None:
            try:
                close()
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"closing the wrapped iterator failed: {exc!r}", RuntimeWarning)
            del close


def _stop(channel: Channel, thread: threading.Thread, timeout: float) -> bool:
    """Stop a pass: wake and drain the channel, join the thread. True if it ended.

    A thread blocked inside the wrapped iterable's ``next()`` cannot be
    interrupted from Python: after ``timeout`` seconds it is left behind (it is
    a daemon thread, so it does not keep the interpreter alive) with a warning.
    """
    channel.close()
    if thread is threading.current_thread():  # collected by the GC in the thread itself
        return True
    thread.join(timeout)
    if thread.is_alive():
        warnings.warn(
            f"{thread.name}: the wrapped iterable did not return from next() within "
            f"{timeout:g} s; abandoning its thread (a daemon thread: it will not block exit)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


class DevicePrefetcher(Iterator[Any]):
    """One pass over ``source``, copied to the device up to ``depth`` batches ahead.

    ``iter(source)`` is called here, in the caller's thread (so a ``set_epoch``
    made before is honoured and a ``DataLoader`` forks its workers from the
    caller's thread); a daemon thread named ``chute-device:<device>`` then calls
    ``next()`` on it and ``copier.copy`` on each batch. ``__next__`` hands
    batches over in order (``DeviceCopier.hand_over``), re-raises an exception
    of the thread (the original object, traceback included) at the position it
    occurred, and raises ``StopIteration`` once the source is exhausted; the
    thread has then exited. ``close()`` (called on exhaustion, on errors, by
    ``with``, when the object is garbage-collected and at interpreter exit)
    stops and joins the thread. :meth:`take` is ``next()`` with a timeout.

    ``on_copied(host_batch, event)`` is called in the copying thread after each
    batch's copies are queued.
    """

    def __init__(
        self,
        source: Iterable[Any],
        copier: DeviceCopier,
        *,
        depth: int = 2,
        on_copied: CopiedCallback | None = None,
        shutdown_timeout: float = 5.0,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.copier = copier
        self._channel = Channel(depth, reserve=True)
        self._done = False
        self._k = 0
        iterator = iter(source)
        self.thread = threading.Thread(
            target=_produce,
            args=(iterator, copier, self._channel, on_copied),
            name="chute-device" if copier.device is None else f"chute-device:{copier.device}",
            daemon=True,
        )
        del iterator  # the thread owns it and closes it
        # weakref.finalize runs _stop when this object is collected, or at
        # interpreter exit (atexit) if it is still alive then: that is how the
        # thread normally ends. It is a daemon only so that a thread stuck in
        # the source's next() cannot block exit: the interpreter joins
        # non-daemon threads *before* it runs atexit hooks.
        self._finalizer = weakref.finalize(self, _stop, self._channel, self.thread, shutdown_timeout)
        self.thread.start()

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Any:
        return self.take(-1)

    def take(self, timeout: float = -1) -> Any:
        """The next batch, waiting up to ``timeout`` seconds (-1: for ever; ``TimeoutError`` after that)."""
        if self._done:
            raise StopIteration
        try:
            item = self._channel.take(self._k, timeout)
        except TimeoutError:
            raise
        except Closed:
            self._done = True
            raise StopIteration from None
        except BaseException:
            self.close()
            raise
        self._k += 1
        if item is _END:
            self.close()
            raise StopIteration
        batch, event = item
        return self.copier.hand_over(batch, event)

    def close(self) -> bool:
        """Stop the thread and drop queued batches. True if the thread has ended."""
        self._done = True
        if self._finalizer.alive:
            return bool(self._finalizer())
        return not self.thread.is_alive()

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class DeviceLoader:
    """Re-iterable wrapper returned by ``to_device``; see its docstring.

    Attributes it does not define itself (``sampler``, ``dataset``,
    ``batch_size`` ...) are read from the wrapped iterable.
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        device: DeviceLike,
        *,
        depth: int = 2,
        shutdown_timeout: float = 5.0,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.iterable = iterable
        self.depth = depth
        self.shutdown_timeout = shutdown_timeout
        self.device = resolve_device(device)
        self.copier = DeviceCopier(self.device)
        self._pass: weakref.ref[DevicePrefetcher] | None = None
        self._pass_thread: threading.Thread | None = None

    def __iter__(self) -> DevicePrefetcher:
        """Stop the previous pass (if any), then start a fresh one."""
        self._stop_pass()
        prefetcher = DevicePrefetcher(
            self.iterable,
            self.copier,
            depth=self.depth,
            shutdown_timeout=self.shutdown_timeout,
        )
        self._pass = weakref.ref(prefetcher)
        self._pass_thread = prefetcher.thread
        return prefetcher

    def _stop_pass(self) -> None:
        previous = self._pass() if self._pass is not None else None
        if previous is not None:
            previous.close()
        if self._pass_thread is not None and self._pass_thread.is_alive():
            # Abandoned in a blocked next(): it may still call copier.copy one
            # day, so it keeps the old copier and the next pass gets a new one.
            self.copier = DeviceCopier(self.device)
        self._pass = self._pass_thread = None

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]  # TypeError if it has none

    def set_epoch(self, epoch: int) -> None:
        """Forward to the wrapped iterable's ``set_epoch``, or else to its sampler's.

        Takes effect at the next ``iter()``: a pass already started keeps its order.
        """
        target = getattr(self.iterable, "set_epoch", None)
        if target is None:
            target = getattr(getattr(self.iterable, "sampler", None), "set_epoch", None)
        if target is None:
            raise AttributeError(
                f"neither {type(self.iterable).__name__} nor its sampler has set_epoch"
            )
        target(epoch)

    @property
    def pinned_allocations(self) -> int:
        """Pinned staging buffers allocated so far by the current copier."""
        return self.copier.pinned_allocations

    def close(self) -> None:
        """Stop the current pass and release the pinned staging buffers."""
        self._stop_pass()
        self.copier.staging.clear()

    def __enter__(self) -> DeviceLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "iterable":
            raise AttributeError(name)
        return getattr(self.iterable, name)

    def __repr__(self) -> str:
        return f"DeviceLoader({self.iterable!r}, device={self.device}, depth={self.depth})"


def to_device(
    iterable: Iterable[Any],
    device: DeviceLike,
    *,
    depth: int = 2,
    shutdown_timeout: float = 5.0,
) -> DeviceLoader:
    """Yield the batches of ``iterable`` with their tensors on ``device``.

    ``iterable`` is any iterable of batches (a torch ``DataLoader`` included);
    tensors may be nested in dicts, lists, tuples, namedtuples and dataclasses,
    other values pass through unchanged. ``device`` is ``"cuda"``,
    ``"cuda:N"``, ``N``, ``"cpu"`` or ``None`` (no move: only the background
    thread). A background thread copies up to ``depth`` batches ahead on a side
    CUDA stream from pinned memory; each batch is synchronised with the
    consumer's current stream when ``next()`` returns it.

    Each ``iter()`` of the result is one pass of ``iterable`` (call
    ``set_epoch`` before it); errors of ``iterable`` are re-raised at the batch
    where they happened; the thread stops on ``break``, ``del``, errors and
    interpreter exit. ``shutdown_timeout`` bounds how long stopping waits for a
    ``next()`` of ``iterable`` that does not return; the thread is then
    abandoned with a ``RuntimeWarning``.
    """
    return DeviceLoader(iterable, device, depth=depth, shutdown_timeout=shutdown_timeout)
