"""A worker process (``Loader(workers="processes")``): builds batch tasks and returns them through the ring.

Started with ``spawn`` by :class:`chute.pipeline.processes.ProcessPool`. It
receives the dataset (which maps its shards again here), the order and the
user's functions once, then tasks ``(pass, epoch, start, step, slot, segment)``
through its pipe. For each it builds the batch with the same fused task as a
thread worker (``chute.pipeline.task``: order, read, the stages on the
workers), writes its tensors into the ring slot and sends the rest back with
the clock between the stages (``chute.pipeline.wire``). A remote
dataset's shards are read as guests of the main process's holds, and stay
mapped until a ``("drop", shard)`` message says the main process let go.

It ignores SIGINT (the main process decides), exits when the main process
disappears (its pipe reaches EOF), and leaves with ``os._exit`` (the
interpreter's teardown takes over half a second with torch loaded; a worker
has nothing left to release, but ``atexit`` handlers of user code do not run
there). On SIGUSR1, ``faulthandler`` writes the stack of every thread into the
worker's stack pipe, for the hang watchdog in the main process.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing import connection
from typing import Any

import torch

from chute._arena import Arena
from chute._sched import CHECK_EVERY, Adaptive
from chute.errors import ChuteError
from chute.pipeline.indices import BatchIndices
from chute.pipeline.shm import Segment
from chute.pipeline.task import Task
from chute.pipeline.wire import encode, encode_exception

STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # asks a worker for its stacks (the hang watchdog)


def worker_main(conn: connection.Connection, setup: bytes, stacks: connection.Connection | None = None) -> None:
    """A worker process: run batch tasks from ``conn`` until told to stop or the main process goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if stacks is not None and STACK_SIGNAL is not None:
        faulthandler.register(STACK_SIGNAL, file=stacks.fileno(), all_threads=True, chain=False)
    torch.set_num_threads(1)  # workers x intra-op threads would oversubscribe the cores
    try:
        try:
            builder = Builder(*pickle.loads(setup))
        except BaseException:
            conn.send(("fatal", traceback.format_exc()))
            return
        conn.send(("ready",))
        serve(conn, builder)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone
    # Nothing is left to release: skip the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Builder:
    """Builds one step's batch in a worker: the thread workers' fused task, in this process."""

    def __init__(self, dataset: Any, order: Any, chain: Any, rank: int, world_size: int) -> None:
        self.dataset, self.order, self.chain, self.rank, self.world_size = dataset, order, chain, rank, world_size
        self.pool = Arena()  # batches are copied into the ring and dropped: their blocks are reused
        self.stages = chain.worker_stages(dataset, order.seed)
        self._tasks: collections.OrderedDict[tuple[int, int], Task] = collections.OrderedDict()
        # A remote dataset's shards: the main process's downloader holds a batch's shards from before it
        # sends the step until after the reply, so they are read here as guests (no hold of this process),
        # and stay mapped until the main process says it let them go (a "drop" message: see serve).
        # Anything a transform reads itself is held as a direct read, and let go after the batch: held
        # here past it, a shard would keep the downloader from evicting it for the shards of later steps.
        self.cache = getattr(dataset, "cache", None)

    def task(self, epoch: int, start: int) -> Task:
        """The task of the pass over ``epoch`` from ``start`` (the two latest are kept)."""
        key = (epoch, start)
        task = self._tasks.get(key)
        if task is None:
            indices = BatchIndices(self.order, epoch, self.rank, self.world_size, start)
            task = self._tasks[key] = Task(
                indices, self.stages, epoch, self.order.seed, self.pool, dataset=self.dataset, on_error=self.chain.fns.on_error,
            )
            task.register(0)
            if len(self._tasks) > 2:
                self._tasks.popitem(last=False)
        return task

    def let_go(self, shard: int) -> None:
        """The main process let go of ``shard``: unmap it here (see chute/pipeline/processes.py, let_go)."""
        if self.cache is not None:
            self.cache.let_go(shard)

    def __call__(self, epoch: int, start: int, step: int) -> tuple[Any, int, list[int], tuple[list[int], tuple[int, ...]]]:
        """``(batch, rows, skipped, (marks, parts))``: the clock between the task's stages, and the transform's parts."""
        task = self.task(epoch, start)
        cache = self.cache
        reads = contextlib.nullcontext() if cache is None else cache.guest_reads(self.dataset.shards_of(task.indices.rows(step)))
        try:
            with reads:
                (batch, rows, skipped), _ = task(step, time.perf_counter_ns(), 0)
        finally:
            if cache is not None:
                self.dataset.release_direct_holds()
        ctx = task._contexts[0]
        parts, ctx.parts = ctx.parts, ()
        return batch, rows, skipped, (task.marks[0], parts)


def serve(conn: connection.Connection, builder: Builder) -> None:
    segments: dict[int, Segment] = {}
    inbox: collections.deque[tuple] = collections.deque()
    cancelled = 0  # tasks of passes up to this one are not run
    sched = Adaptive()  # batch class while the tasks compute: a woken worker never preempts the loop (chute._sched)
    tasks, tasks_ns = 0, 0
    try:
        while True:
            # Read everything already sent, so a cancel or stop queued behind tasks takes effect now.
            while not inbox or conn.poll():
                message = conn.recv()
                if message is None:
                    return
                if message[0] == "cancel":
                    cancelled = max(cancelled, message[1])
                elif message[0] == "drop":  # the main process let go of a shard read here as a guest
                    builder.let_go(message[1])
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
                segment = segments[slot] = Segment(name, size, create=False)
            began = time.perf_counter_ns()
            reply = run(builder, epoch, start, step, segment)
            conn.send(("reply", pass_id, step, slot, reply))
            del reply
            if sched.active:
                tasks += 1
                tasks_ns += time.perf_counter_ns() - began
                if tasks == CHECK_EVERY:
                    sched.check(tasks_ns)
                    tasks, tasks_ns = 0, 0
    finally:
        for segment in segments.values():
            segment.close(unlink=False)


def run(builder: Builder, epoch: int, start: int, step: int, segment: Segment | None) -> tuple:
    """``("ok", payload, layout, inline, need)`` or ``("error", chain, traceback text)`` for one batch."""
    try:
        built = builder(epoch, start, step)
        try:
            return ("ok", *encode(built, segment))
        except Exception as exc:
            raise ChuteError(
                f"the batch of step {step} (epoch {epoch}) cannot be sent back from the worker process "
                f"({type(exc).__name__}: {exc}); with workers='processes' a batch must be picklable: "
                "tensors, numbers, str, bytes and lists, tuples and dicts of them"
            ) from exc
    except Exception as exc:
        return ("error", *encode_exception(exc))
