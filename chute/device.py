"""The device stage: move batches to the training device while the model computes.

``to_device(iterable, device)`` wraps any iterable of batches (a torch
``DataLoader`` included) and yields the same batches with every tensor on
``device``. A background thread pulls batches ahead of the training loop, copies
them on a side CUDA stream and hands them over through a bounded channel, so the
host-to-device transfer of batch ``n + 1`` overlaps the compute of batch ``n``.

The pieces, from the bottom up (each usable on its own):

``map_tensors``
    Apply a function to every tensor of a nested batch (dicts and other
    mappings, lists, tuples, namedtuples, dataclasses); everything else passes
    through. Containers are rebuilt with their own type, and only when a tensor
    inside them changed.
``StagingRing``
    Reused pinned host buffers keyed by ``(shape, dtype)``. An unpinned host
    tensor is copied into one of them, because only a copy *from pinned
    memory* is asynchronous. A buffer is rewritten only after the device copy
    that last read it is done (it waits on that copy's event).
``DeviceCopier``
    Copies one batch to the device on its side stream and returns
    ``(device_batch, event)``; the event completes when the batch is on the
    device and the host memory it was read from may be rewritten.
    ``hand_over`` makes the consumer's current stream wait on the event and
    ties the device memory to that stream (``record_stream``).
``DevicePrefetcher``
    One pass over an iterable: a named daemon thread (``chute-device:<dev>``)
    that copies up to ``depth`` batches ahead, re-raises the thread's errors in
    the consumer and stops cleanly on ``close``, garbage collection or
    interpreter exit.
``DeviceLoader`` (returned by ``to_device``)
    A re-iterable wrapper: each ``iter()`` starts one ``DevicePrefetcher`` over
    a fresh pass of the wrapped iterable, after stopping the previous one.
    ``len()``, ``set_epoch`` and attributes such as ``.sampler`` and
    ``.dataset`` are forwarded to the wrapped iterable.

Buffer reuse (why no memory is rewritten or freed while a kernel reads it):

* Host staging buffers: a ring guarded by events. Before a staging buffer is
  rewritten, the copying thread waits on the event of the batch whose copy last
  read it. With two batches' worth of buffers per key (the default) that
  copy has normally finished long before, so the wait costs nothing.
* Device tensors: fresh allocations from PyTorch's caching allocator on the side
  stream, plus ``Tensor.record_stream(consumer_stream)`` at hand-over. The batch
  belongs to the user from then on (they may keep it, e.g. for logging), so a
  ring of device buffers that chute rewrites would corrupt tensors the user
  still holds. ``record_stream`` makes the allocator wait for the consumer
  stream's pending work before it reuses the memory for a later batch, and
  costs nothing when the user drops the batch at the end of the step. The
  number of batches on the device that the consumer has not taken yet is at
  most ``depth``.

How chute's Loader plugs in: its pin stage writes each batch into a ring of
pinned host buffers of its own and feeds the host batches to a
``DevicePrefetcher`` (or calls ``DeviceCopier.copy`` from its own thread).
Tensors that are already pinned are copied straight from the Loader's memory,
without staging, so the Loader must not rewrite a host buffer until the copy
that reads it is done. It learns this through ``on_copied(host_batch, event)``,
called in the copying thread right after the batch's copies are queued: before
rewriting the buffers of ``host_batch`` it calls ``event.synchronize()`` (or
``event.query()`` to test without blocking). ``event`` is ``None`` when nothing
was copied (device ``cpu``/``None``, or the tensors were already on the
device); the consumer then receives the host tensors themselves, so on CPU the
Loader must not recycle buffers it has handed out.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

import torch

from chute.errors import ChuteError

__all__ = [
    "DeviceCopier",
    "DeviceLoader",
    "DevicePrefetcher",
    "StagingRing",
    "map_tensors",
    "to_device",
]

DeviceLike = torch.device | str | int | None
CopiedCallback = Callable[[Any, "torch.cuda.Event | None"], None]


# --------------------------------------------------------------------------
# Nested batches
# --------------------------------------------------------------------------


_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None)})  # never hold tensors


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Return ``batch`` with ``fn`` applied to every tensor in it.

    Recurses into mappings, lists, tuples, namedtuples and dataclass instances
    and rebuilds each with its own type (a ``defaultdict`` keeps its factory, a
    frozen dataclass stays frozen, ``__post_init__`` is not run again).
    Strings, ``None``, numbers, arrays and any other object pass through as the
    same object. A container in which no tensor changed is returned as is, so
    ``map_tensors(lambda t: t, batch) is batch``.
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if type(batch) in _ATOMS or isinstance(batch, (str, bytes)):
        return batch
    if isinstance(batch, Mapping):
        changed = {}
        for key, value in batch.items():
            new = map_tensors(fn, value)
            if new is not value:
                changed[key] = new
        if not changed:
            return batch
        if type(batch) is dict:
            return {key: changed.get(key, value) for key, value in batch.items()}
        if isinstance(batch, MutableMapping):
            out = copy.copy(batch)
            out.update(changed)
            return out
        return type(batch)({key: changed.get(key, value) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(fn, value) for value in batch]
        if all(new is old for new, old in zip(items, batch)):
            return batch
        if type(batch) is list:
            return items
        if type(batch) is tuple:
            return tuple(items)
        if isinstance(batch, tuple) and hasattr(type(batch), "_fields"):
            return type(batch)(*items)  # namedtuple
        return type(batch)(items)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changed = {}
        for field in dataclasses.fields(batch):
            value = getattr(batch, field.name)
            new = map_tensors(fn, value)
            if new is not value:
                changed[field.name] = new
        if not changed:
            return batch
        # copy + setattr rather than dataclasses.replace: replace() re-runs
        # __init__/__post_init__ and cannot set init=False fields.
        out = copy.copy(batch)
        for name, value in changed.items():
            object.__setattr__(out, name, value)
        return out
    return batch


def _resolve_device(device: DeviceLike) -> torch.device | None:
    """Normalise ``device`` to ``None``, ``cpu`` or ``cuda:N`` (an explicit index)."""
    if device is None:
        return None
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    if not torch.cuda.is_available():
        raise ChuteError(
            f"device={device!r} was requested but torch.cuda.is_available() is False; "
            "pass device='cpu' (or None) on a machine without a CUDA GPU"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ChuteError(
            f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


# --------------------------------------------------------------------------
# Host staging ring
# --------------------------------------------------------------------------


class _Guard(Protocol):
    """What the ring needs from an event: block until the work it marks is done."""

    def synchronize(self) -> None: ...


@dataclasses.dataclass
class _Pool:
    """The staging buffers of one ``(shape, dtype)``."""

    free: deque[tuple[torch.Tensor, _Guard | None]] = dataclasses.field(default_factory=deque)
    in_batch: list[torch.Tensor] = dataclasses.field(default_factory=list)
    size: int = 0  # buffers owned, free or in the current batch
    peak: int = 0  # most buffers one batch has needed


class StagingRing:
    """Reused host staging buffers, keyed by ``(shape, dtype)``, pinned by default.

    ``stage(t)`` copies ``t`` into a buffer of its shape and dtype and returns
    the buffer; ``release(event)`` ends a batch: every buffer staged since the
    previous ``release`` may be rewritten once ``event`` has completed. Each key
    keeps ``slots`` batches' worth of buffers (``slots * peak``, where ``peak``
    is the most tensors of that key one batch has held), so staging batch
    ``n + 1`` never waits for the copy of batch ``n``. At most ``max_shapes``
    keys are kept; the least recently used one is dropped beyond that, so
    batches of ever-changing shapes do not pin memory without bound.

    ``allocations`` counts buffers ever allocated: with fixed shapes it stops
    at ``slots`` times the number of tensors per batch.

    Dropping a buffer (``clear``, eviction) while a copy may still read it is
    safe: PyTorch's pinned-memory allocator records an event for every
    asynchronous copy and does not hand the memory out again before it is done.
    Rewriting is what needs the ring's own events. Not thread-safe: one
    copying thread owns it.
    """

    def __init__(self, *, slots: int = 2, max_shapes: int = 16, pin_memory: bool = True) -> None:
        if slots < 1 or max_shapes < 1:
            raise ValueError(f"slots and max_shapes must be >= 1, got {slots}, {max_shapes}")
        self.slots = slots
        self.max_shapes = max_shapes
        self.pin_memory = pin_memory
        self.allocations = 0
        self._pools: OrderedDict[tuple[tuple[int, ...], torch.dtype], _Pool] = OrderedDict()
        self._touched: list[_Pool] = []

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        """Copy ``src`` (a CPU tensor) into a staging buffer and return the buffer."""
        key = (tuple(src.shape), src.dtype)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        self._pools.move_to_end(key)
        wanted = self.slots * max(pool.peak, len(pool.in_batch) + 1)
        if pool.free and pool.size >= wanted:
            buf, guard = pool.free.popleft()
            if guard is not None:
                guard.synchronize()  # the device copy that last read buf is done
        else:
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.pin_memory)
            pool.size += 1
            self.allocations += 1
        if not pool.in_batch:
            self._touched.append(pool)
        pool.in_batch.append(buf)
        buf.copy_(src)
        return buf

    def release(self, guard: _Guard | None) -> None:
        """End the batch: its buffers may be rewritten once ``guard`` completes."""
        for pool in self._touched:
            pool.peak = max(pool.peak, len(pool.in_batch))
            pool.free.extend((buf, guard) for buf in pool.in_batch)
            pool.in_batch.clear()
        self._touched.clear()
        while len(self._pools) > self.max_shapes:
            self._pools.popitem(last=False)

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the ring holds."""
        total = 0
        for pool in self._pools.values():
            buffers = [buf for buf, _ in pool.free] + pool.in_batch
            total += sum(buf.numel() * buf.element_size() for buf in buffers)
        return total

    def clear(self) -> None:
        """Drop every buffer (returns the pinned memory to PyTorch's allocator)."""
        self._pools.clear()
        self._touched.clear()


# --------------------------------------------------------------------------
# One batch to the device
# --------------------------------------------------------------------------


class DeviceCopier:
    """Copies batches to one device on a side stream.

    ``copy`` runs in the copying thread, ``hand_over`` in the consumer thread.
    For ``device=None`` batches pass through untouched; for ``cpu`` tensors
    already on the CPU pass through (others are moved synchronously); in both
    cases there is no event. For ``cuda:N`` see the module docstring.
    """

    def __init__(
        self, device: DeviceLike, *, staging_slots: int = 2, max_shapes: int = 16
    ) -> None:
        self.device = _resolve_device(device)
        self.is_cuda = self.device is not None and self.device.type == "cuda"
        self.staging = StagingRing(slots=staging_slots, max_shapes=max_shapes, pin_memory=True)
        self._stream: torch.cuda.Stream | None = None

    @property
    def pinned_allocations(self) -> int:
        """Pinned staging buffers allocated so far (stays at the ring size)."""
        return self.staging.allocations

    def copy(self, batch: Any) -> tuple[Any, torch.cuda.Event | None]:
        """Start copying ``batch`` to the device; return ``(device_batch, event)``.

        ``event`` (``None`` without CUDA) completes when the copies are done:
        the consumer's stream must wait on it before reading ``device_batch``
        (``hand_over`` does that), and pinned tensors of ``batch`` that were
        copied directly must not be rewritten before it. Unpinned tensors were
        staged synchronously and may be rewritten as soon as ``copy`` returns.
        """
        if self.device is None:
            return batch, None
        if not self.is_cuda:
            return map_tensors(lambda t: t if t.is_cpu else t.to(self.device), batch), None
        # The current device is per thread: make it ours in the copying thread,
        # so the stream, events and allocations land on the right GPU.
        if torch.cuda.current_device() != self.device.index:
            torch.cuda.set_device(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.no_grad(), torch.cuda.stream(self._stream):
            try:
                out = map_tensors(self._copy_tensor, batch)
            finally:
                # Recorded even if a copy failed, so the buffers staged so far
                # are only rewritten after the copies already queued.
                event = torch.cuda.Event()
                event.record(self._stream)
                self.staging.release(event)
        return out, event

    def _copy_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        if t.device.type == "cpu" and t.layout == torch.strided and not t.is_pinned():
            t = self.staging.stage(t)
        # Allocated on the side stream (the current one here); hand_over ties it
        # to the consumer's stream.
        return t.to(self.device, non_blocking=True)

    def hand_over(self, batch: Any, event: torch.cuda.Event | None) -> Any:
        """Make ``batch`` safe to use on the calling thread's current stream.

        The current stream waits (on the GPU, the host does not block) for the
        copies, and every device tensor of the batch is recorded on that stream
        so its memory is not reused while work queued there may still read it.
        A batch used on another stream later needs the user's own sync.
        """
        if event is None:
            return batch
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)

        def record(t: torch.Tensor) -> torch.Tensor:
            if t.device == self.device:
                t.record_stream(stream)
            return t

        map_tensors(record, batch)  # record() returns t: this only walks the batch
        return batch


# --------------------------------------------------------------------------
# The background thread
# --------------------------------------------------------------------------


class _Channel:
    """Bounded FIFO from the copying thread to the consumer.

    The producer ``reserve``s a place before it pulls a batch from the source
    and ``put``s the copied batch into it, so at most ``capacity`` batches are
    pulled and not yet taken. ``finish`` adds the end-of-pass marker without a
    place. ``close`` wakes both sides and drops what is queued; ``reserve``
    then returns False and the producer exits. Blocking waits on conditions,
    no polling.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        lock = threading.Lock()
        self._not_full = threading.Condition(lock)
        self._not_empty = threading.Condition(lock)
        self._items: deque[Any] = deque()
        self._reserved = 0
        self._closed = False

    def reserve(self) -> bool:
        with self._not_full:
            while not self._closed and len(self._items) + self._reserved >= self._capacity:
                self._not_full.wait()
            if self._closed:
                return False
            self._reserved += 1
            return True

    def put(self, item: Any) -> None:
        with self._not_empty:
            self._reserved -= 1
            if not self._closed:
                self._items.append(item)
                self._not_empty.notify()

    def finish(self, marker: Any) -> None:
        with self._not_empty:
            if not self._closed:
                self._items.append(marker)
                self._not_empty.notify()

    def get(self) -> Any:
        with self._not_empty:
            while not self._items and not self._closed:
                self._not_empty.wait()
            if not self._items:
                return _END
            item = self._items.popleft()
            self._not_full.notify()
            return item

    def close(self) -> None:
        with self._not_empty:
            self._closed = True
            self._items.clear()
            self._not_empty.notify_all()
            self._not_full.notify_all()


_END = object()  # end-of-pass marker (an immutable sentinel)


class _Failure:
    """An exception raised in the copying thread, to be re-raised by the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _produce(
    iterator: Iterator[Any],
    copier: DeviceCopier,
    channel: _Channel,
    on_copied: CopiedCallback | None,
) -> None:
    """Body of the copying thread: one pass over ``iterator``, then exit.

    Never calls ``iter()`` on the source again, so it cannot run into the next
    epoch. Every way out leaves a marker for the consumer (end or failure)
    unless the consumer closed the channel. Takes no reference to the
    prefetcher object, so dropping that object is what stops the thread.
    """
    try:
        while channel.reserve():
            try:
                host = next(iterator)
            except StopIteration:
                channel.finish(_END)
                return
            batch, event = copier.copy(host)
            if on_copied is not None:
                on_copied(host, event)
            del host
            channel.put((batch, event))
            del batch, event
    except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer as is
        channel.finish(_Failure(exc))
    finally:
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


def _stop(channel: _Channel, thread: threading.Thread, timeout: float) -> bool:
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
    thread has then exited. ``close()`` — called on exhaustion, on errors, by
    ``with``, when the object is garbage-collected (``break`` out of a ``for``,
    ``del``) and at interpreter exit — stops and joins the thread.

    ``on_copied(host_batch, event)`` is called in the copying thread after each
    batch's copies are queued; see the module docstring.
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
        self._channel = _Channel(depth)
        self._done = False
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
        self._finalizer = weakref.finalize(
            self, _stop, self._channel, self.thread, shutdown_timeout
        )
        self.thread.start()

    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item = self._channel.get()
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc  # the original object: its __traceback__ has the raising frame
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


# --------------------------------------------------------------------------
# The wrapper
# --------------------------------------------------------------------------


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
        self.device = _resolve_device(device)
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
