"""Worker processes for transforms that hold the GIL: ``Loader(workers=chute.Workers("processes"))``.

Threads are chute's default (the gather and decoding run in native code
that releases the GIL). A per-sample
transform written in pure Python holds it, so for those the batch tasks run in
worker processes (``chute.pipeline.worker``) instead. The unit of work is
still one whole batch::

    training loop          receiver thread (main process)                 worker i (spawned)
    ─────────────          ──────────────────────────────                 ──────────────────
    submit(step) ──────►   ("task", pass, step, slot, segment) ─pipe i─►  build the batch (the fused
                                                                          task: order, read, the worker stages)
                                                                          tensor bytes ──► ring slot
                           ◄─pipe i─ ("reply", pass, step, slot, batch without its tensor data)
                           copy the tensors out of the slot into the Loader's blocks, free the slot
    channel.take(step) ◄── channel.put(step, batch)

The results reach the training loop through the same in-order
:class:`chute._channel.Channel` as the thread workers'. The pool's receiver
thread (``chute-procs-r<rank>``) sends a pass's tasks (at most ``depth`` in
flight, each to the worker with the fewest outstanding tasks, only while a
ring slot is free) and files the replies; it waits on the pipes, the process
sentinels and a wake-up pipe at once, so a worker that dies is reported (pid,
exit code, step) instead of hanging, and the loop's ``submit`` and ``close``
wake it.

A remote dataset's shards are downloaded and held by this process. The
pool's gate thread (``chute-procs-g<rank>``) passes a submitted step on to the
receiver only once the downloader holds its shards; a worker reads them as a
guest of that hold (no lock or lease of its own) and keeps them mapped across
batches until this process lets go of one: then every worker is sent
``("drop", shard)`` and unmaps it.

Like the workers, both threads are started once and kept across passes
(:class:`_Kept`): a pass hands each its loop as a job and, when it ends, waits
until the job has returned (as the thread executor's passes do), so no thread
is started or joined at a pass boundary. They hold no pass between jobs and
never the pool itself, so a pool (a Loader) dropped unclosed is collected and
its finalizer stops them. A forked child's copy of a pool uses and stops
nothing of its parent's (workers, ring, threads, a pass in progress): its next
pass starts workers and threads of its own. One still in its job
when the pass's close gives up (stuck) is left behind, exits once the job
returns, and the next pass starts another.

Every task and reply carries its pass id: ending a pass early sends
``("cancel", pass)``, workers answer queued tasks of that pass with
``"cancelled"`` instead of running them, and replies of old passes only free
their slots. An exception in a worker comes back with its traceback
(``chute.pipeline.wire``) and is raised in the training loop at its step.
A reply also carries the clock between the task's stages, which the receiver
adds to each stage's counter (the runtime measures in the worker, the main
process records).

**Shutdown.** ``close()`` stops the kept threads, sends every worker a stop, lets idle ones exit, then
terminates and kills the rest after a short grace period, closes the pipes and
sentinels and unlinks the segments. The same runs when the pool is garbage
collected and at interpreter exit (``weakref.finalize``), when a worker dies,
and when the hang watchdog raises (a worker may be stuck for good); iterating
again then starts new workers. If the main process itself is killed, no Python
code runs: the workers exit on EOF and multiprocessing's resource tracker
unlinks the segments.

Workers are started with ``spawn`` (``fork`` is unsafe with threads and
torch): the dataset pickles as its manifest and maps its shards lazily in the
worker, and the user's functions must be picklable, i.e. defined at module level.
Tensors come back contiguous and as separate storages; sparse, quantized,
nested, ``requires_grad`` and empty tensors are pickled through the pipe.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import weakref
from multiprocessing import connection, resource_tracker
from typing import Any

from chute._channel import Failure
from chute._sched import background
from chute.errors import ChuteError
from chute.format.schema import FIXED_SIZE
from chute.pipeline.kept import Kept
from chute.pipeline.shm import ALIGN, Ring, slot_bytes
from chute.pipeline.wire import PROTOCOL as _PROTOCOL, decode, decode_exception
from chute.pipeline.worker import STACK_SIGNAL as _STACK_SIGNAL, worker_main

log = logging.getLogger("chute")

_STOP_GRACE = 1.0  # seconds a stopped worker gets to exit on its own before it is terminated
#: Pseudo thread id of the spans worker processes report, in the trace.
WORKER_PROCESSES_TID = 1

_GUARD_ADVICE = (
    "With workers='processes' the transform, batch_transform, collate and the stages on the workers are sent to "
    "worker processes started with spawn: each function must be a module-level function (not a lambda, a nested "
    "function or a closure) in a module the workers can import, and a script must start the loader under "
    "`if __name__ == \"__main__\":` (spawn imports the main module again in every worker)"
)


def check_picklable(fns: Any, stages: Any = ()) -> None:
    """Raise a :class:`ChuteError` saying what to do if a user function or stage cannot go to a worker process."""
    named = [(role, getattr(fns, role)) for role in ("transform", "batch_transform", "collate")]
    named += [(f"stage {stage.name!r}", stage) for stage in stages if stage.name != "batch_transform"]
    for role, fn in named:
        if fn is None:
            continue
        try:
            pickle.dumps(fn, _PROTOCOL)
        except Exception as exc:
            what = role if role.startswith("stage") else f"{role} {getattr(fn, '__qualname__', None) or repr(fn)}"
            raise ChuteError(f"cannot send the {what} to the worker processes ({type(exc).__name__}: {exc}). {_GUARD_ADVICE}") from exc


class _Worker:
    """The main process's handle on one worker: process, pipe and the tasks it has not answered."""

    __slots__ = ("process", "pid", "conn", "tasks", "ready", "eof", "stacks")

    def __init__(
        self, process: multiprocessing.process.BaseProcess, conn: connection.Connection, stacks: connection.Connection | None = None
    ) -> None:
        pid = process.pid
        assert pid is not None, "the process is started"
        self.process = process
        self.pid = pid
        self.conn = conn
        self.stacks = stacks  # read end of the worker's stack-dump pipe
        self.tasks: collections.deque[tuple[int, int, int, int]] = collections.deque()  # (pass, epoch, step, slot)
        self.ready = False
        self.eof = False


class _Running:
    """The running workers and the ring: everything :meth:`shutdown` must release.

    Holds no reference to the pool, so the pool's finalizer can call ``shutdown``.
    """

    def __init__(self, cache: Any = None) -> None:
        self.workers: list[_Worker] = []
        self.ring: Ring | None = None
        self.cache = cache  # a remote dataset's node cache: the workers read its shards as guests
        self.sending = threading.Lock()  # one message at a time on the workers' pipes (tasks, drops, stops)

    @property
    def started(self) -> bool:
        return self.ring is not None

    def start(self, context: Any, setup: bytes, workers: int, slots: int, slot_bytes: int, name: str) -> None:
        # Workers register the segments they attach with the tracker they inherit: make it this
        # process's (spawn passes it on anyway; a forked worker would otherwise start its own,
        # which reports the segments as leaked when the worker exits).
        resource_tracker.ensure_running()
        self.ring = Ring(slots, slot_bytes)
        try:
            for i in range(workers):
                parent, child = context.Pipe(duplex=True)
                stacks_in, stacks_out = context.Pipe(duplex=False)
                process = context.Process(target=worker_main, args=(child, setup, stacks_out), name=f"{name}-{i}", daemon=True)
                try:
                    process.start()
                finally:
                    child.close()
                    stacks_out.close()
                self.workers.append(_Worker(process, parent, stacks_in))
        except BaseException:
            self.shutdown()
            raise
        if self.cache is not None:
            self.cache.unpin_listeners.append(self.let_go)

    def let_go(self, shard: int) -> None:
        """This process let go of ``shard`` (its last hold): the workers unmap their guest mapping of it.

        A worker reads a batch's shards as a guest of this process's holds
        (``ShardCache.guest_reads``) and keeps them mapped across batches until
        told: so consecutive batches of one shuffle window map nothing again,
        and no worker keeps a mapping of a file the cache may evict. The message
        reaches an idle worker at once, a busy one after its batch (whose shards
        are held here until its reply).
        """
        with self.sending:
            for w in self.workers:
                with contextlib.suppress(OSError, ValueError):  # died, or shut down meanwhile
                    w.conn.send(("drop", shard))

    def shutdown(self, grace: float = _STOP_GRACE) -> None:
        """Stop the workers (ask, then terminate, then kill), close their pipes, unlink the ring."""
        if self.cache is not None:
            with contextlib.suppress(ValueError):
                self.cache.unpin_listeners.remove(self.let_go)
        # (a send blocked on a worker that reads no more, stuck in a transform, must not block the shutdown:
        # without the lock the workers get no stop message, and are terminated after the grace period)
        polite = self.sending.acquire(timeout=grace)
        try:
            workers, self.workers = self.workers, []
            for w in workers if polite else ():
                with contextlib.suppress(OSError):
                    w.conn.send(None)
        finally:
            if polite:
                self.sending.release()
        ring, self.ring = self.ring, None
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


class _Kept(Kept):
    """A daemon thread of the pool kept across its passes (``chute.pipeline.kept``): a pass's receiver or gate loop.

    Between jobs it holds nothing of a pass or of the pool (a pool dropped
    between passes is collected, and its finalizer stops the thread). The
    receiver's wake-up pipe is kept with it: the loop's ``submit`` and a pass's
    ``close`` write to it; it is closed when the pool stops the thread, or when
    this object is collected (a pass's executor holds it: no write can reach a
    closed descriptor's number while one may still write). A thread whose job
    does not end when its pass closes (stuck) is left behind: it exits once that
    job returns, and the pool starts another for the next pass.
    """

    def __init__(self, name: str, wake: bool = False) -> None:
        super().__init__(name)
        self.wake = os.pipe() if wake else None  # only the receiver waits on a pipe
        self.close_pipe = weakref.finalize(self, _close_fds, *(self.wake or ()))

    def stop(self, timeout: float | None = None) -> bool:
        """The thread exits once its job (if any) has returned (woken from its pipe); with ``timeout``, wait for it."""
        self.jobs.put(None)
        if self.wake is not None:
            with contextlib.suppress(OSError):
                os.write(self.wake[1], b"!")
        return super().stop(timeout)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _stop_all(running: _Running, kept: dict[str, _Kept], pid: int) -> None:
    """The pool's finalizer: stop its kept threads and its workers, free the ring (in the process that started
    them: a forked child's copy of a pool is its parent's, which it must not stop)."""
    if os.getpid() != pid:
        return
    stopping = list(kept.values())
    kept.clear()
    for k in stopping:
        k.stop()
    running.shutdown()
    for k in stopping:
        if k.thread is not threading.current_thread():
            k.thread.join(1.0)
        if not k.thread.is_alive():
            k.close_pipe()


def _discard(w: _Worker) -> None:
    try:
        while w.conn.poll():
            w.conn.recv()
    except (EOFError, OSError):
        w.eof = True


class _PassRun:
    """The process pool's side of one pass: the steps it owes the channel, the jobs of the pool's kept receiver
    thread (:meth:`_pump`) and, for a remote dataset, gate thread (:meth:`_gate`) while the pass runs."""

    can_inline = inline = False  # the steps are built in the worker processes, never in the loop (see threads.PassWork)

    def __init__(self, pool: ProcessPool, run: Any, pass_id: int) -> None:
        self.pool, self.id = pool, pass_id  # (not the run itself: its finalizer holds this object)
        self.epoch, self.start = run.epoch, run.start
        self.channel = run.channel
        self.depth = pool.depth
        self.threads = pool.workers
        self.gated: collections.deque[int] = collections.deque()  # submitted, waiting for their shards (see _gate)
        self.queued: collections.deque[int] = collections.deque()  # ready to send, not sent yet
        self.sent: set[int] = set()  # sent to a worker, no reply filed yet
        self.stopped = False  # the receiver is to stop (closed or failed)
        self.closed = False
        self.failure: BaseException | None = None  # what ended the pass; every step owed or submitted later raises it
        self._lock = threading.Lock()  # submit vs fail: no step may fall between them
        self._cond = threading.Condition(self._lock)  # the gate waits on it for steps
        self._waking = False  # a wake-up written that the receiver has not woken to yet
        self._pid = os.getpid()
        self._cells: tuple[Any, ...] | None = None  # a counter cell per stage of the task (the receiver thread's)
        self._order: Any = None  # the root's
        # A remote dataset's shards: a step goes to a worker only once this process holds them (the storage
        # side's rule, chute.storage.node.gate; the worker reads them under this hold). The gate thread waits.
        self.hold: Any = None
        self.gate: _Kept | None = None
        if run.fetcher is not None:
            from chute.pipeline.gather import gather_name
            from chute.storage.node.gate import StepGate

            self.hold = StepGate(run.fetcher, run.dataset.shards_of)
            self._steps = run.indices
            self._waits_in = gather_name(run.dataset)  # the stage whose wait for its input the gate's wait is
            self.gate = pool._kept_thread("g")
        self.receiver = pool._kept_thread("r")
        assert self.receiver.wake is not None
        self._wake_r, self._wake_w = self.receiver.wake
        if self.gate is not None:
            self.gate.run(self._gate)
        self.receiver.run(self._pump)

    # ------------------------------------------------------------------ the training loop's side

    def submit(self, step: int) -> None:
        with self._lock:
            if self.failure is not None:
                self.channel.put(step, Failure(self.failure))
                return
            if self.gate is not None:
                self.gated.append(step)
                self._cond.notify()
                return
            self.queued.append(step)
        self._wake()

    def _wake(self) -> None:
        """Wake the receiver thread (a step to send, or the pass ends).

        One write until the receiver has woken: the steps a pass submits at its
        start, and those submitted while the receiver is busy, share it (it
        sends every queued step once awake).
        """
        if self._waking or self.closed:  # (the pipe is closed once the pool is)
            return
        self._waking = True
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # closed meanwhile
            pass

    def close(self, timeout: float = 5.0, broken: bool = False) -> list[threading.Thread]:
        """End the pass: queued tasks are not run, results not taken are dropped; ``broken``: stop the workers."""
        if self.closed:
            return []
        with self._lock:
            self.closed = self.stopped = True
        if self._pid != os.getpid():  # a forked child's copy of its parent's pass: its workers and threads are the parent's
            return []
        self._end_gate()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")
        deadline = time.monotonic() + timeout
        pool = self.pool
        stuck = []
        for kept in (self.receiver, self.gate):  # each goes back to waiting for the next pass's job
            if kept is not None and not kept.wait(deadline - time.monotonic()):
                stuck.append(kept.thread)
                pool._leave_behind(kept)
        if broken:
            pool._break()
        else:
            pool._cancel(self)
        if pool._active is self:
            pool._active = None
        return stuck

    # ------------------------------------------------------------------ the receiver thread

    def _pump(self) -> None:
        background()  # woken by the loop's submit: it never preempts the loop (chute._sched)
        pool = self.pool
        try:
            while not self.stopped:
                self._send()
                workers = pool._running.workers
                handles: list[Any] = [self._wake_r]
                by_handle: dict[Any, _Worker] = {}
                for worker in workers:
                    by_handle[worker.process.sentinel] = worker
                    handles.append(worker.process.sentinel)
                    if not worker.eof:
                        by_handle[worker.conn] = worker
                        handles.append(worker.conn)
                ready = connection.wait(handles)
                if self._wake_r in ready:
                    os.read(self._wake_r, 1 << 16)
                    # after the read (which may take a byte written after a clear before it): a step submitted
                    # while the flag is still set is sent by the _send() that follows
                    self._waking = False
                for handle in ready:
                    w = by_handle.get(handle)
                    if w is not None and handle is w.conn:
                        pool._drain(w, self)
                for handle in ready:
                    w = by_handle.get(handle)
                    if w is not None and (handle is w.process.sentinel or w.eof):
                        pool._drain(w, self)  # what it sent before it died
                        raise pool._died(w)
        except BaseException as exc:  # noqa: BLE001 - raised in the training loop at the first step it waits for
            if not self.stopped:
                self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """The pass cannot go on: every step owed to the loop, and every step submitted later, raises ``exc``."""
        with self._lock:
            self.failure = exc
            self.stopped = True
            owed = sorted(self.sent | set(self.queued) | set(self.gated))
            self.sent.clear()
            self.queued.clear()
            self.gated.clear()
        self._end_gate()
        for step in owed:
            self.channel.put(step, Failure(exc))

    # ------------------------------------------------------------------ the gate thread

    def _gate(self) -> None:
        """Move submitted steps, in order, to the receiver once this process holds their shards
        (:class:`chute.storage.node.gate.StepGate`); the wait counts as the gather's wait for its input, as
        a worker thread's does. A step whose shards cannot be had (the download failed) raises at that step
        in the loop, as a thread worker's would.
        """
        background()  # woken by the loop's submit: it never preempts the loop (chute._sched)
        hold, indices = self.hold, self._steps
        counters = self.pool.counters
        cell = counters.stage(self._waits_in, where="workers").cell() if counters is not None else None
        while True:
            with self._cond:
                while not self.gated and not self.stopped:
                    self._cond.wait()
                if self.stopped:
                    return
                step = self.gated[0]
            failure = None
            try:
                rows = indices.rows(step)
                indices.ahead(step)
                waited = hold.wait(step, rows)
                if cell is not None:
                    cell.wait_in_ns += waited
            except BaseException as exc:  # noqa: BLE001 - raised in the training loop at this step
                failure = exc
            with self._lock:
                if self.stopped:
                    return
                self.gated.popleft()
                if failure is None:
                    self.queued.append(step)
            if failure is None:
                self._wake()
            else:
                self.channel.put(step, Failure(failure))

    def _end_gate(self) -> None:
        """The pass ends: the gate stops waiting for shards and for steps."""
        if self.gate is None:
            return
        with self._cond:
            self._cond.notify_all()
        self.hold.stop_waits()

    def _send(self) -> None:
        """Send queued steps while a ring slot is free."""
        pool = self.pool
        ring = pool._running.ring
        assert ring is not None, "the workers run"
        while self.queued:
            slot = ring.take()
            if slot is None:
                return
            step = self.queued.popleft()
            worker = pool._pick()
            segment = ring.segments[slot]
            assert segment is not None, "take() made it"
            try:
                with pool._running.sending:
                    worker.conn.send(("task", self.id, self.epoch, self.start, step, slot, segment.name, segment.size))
            except OSError:
                ring.give_back(slot)
                self.queued.appendleft(step)
                raise pool._died(worker) from None
            worker.tasks.append((self.id, self.epoch, step, slot))
            self.sent.add(step)

    def deliver(self, step: int, slot: int, reply: tuple) -> None:
        """A worker's reply for ``step``: decode it into the Loader's blocks and put it in the channel."""
        ring = self.pool._running.ring
        self.sent.discard(step)
        assert ring is not None, "the workers run"
        try:
            if reply[0] == "error":
                item: Any = Failure(decode_exception(reply[1], reply[2]))
            else:
                _, payload, layout, inline, _ = reply
                batch, rows, skipped, times = decode(payload, layout, inline, ring.segments[slot], self.pool.blocks)
                self._count(step, rows, times)
                item = (batch, rows, skipped)
        finally:
            ring.give_back(slot)
        self.channel.put(step, item)

    def _count(self, step: int, rows: int, times: tuple[list[int], tuple[int, ...]]) -> None:
        """The clock between the task's stages in the worker, into each stage's counter (and the trace)."""
        counters = self.pool.counters
        if counters is None:
            return
        names = self.pool.names
        if self._cells is None:
            for name in ("order", *names):
                counters.stage(name, where="workers").workers = self.threads
            self._cells = tuple(counters.stage(name).cell() for name in names)
            self._order = counters.stage("order").cell()
        marks, parts = times
        self._order.items += rows
        for i, cell in enumerate(self._cells):
            cell.busy_ns += marks[i + 1] - marks[i]
            cell.items += rows
        if parts:
            transform = self._cells[names.index("transform")].parts
            for part, ns in zip(("per_sample", "collate"), parts):
                transform[part] = transform.get(part, 0) + ns
        counters.trace.append(("task", WORKER_PROCESSES_TID, step, rows, names, marks))


class ProcessPool:
    """Builds batches in ``workers`` processes, at most ``depth`` ahead of the training loop.

    ``start_pass(run)`` returns the executor of one pass (``submit``,
    ``close``): the batch of each submitted step arrives in ``run.channel``.
    One pass runs at a time (a new one ends the previous). The workers start at
    construction, the receiver and gate threads at the first pass that needs
    them, and all are kept across passes; ``close`` stops them and frees the
    shared memory (also done on garbage collection and at interpreter exit).
    After a worker died, the next pass starts new ones.
    """

    def __init__(
        self,
        dataset: Any,
        order: Any,
        chain: Any,
        rank: int,
        world_size: int,
        *,
        workers: int,
        depth: int,
        blocks: Any = None,
        counters: Any = None,
        start_method: str = "spawn",
    ) -> None:
        check_picklable(chain.fns, chain.workers)
        self.names = tuple(stage.name for stage in chain.worker_stages(dataset, order.seed))  # the task's stages
        try:  # a copy of the order without its memo of window permutations
            copyable = dataclasses.is_dataclass(order) and not isinstance(order, type)  # an instance, not a class
            order_copy = dataclasses.replace(order) if copyable else order
            self._setup = pickle.dumps((dataset, order_copy, chain, rank, world_size), _PROTOCOL)
        except Exception as exc:
            raise ChuteError(f"cannot send the dataset and functions to the worker processes: {exc}. {_GUARD_ADVICE}") from exc
        self.workers = max(1, int(workers))
        self.depth = max(1, int(depth))
        self.rank = rank
        self.blocks = blocks  # the Loader's block pool: batches are copied out of the ring into these
        self.counters = counters
        fixed = sum(ctype.row_bytes for _, ctype in dataset.schema if isinstance(ctype, FIXED_SIZE))
        self._first_slot_bytes = slot_bytes(fixed * order.batch_size + ALIGN * len(dataset.schema.names))
        self._context = multiprocessing.get_context(start_method)
        self._running = _Running(getattr(dataset, "cache", None))
        self._kept: dict[str, _Kept] = {}  # the receiver ("r") and gate ("g") threads, kept across passes
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _stop_all, self._running, self._kept, self._pid)
        self._pass_ids = itertools.count(1)
        self._active: _PassRun | None = None
        self._closed = False
        self._turn = 0
        self._start()

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [w.pid for w in self._running.workers]

    # ------------------------------------------------------------------ for the hang watchdog (any thread)

    def status(self) -> list[WorkerStatus]:
        """Each worker's pid, whether it is alive, and the steps it has been sent (the first is being built)."""
        out = []
        for w in list(self._running.workers):
            with contextlib.suppress(ValueError):  # closed meanwhile by a shutdown in another thread
                code = w.process.exitcode
                out.append(WorkerStatus(w.pid, code is None, code, [task[2] for task in list(w.tasks)], w.ready))
        return out

    def waiting_for_shards(self) -> list[int]:
        """Steps of the pass in progress that wait until the downloader holds their shards (the gate)."""
        active = self._active
        return [] if active is None else list(active.gated)

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
                os.kill(w.pid, _STACK_SIGNAL)
                asked.append((w.pid, w.stacks))
        return {pid: _read_available(stacks, timeout, quiet).decode("utf-8", "replace") for pid, stacks in asked}

    # ------------------------------------------------------------------ passes

    def start_pass(self, run: Any) -> _PassRun:
        """The executor of ``run``: its submitted steps are built by the workers into ``run.channel``."""
        if self._closed:
            raise ChuteError("this process pool is closed (Loader.close() was called); create a new Loader")
        if self._pid != os.getpid():
            self._forked()
        if self._active is not None:
            self._active.close()
        if not self._running.started:
            self._start()
        self._active = _PassRun(self, run, next(self._pass_ids))
        return self._active

    def close(self) -> None:
        """Stop the workers and unlink the shared memory. The pool cannot be used after."""
        self._closed = True
        if self._active is not None:
            self._active.close(timeout=1.0, broken=True)
        self._finalizer()

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals (the receiver thread)

    def _forked(self) -> None:
        """In a forked child: the workers, ring and threads are the parent's (the child must neither use nor stop
        them: its messages would reach the parent's workers); this pool starts its own."""
        parent = self._running
        if parent.cache is not None:
            with contextlib.suppress(ValueError):
                parent.cache.unpin_listeners.remove(parent.let_go)
        self._finalizer.detach()
        self._pid, self._active, self._kept = os.getpid(), None, {}
        self._running = _Running(parent.cache)
        self._finalizer = weakref.finalize(self, _stop_all, self._running, self._kept, self._pid)

    def _kept_thread(self, kind: str) -> _Kept:
        """The kept receiver (``"r"``) or gate (``"g"``) thread, started on first use (or again in a forked child,
        which has none of its parent's threads, and after one was left behind)."""
        kept = self._kept.get(kind)
        if kept is None or not kept.thread.is_alive():
            kept = self._kept[kind] = _Kept(f"chute-procs-{kind}{self.rank}", wake=kind == "r")
        return kept

    def _leave_behind(self, kept: _Kept) -> None:
        """A kept thread still in the job of a pass that has closed: it exits when that job returns."""
        for kind, k in list(self._kept.items()):
            if k is kept:
                del self._kept[kind]
        kept.stop()

    def _start(self) -> None:
        self._running.start(self._context, self._setup, self.workers, self.depth, self._first_slot_bytes, f"chute-worker-r{self.rank}")

    def _pick(self) -> _Worker:
        """The worker with the fewest outstanding tasks (round-robin among equals)."""
        workers = self._running.workers
        n = len(workers)
        i = min(range(n), key=lambda i: (len(workers[i].tasks), (i - self._turn) % n))
        self._turn = (i + 1) % n
        return workers[i]

    def _drain(self, w: _Worker, current: _PassRun) -> None:
        try:
            while not w.eof and w.conn.poll():
                self._file(w, w.conn.recv(), current)
        except (EOFError, OSError):
            w.eof = True

    def _file(self, w: _Worker, message: tuple, current: _PassRun) -> None:
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
        assert ring is not None, "the workers run"
        reply = message[4] if kind == "reply" else None
        if reply is not None and reply[0] == "ok":
            ring.fit(reply[4])
        if reply is not None and current.id == pass_id and not current.stopped:
            current.deliver(step, slot, reply)
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
        """Stop the workers and free the ring after a failure; the next pass starts afresh."""
        self._running.shutdown()

    def _cancel(self, current: _PassRun) -> None:
        """Tell the workers to skip what they still have of ``current``; its replies will only free slots."""
        for w in self._running.workers:
            if any(task[0] == current.id for task in w.tasks):
                with contextlib.suppress(OSError), self._running.sending:
                    w.conn.send(("cancel", current.id))
