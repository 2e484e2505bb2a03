"""Worker processes for transforms that hold the GIL: ``Loader(..., workers="processes")``.

Threads are chute's default (DESIGN.md decision 2): the gather and decoding run
in native code that releases the GIL. A per-sample transform written in pure
Python holds it, so for those the batch tasks run in worker processes instead.
The unit of work is still one whole batch::

    main process                                      worker i (spawned)
    ────────────                                      ──────────────────
    map(epoch, start, steps)
      ("task", pass, step, slot, segment) ─pipe i─►   indices = order.batch(epoch, step, ...)
                                                      loaded = load_batch(dataset, indices, fns)
                                                      tensor bytes ──► ring slot (shared memory)
      ◄─pipe i─ ("ok", pass, step, slot, batch pickled without its tensor data, layout)
    copy the tensors out of the slot, free the slot, yield in step order

**The ring.** ``depth`` slots; each is one shared-memory segment that the main
process creates on the slot's first use, reuses for every later batch, and
re-creates only when a batch did not fit (the first size comes from the
dataset's fixed-size columns times the batch size; a new size has 25% headroom, and
every slot grows to it on its next use, so this happens a few times per run,
never per batch). The main process owns every segment: it creates, sizes and
unlinks them; workers only attach. A slot is handed to one task at a time and
is free again once the main process has **copied the batch out** (one memcpy;
the consumer gets ordinary tensors it may keep, no release protocol). A batch
that does not fit travels pickled through the pipe once, and its size is what
the ring grows to.

**The protocol.** Each worker has a duplex pipe. Tasks are sent ahead (at most
``depth`` in flight overall, each to the worker with the fewest outstanding
tasks); replies come back in task order per worker and are re-ordered by step.
The batch is pickled with its tensors replaced by references (``persistent_id``),
so tensors anywhere in a nested batch (dicts, lists, tuples, dataclasses...)
cross through the ring and everything else (str, bytes, dicts, numbers) through
the pipe. Every task and reply carries its pass id: ending a pass early sends
``("cancel", pass)``, workers answer queued tasks of that pass with
``"cancelled"`` instead of running them, and replies of old passes only free
their slots. An exception in a worker comes back pickled, with the worker's
formatted traceback chained as :class:`RemoteTraceback`. The main process waits
on the pipes *and* the process sentinels, so a worker that dies is reported
(pid, exit code, step) instead of hanging.

**Shutdown.** ``close()`` sends every worker a stop, lets idle ones exit, then
terminates and kills the rest after a short grace period, closes the pipes and
sentinels and unlinks the segments. The same runs when the pool is garbage
collected and at interpreter exit (``weakref.finalize``), and when a pass is
interrupted (Ctrl-C) or a worker dies; iterating again then starts new workers.
Workers ignore SIGINT (the main process decides), exit when the main process
disappears (their pipe reaches EOF), and leave with ``os._exit`` (the
interpreter's teardown takes over half a second with torch loaded; a worker
has nothing left to release, but ``atexit`` handlers of user code do not run
there). If the main process itself is killed (SIGKILL, or SIGTERM without a
handler), no Python code runs: the workers exit on EOF and multiprocessing's
resource tracker unlinks the segments (with its "leaked shared_memory" warning).

Workers are started with ``spawn`` (``fork`` is unsafe with threads and
torch): the entry point is a top-level function, the dataset pickles as its
manifest and re-maps its shards lazily in the worker, and the user's functions
must be picklable, i.e. defined at module level.

Limits: one pass runs at a time (a new ``map`` ends the previous pass, whose
iterator then raises) and it is consumed by one thread at a time; tensors come
back contiguous and as separate storages (views of one tensor become copies;
the same tensor object twice stays one tensor); sparse, quantized, nested,
``requires_grad`` and empty tensors are pickled through the pipe instead.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import io
import itertools
import multiprocessing
import os
import pickle
import secrets
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator
from multiprocessing import connection, resource_tracker, shared_memory
from typing import Any

import torch

from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.format.schema import FIXED_SIZE
from chute.order import Order
from chute.pipeline.batch import BatchFns, Loaded, copy_into, load_batch
from chute.pipeline.buffers import BufferPool

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_ALIGN = 64  # every tensor starts on a 64-byte boundary of its slot
_GRAIN = 1 << 16  # slot sizes are multiples of this
_MIN_SLOT = 1 << 18
_STOP_GRACE = 1.0  # seconds a stopped worker gets to exit on its own before it is terminated
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # asks a worker for its stacks (the hang watchdog)

_GUARD_ADVICE = (
    "With workers='processes' the transform, batch_transform and collate are sent to worker processes "
    "started with spawn: each must be a module-level function (not a lambda, a nested function or a "
    "closure) in a module the workers can import, and a script must start the loader under "
    "`if __name__ == \"__main__\":` (spawn imports the main module again in every worker)"
)


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process.

    Set as the ``__cause__`` of the innermost re-raised exception, so the
    worker's frames are printed above the consumer's.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


def check_picklable(fns: BatchFns) -> None:
    """Raise a :class:`ChuteError` saying what to do if a user function cannot go to a worker process."""
    for role in ("transform", "batch_transform", "collate"):
        fn = getattr(fns, role)
        if fn is None:
            continue
        try:
            pickle.dumps(fn, _PROTOCOL)
        except Exception as exc:
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise ChuteError(f"cannot send the {role} {name} to the worker processes ({type(exc).__name__}: {exc}). {_GUARD_ADVICE}") from exc


# --------------------------------------------------------------------------- the ring


class _Segment:
    """One shared-memory segment, created and unlinked by the main process, attached by workers."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        self.name, self.size = name, size

    def view(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = _numel(shape) * dtype.itemsize
        return torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)

    def close(self, unlink: bool) -> None:
        with contextlib.suppress(BufferError):  # a view still alive keeps the mapping until it goes
            self.shm.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


class _Ring:
    """``slots`` reusable segments (main process side): take a free slot, give it back when copied out."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self._prefix = f"chute_{os.getpid()}_{secrets.token_hex(4)}"
        self._made = 0
        self.segments: list[_Segment | None] = [None] * slots
        self._free = list(reversed(range(slots)))  # a stack: the most recently used slot first
        self.target = slot_bytes

    def take(self) -> int | None:
        """A free slot whose segment holds ``target`` bytes (created now if needed), or None."""
        if not self._free:
            return None
        slot = self._free.pop()
        segment = self.segments[slot]
        if segment is None or segment.size < self.target:
            self.segments[slot] = None
            if segment is not None:
                segment.close(unlink=True)
            name = f"{self._prefix}_{self._made}"
            self._made += 1
            try:
                self.segments[slot] = _Segment(name, self.target, create=True)
            except OSError as exc:
                self._free.append(slot)
                raise ChuteError(
                    f"cannot create a {self.target}-byte shared memory segment {name} for the worker processes "
                    f"({exc}); /dev/shm is full or too small (in docker: --shm-size): use workers='threads', "
                    "a smaller batch_size or a smaller prefetch"
                ) from exc
        return slot

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def fit(self, need: int) -> None:
        """A batch needed ``need`` bytes: slots smaller than that are re-created on their next use."""
        if need > self.target:
            self.target = _slot_bytes(need)

    def release(self) -> None:
        segments, self.segments = self.segments, [None] * len(self.segments)
        for segment in segments:
            if segment is not None:
                segment.close(unlink=True)


def _slot_bytes(need: int) -> int:
    want = need + need // 4
    return max(_MIN_SLOT, -(-want // _GRAIN) * _GRAIN)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


# --------------------------------------------------------------------------- batch encoding


class _TensorPickler(pickle.Pickler):
    """Pickles a batch with its tensors left out: each becomes an index into ``tensors``."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, _PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is not torch.Tensor or not _ringable(obj):
            return None
        index = self._index.get(id(obj))
        if index is None:  # the same tensor twice arrives as one tensor
            index = self._index[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return index


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, pid: int) -> torch.Tensor:
        return self._tensors[pid]


def _ringable(t: torch.Tensor) -> bool:
    """Plain dense CPU tensors go through the ring; anything else (sparse, grad, empty) is pickled."""
    return (
        t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_nested
        and t.numel() > 0
    )


def _encode(value: Any, segment: _Segment | None) -> tuple[bytes, list | None, bytes | None, int]:
    """``(pickled value without tensor data, ring layout, or the tensors pickled if they do not fit, bytes needed)``."""
    buffer = io.BytesIO()
    pickler = _TensorPickler(buffer)
    pickler.dump(value)
    layout, end = [], 0
    for t in pickler.tensors:
        layout.append((end, tuple(t.shape), t.dtype))
        end = _align(end + t.numel() * t.element_size())
    if pickler.tensors and (segment is None or end > segment.size):
        return buffer.getvalue(), None, pickle.dumps(pickler.tensors, _PROTOCOL), end
    for (offset, shape, dtype), t in zip(layout, pickler.tensors):
        segment.view(offset, shape, dtype).copy_(t)
    return buffer.getvalue(), layout, None, end


def _decode(
    payload: bytes, layout: list | None, inline: bytes | None, segment: _Segment | None, buffers: BufferPool | None = None
) -> Any:
    """The value :func:`_encode` encoded, its tensors copied out of the segment.

    Into reused ``buffers`` if given: a fresh tensor per batch would fault on
    every page it is copied into (tens of MB per batch of images).
    """
    if inline is not None:
        tensors = pickle.loads(inline)
    else:
        tensors = [_copy_out(segment.view(offset, shape, dtype), buffers) for offset, shape, dtype in layout or ()]
    return _TensorUnpickler(io.BytesIO(payload), tensors).load()


def _copy_out(view: torch.Tensor, buffers: BufferPool | None) -> torch.Tensor:
    if buffers is None:
        return view.clone()
    out = buffers.take(tuple(view.shape), view.dtype)
    copy_into(out, view)
    return out


def _encode_exception(exc: BaseException) -> tuple[list[bytes], str]:
    """The exception and its chain (each pickled on its own) and the formatted traceback."""
    text = "".join(traceback.format_exception(exc))
    chain: list[bytes] = []
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(chain) < 16:
        seen.add(id(link))
        try:
            data = pickle.dumps(link, _PROTOCOL)
            pickle.loads(data)  # some exception classes pickle but cannot be rebuilt
        except Exception:
            data = pickle.dumps(ChuteError(f"{type(link).__module__}.{type(link).__qualname__}: {_safe_str(link)}"), _PROTOCOL)
        chain.append(data)
        link = link.__cause__ if link.__cause__ is not None else (None if link.__suppress_context__ else link.__context__)
    return chain, text


def _decode_exception(chain: list[bytes], text: str) -> BaseException:
    links: list[BaseException] = []
    for data in chain:
        try:
            links.append(pickle.loads(data))
        except Exception as exc:
            links.append(ChuteError(f"an exception raised in a worker process could not be unpickled: {exc}"))
    for outer, inner in zip(links, links[1:]):
        outer.__cause__ = inner
    links[-1].__cause__ = RemoteTraceback(text)
    return links[0]


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<unprintable>"


# --------------------------------------------------------------------------- the worker


def _worker_main(conn: connection.Connection, setup: bytes, stacks: connection.Connection | None = None) -> None:
    """A worker process: run batch tasks from ``conn`` until told to stop or the main process goes.

    ``stacks`` is the write end of a pipe: on SIGUSR1 ``faulthandler`` writes the
    Python stack of every thread of this worker into it, from the signal handler
    (no GIL needed), for the hang watchdog in the main process.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if stacks is not None and _STACK_SIGNAL is not None:
        faulthandler.register(_STACK_SIGNAL, file=stacks.fileno(), all_threads=True, chain=False)
    torch.set_num_threads(1)  # workers x intra-op threads would oversubscribe the cores
    try:
        try:
            dataset, order, fns, rank, world_size = pickle.loads(setup)
        except BaseException:
            conn.send(("fatal", traceback.format_exc()))
            return
        conn.send(("ready",))
        _serve(conn, dataset, order, fns, rank, world_size)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone
    # Nothing is left to release: skip the interpreter's teardown, which takes over half a
    # second with torch loaded and would make close() wait for it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(conn: connection.Connection, dataset: Dataset, order: Order, fns: BatchFns, rank: int, world_size: int) -> None:
    segments: dict[int, _Segment] = {}
    buffers = BufferPool(keep=2)  # batches are copied into the ring and dropped: their buffers are reused
    inbox: collections.deque[tuple] = collections.deque()
    cancelled = 0  # tasks of passes up to this one are not run
    try:
        while True:
            # Read everything already sent, so a cancel or stop queued behind tasks takes effect now.
            while not inbox or conn.poll():
                message = conn.recv()
                if message is None:
                    return
                if message[0] == "cancel":
                    cancelled = max(cancelled, message[1])
                else:
                    inbox.append(message)
            _, pass_id, epoch, start, step, slot, name, size = inbox.popleft()
            if pass_id <= cancelled:
                conn.send(("cancelled", pass_id, step, slot))
                continue
            segment = segments.get(slot)
            if name is not None and (segment is None or segment.name != name):
                if segment is not None:
                    segment.close(unlink=False)
                segment = segments[slot] = _Segment(name, size, create=False)
            reply = _run(dataset, order, fns, rank, world_size, epoch, start, step, segment, buffers)
            conn.send(("reply", pass_id, step, slot, reply))
            del reply
    finally:
        for segment in segments.values():
            segment.close(unlink=False)


def _run(
    dataset: Dataset, order: Order, fns: BatchFns, rank: int, world_size: int, epoch: int, start: int, step: int,
    segment: _Segment | None, buffers: BufferPool | None = None,
) -> tuple:
    """``("ok", payload, layout, inline, need)`` or ``("error", chain, traceback text)`` for one batch."""
    try:
        loaded = load_batch(dataset, order.batch(epoch, step, rank, world_size, start), fns, buffers=buffers)
        try:
            return ("ok", *_encode((loaded.batch, loaded.rows, loaded.skipped, loaded.times), segment))  # times: for the counters
        except Exception as exc:
            raise ChuteError(
                f"the batch of step {step} (epoch {epoch}) cannot be sent back from the worker process "
                f"({type(exc).__name__}: {exc}); with workers='processes' a batch must be picklable: "
                "tensors, numbers, str, bytes and lists, tuples and dicts of them"
            ) from exc
    except Exception as exc:
        return ("error", *_encode_exception(exc))


# --------------------------------------------------------------------------- the main process side


class _Worker:
    """The main process's handle on one worker: process, pipe and the tasks it has not answered."""

    __slots__ = ("process", "conn", "tasks", "ready", "eof", "stacks")

    def __init__(
        self, process: multiprocessing.process.BaseProcess, conn: connection.Connection, stacks: connection.Connection | None = None
    ) -> None:
        self.process = process
        self.conn = conn
        self.stacks = stacks  # read end of the worker's stack-dump pipe
        self.tasks: collections.deque[tuple[int, int, int, int]] = collections.deque()  # (pass, epoch, step, slot)
        self.ready = False
        self.eof = False


class _Running:
    """The running workers and the ring: everything :meth:`shutdown` must release.

    Holds no reference to the pool, so the pool's finalizer can call ``shutdown``.
    """

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.ring: _Ring | None = None
        self.wake: tuple[connection.Connection, connection.Connection] | None = None  # interrupts the consumer's wait

    @property
    def started(self) -> bool:
        return self.ring is not None

    def start(self, context: Any, setup: bytes, workers: int, slots: int, slot_bytes: int, name: str) -> None:
        # Workers register the segments they attach with the tracker they inherit: make it this
        # process's (spawn passes it on anyway; a forked worker would otherwise start its own,
        # which reports the segments as leaked when the worker exits).
        resource_tracker.ensure_running()
        self.ring = _Ring(slots, slot_bytes)
        try:
            self.wake = context.Pipe(duplex=False)
            for i in range(workers):
                parent, child = context.Pipe(duplex=True)
                stacks_in, stacks_out = context.Pipe(duplex=False)
                process = context.Process(target=_worker_main, args=(child, setup, stacks_out), name=f"{name}-{i}", daemon=True)
                try:
                    process.start()
                finally:
                    child.close()
                    stacks_out.close()
                self.workers.append(_Worker(process, parent, stacks_in))
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self, grace: float = _STOP_GRACE) -> None:
        """Stop the workers (ask, then terminate, then kill), close their pipes, unlink the ring."""
        workers, self.workers = self.workers, []
        ring, self.ring = self.ring, None
        wake, self.wake = self.wake, None
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        deadline = time.monotonic() + grace
        live = [w for w in workers if w.process.exitcode is None]
        while live and (remaining := deadline - time.monotonic()) > 0:
            handles = [w.process.sentinel for w in live] + [w.conn for w in live if not w.eof]
            for ready in connection.wait(handles, remaining):
                for w in live:
                    if ready is w.conn:  # a worker blocked sending a result cannot read its stop
                        _discard(w)
            live = [w for w in live if w.process.exitcode is None]
        for w in live:
            w.process.terminate()
        for w in live:
            w.process.join(1.0)
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join(1.0)
        for w in workers:
            w.conn.close()
            if w.stacks is not None:
                w.stacks.close()
            with contextlib.suppress(ValueError):  # still running after kill: leave it to the OS
                w.process.close()
        if wake is not None:
            for end in wake:
                end.close()
        if ring is not None:
            ring.release()


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """One worker process as the hang watchdog reports it."""

    pid: int
    alive: bool
    exitcode: int | None
    steps: list[int]  # steps sent to it and not answered, in order: the first is being built
    ready: bool = True  # False while it is still starting (spawn, imports, loading the dataset)


def _read_available(conn: connection.Connection, timeout: float, quiet: float) -> bytes:
    """Bytes from a pipe: wait up to ``timeout`` for the first, then until it is quiet for ``quiet`` seconds."""
    chunks: list[bytes] = []
    wait = timeout
    try:
        fd = conn.fileno()
        while connection.wait([conn], wait):
            data = os.read(fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
            wait = quiet
    except (OSError, ValueError):  # closed meanwhile (the pool shut down)
        pass
    return b"".join(chunks)


def _discard(w: _Worker) -> None:
    try:
        while w.conn.poll():
            w.conn.recv()
    except (EOFError, OSError):
        w.eof = True


class _Pass:
    """One pass over steps of an epoch: an iterator of :class:`Loaded` in step order, with ``close``."""

    def __init__(self, pool: ProcessPool, pass_id: int, epoch: int, start: int, steps: Iterable[int]) -> None:
        self.pool = pool
        self.id, self.epoch, self.start = pass_id, epoch, start
        self._steps = iter(steps)
        self.next_step: int | None = next(self._steps, None)
        self.pending: collections.deque[int] = collections.deque()  # submitted, not yet yielded, in order
        self.results: dict[int, tuple] = {}  # step -> (slot, reply)
        self.done = False
        self.ended_by: str | None = None  # why it was ended from outside, if it was

    def advance(self) -> int:
        step, self.next_step = self.next_step, next(self._steps, None)
        return step

    def __iter__(self) -> Iterator[Loaded]:
        return self

    def __next__(self) -> Loaded:
        return self.pool._next(self)

    def close(self) -> None:
        """End the pass: queued tasks are not run, results not taken yet are dropped."""
        self.pool._cancel(self)


class ProcessPool:
    """Builds batches in ``workers`` processes, at most ``depth`` ahead of the consumer.

    ``map(epoch, start, steps)`` returns one pass: the :class:`Loaded` batch of each
    step, in order, where a step's rows are ``order.batch(epoch, step, rank,
    world_size, start)``. One pass runs at a time (a new ``map`` ends the previous
    one). The workers start at construction and are kept across passes; ``close``
    stops them and frees the shared memory (also done on garbage collection and
    at interpreter exit). After a worker died, the next ``map`` starts new ones.
    """

    def __init__(
        self,
        dataset: Dataset,
        order: Order,
        fns: BatchFns,
        rank: int,
        world_size: int,
        *,
        workers: int,
        depth: int,
        start_method: str = "spawn",
    ) -> None:
        check_picklable(fns)
        try:  # a copy of the order without its memo of window permutations
            self._setup = pickle.dumps((dataset, dataclasses.replace(order), fns, rank, world_size), _PROTOCOL)
        except Exception as exc:
            raise ChuteError(f"cannot send the dataset and functions to the worker processes: {exc}. {_GUARD_ADVICE}") from exc
        self.workers = max(1, int(workers))
        self.depth = max(1, int(depth))
        self.rank = rank
        fixed = sum(ctype.row_bytes for _, ctype in dataset.schema if isinstance(ctype, FIXED_SIZE))
        self._first_slot_bytes = _slot_bytes(fixed * order.batch_size + _ALIGN * len(dataset.schema.names))
        self._context = multiprocessing.get_context(start_method)
        self._running = _Running()
        self._finalizer = weakref.finalize(self, self._running.shutdown)
        self._pass_ids = itertools.count(1)
        self._active: _Pass | None = None
        self._closed = False
        self._turn = 0
        self._interrupt: BaseException | None = None  # set by interrupt(), raised by the consumer's wait
        self._buffers = BufferPool(keep=self.depth + 4)  # batches are copied out of the ring into these
        self._start()

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [w.process.pid for w in self._running.workers]

    # ------------------------------------------------------------------ for the hang watchdog (any thread)

    def status(self) -> list[WorkerStatus]:
        """Each worker's pid, whether it is alive, and the steps it has been sent (the first is being built)."""
        out = []
        for w in list(self._running.workers):
            with contextlib.suppress(ValueError):  # closed meanwhile by a shutdown in another thread
                code = w.process.exitcode
                out.append(WorkerStatus(w.process.pid, code is None, code, [task[2] for task in list(w.tasks)], w.ready))
        return out

    def dump_stacks(self, timeout: float = 2.0, quiet: float = 0.2) -> dict[int, str]:
        """The Python stacks of every live worker, as ``faulthandler`` prints them, by pid.

        Sends SIGUSR1 to each worker; its ``faulthandler`` writes the stacks into
        the worker's stack pipe from the signal handler, even if the worker holds
        the GIL. A dump has no end marker: a worker's dump is complete once its
        pipe has been quiet for ``quiet`` seconds after the first bytes (waits
        are blocking waits on the pipe, no sleeps); a worker silent for
        ``timeout`` seconds is left out.
        """
        if _STACK_SIGNAL is None:
            return {}
        asked: list[tuple[int, connection.Connection]] = []
        for w in list(self._running.workers):
            with contextlib.suppress(OSError, ValueError):  # exited, or closed by a shutdown meanwhile
                if w.stacks is None or not w.ready or w.process.exitcode is not None:
                    continue  # not started yet: SIGUSR1 would kill it before faulthandler is set up
                _read_available(w.stacks, 0.0, 0.0)  # a late answer to an earlier request
                os.kill(w.process.pid, _STACK_SIGNAL)
                asked.append((w.process.pid, w.stacks))
        return {pid: _read_available(stacks, timeout, quiet).decode("utf-8", "replace") for pid, stacks in asked}

    def interrupt(self, exc: BaseException) -> bool:
        """Make the consumer's wait for the next batch raise ``exc`` (the watchdog's ``on_stall="raise"``).

        The workers are stopped first (one may be stuck for good); iterating
        again starts new ones. False if the pool is not running.
        """
        wake = self._running.wake
        if wake is None or self._active is None:
            return False
        self._interrupt = exc
        try:
            wake[1].send_bytes(b"!")
        except OSError:
            return False
        return True

    def map(self, epoch: int, start: int, steps: Iterable[int]) -> _Pass:
        """The batches of ``steps`` of ``epoch`` (counted from position ``start``), in order."""
        if self._closed:
            raise ChuteError("this process pool is closed (Loader.close() was called); create a new Loader")
        if self._active is not None:
            self._cancel(self._active, ended_by="a newer pass over the same loader")
        if not self._running.started:
            self._start()
        current = self._active = _Pass(self, next(self._pass_ids), epoch, start, steps)
        return current

    def close(self) -> None:
        """Stop the workers and unlink the shared memory. The pool cannot be used after."""
        self._closed = True
        if self._active is not None:
            self._active.done = True
            self._active.ended_by = "close()"
            self._active = None
        self._finalizer()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _start(self) -> None:
        self._running.start(self._context, self._setup, self.workers, self.depth, self._first_slot_bytes, f"chute-worker-r{self.rank}")

    def _next(self, current: _Pass) -> Loaded:
        if current.ended_by is not None:
            raise ChuteError(f"this pass was ended by {current.ended_by}; with workers='processes' one pass runs at a time")
        if current.done:
            raise StopIteration
        try:
            while True:
                self._submit(current)
                if current.pending and current.pending[0] in current.results:
                    break
                if not current.pending and current.next_step is None:
                    self._finish(current)
                    raise StopIteration
                self._receive()
        except (StopIteration, ChuteError):
            raise
        except BaseException:  # Ctrl-C or a broken pipe mid-exchange: the bookkeeping cannot be trusted
            self._break()
            raise
        step = current.pending.popleft()
        slot, reply = current.results.pop(step)
        ring = self._running.ring
        try:
            if reply[0] == "error":
                self._cancel(current)
                raise _decode_exception(reply[1], reply[2])
            _, payload, layout, inline, _ = reply
            batch, rows, skipped, times = _decode(payload, layout, inline, ring.segments[slot], self._buffers)
            return Loaded(batch, rows, skipped, times)
        finally:
            ring.give_back(slot)

    def _submit(self, current: _Pass) -> None:
        """Send tasks while fewer than ``depth`` are in flight and a slot is free."""
        ring = self._running.ring
        while current.next_step is not None and len(current.pending) < self.depth:
            slot = ring.take()
            if slot is None:
                return
            worker = self._pick()
            segment = ring.segments[slot]
            step = current.next_step
            try:
                worker.conn.send(("task", current.id, current.epoch, current.start, step, slot, segment.name, segment.size))
            except OSError:
                ring.give_back(slot)
                raise self._died(worker) from None
            worker.tasks.append((current.id, current.epoch, step, slot))
            current.pending.append(current.advance())

    def _pick(self) -> _Worker:
        """The worker with the fewest outstanding tasks (round-robin among equals)."""
        workers = self._running.workers
        n = len(workers)
        i = min(range(n), key=lambda i: (len(workers[i].tasks), (i - self._turn) % n))
        self._turn = (i + 1) % n
        return workers[i]

    def _receive(self) -> None:
        """Wait for replies (or a worker's death) and file them."""
        workers = self._running.workers
        if not any(w.tasks for w in workers):
            raise AssertionError("chute: waiting for a batch no worker is building (ring slots lost)")
        by_handle: dict[Any, _Worker] = {}
        for w in workers:
            by_handle[w.conn] = by_handle[w.process.sentinel] = w
        wake = self._running.wake
        ready = connection.wait([*by_handle, wake[0]] if wake is not None else list(by_handle))
        if wake is not None and wake[0] in ready:
            while wake[0].poll():
                wake[0].recv_bytes()
            exc, self._interrupt = self._interrupt, None
            if exc is not None:
                self._break()  # a worker may be stuck for good: start afresh on the next pass
                raise exc
            ready = [handle for handle in ready if handle is not wake[0]]
        for handle in ready:
            if handle is by_handle[handle].conn:
                self._drain(by_handle[handle])
        for handle in ready:
            w = by_handle[handle]
            if handle is w.process.sentinel or w.eof:
                self._drain(w)  # what it sent before it died
                raise self._died(w)

    def _drain(self, w: _Worker) -> None:
        try:
            while not w.eof and w.conn.poll():
                self._file(w, w.conn.recv())
        except (EOFError, OSError):
            w.eof = True

    def _file(self, w: _Worker, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            w.ready = True
            return
        if kind == "fatal":
            pid = w.process.pid
            self._break()
            raise ChuteError(f"worker process {pid} could not load the dataset and functions sent to it:\n{message[1]}\n{_GUARD_ADVICE}")
        _, pass_id, step, slot = message[:4]
        w.tasks.popleft()
        ring = self._running.ring
        reply = message[4] if kind == "reply" else None
        if reply is not None and reply[0] == "ok":
            ring.fit(reply[4])
        current = self._active
        if reply is not None and current is not None and current.id == pass_id:
            current.results[step] = (slot, reply)  # the slot is given back once copied out
        else:
            ring.give_back(slot)  # cancelled, or a reply to a pass that has ended

    def _died(self, w: _Worker) -> ChuteError:
        """Stop everything and describe the death of worker ``w``."""
        w.process.join(5.0)
        pid, code = w.process.pid, w.process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how += f" (killed by {signal.Signals(-code).name})"
        if not w.ready:
            doing = "while starting"
        elif w.tasks:
            _, epoch, step, _ = w.tasks[0]
            doing = f"while building step {step} of epoch {epoch}"
        else:
            doing = "while idle"
        hint = "The machine may be out of memory (see `dmesg` for the OOM killer), or a transform crashed the interpreter"
        if code == -signal.SIGBUS:
            hint = "/dev/shm is probably full (in docker: --shm-size)"
        elif not w.ready:
            hint = _GUARD_ADVICE
        self._break()
        return ChuteError(
            f"chute worker process {pid} died with {how} {doing}. {hint}. "
            "The other workers were stopped; iterating again starts new ones"
        )

    def _break(self) -> None:
        """Stop the workers and free the ring after a failure; the next ``map`` starts afresh."""
        if self._active is not None:
            self._active.done = True
            self._active = None
        self._running.shutdown()

    def _finish(self, current: _Pass) -> None:
        current.done = True
        if self._active is current:
            self._active = None

    def _cancel(self, current: _Pass, ended_by: str | None = None) -> None:
        if current.done:
            return
        self._finish(current)
        current.ended_by = ended_by
        ring = self._running.ring
        for slot, _ in current.results.values():
            ring.give_back(slot)
        current.results.clear()
        current.pending.clear()
        for w in self._running.workers:
            if any(task[0] == current.id for task in w.tasks):
                with contextlib.suppress(OSError):
                    w.conn.send(("cancel", current.id))
