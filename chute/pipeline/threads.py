"""The thread executor: fused tasks (``chute.pipeline.task``) on worker threads, results into the pass's channel.

A Loader's worker threads are made once and kept across its passes: each
pass binds them to its task and channel (:meth:`ThreadExecutor.bind`, which
returns the pass's :class:`PassWork`), and ending the pass hands them back
idle (:meth:`PassWork.close`). No thread is started or joined at a pass
boundary, and the count the autotuner reached carries over.

The consumer submits steps (``submit``) at most ``depth`` ahead of what it has
taken; each worker takes the next step from the pass's queue, runs the batch
task and puts the result into the step's slot of the :class:`Channel` (an
exception goes in as a ``Failure``, re-raised by the consumer at that step).
Per batch that is one queue get and one lock release on the worker's side, one
queue put on the consumer's: no ``Future``, no Python-level synchronisation.

A pass's steps are fenced by its own queue and channel: a thread takes steps
from the queue of the pass it joined, and only moves to the next pass once
it has taken that queue's ``_NEXT`` (put there when the pass ends, after its
steps not started were dropped). A step of an ended pass that was still
running when the pass ended finishes into that pass's channel, which is
closed: its result is dropped, never delivered into the next pass. Ending a
pass waits (up to a timeout) until each of its threads has left it; one that
does not (stuck in a task: a stalled pass) is left behind as a daemon, and
exits when its task returns; the next pass starts a fresh thread in its place.

Threads are daemons: a task stuck in a read cannot keep the interpreter from
exiting. They hold no reference to the Loader (only to this executor's shared
state and the pass they run), so the Loader's finalizer stops them
(:meth:`ThreadExecutor.shutdown`) when it is closed, garbage-collected, or at
interpreter exit. The autotuner changes the executor while it runs:
``resize`` starts threads or retires some (a retired thread finishes its task,
then exits) and ``depth`` may change at any time (up to the channel's slots).
Each thread counts its time in tasks, the hand-over of the result included
(``workers`` stage busy: the put lets go of the batches the loop dropped,
``chute._channel``), and waiting for one (``wait_out``: the consumer had not
taken results, so no step was submitted); the time between passes is not
counted.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from chute._channel import Channel, Failure
from chute._sched import CHECK_EVERY, Adaptive

if TYPE_CHECKING:
    from chute.observe.counters import StageCounter
    from chute.pipeline.task import Task

_clock = time.perf_counter_ns  # (a module global: a test gives the threads a clock of its own)

_STOP = -1  # every thread exits (the executor shuts down)
_RETIRE = -2  # the one thread that takes it exits, if the count is still to come down
_NEXT = -3  # the pass ended: the thread that takes it goes to the executor's current pass


class PassWork:
    """One pass as the worker threads see it: its task, its channel, its queue of steps.

    The pass's executor: ``submit(step)`` (the queue's put), ``depth``,
    ``set_depth``, ``resize`` and ``threads`` (the executor's), ``close``;
    ``inline``: the loop builds the steps itself (``chute.pipeline.run.Feed.first``).
    """

    def __init__(self, executor: ThreadExecutor | None, task: Task | None, channel: Channel | None, depth: int) -> None:
        self.executor, self.task, self.channel, self.depth = executor, task, channel, depth
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.submit = self.queue.put  # the consumer's one call per batch
        self.members: list[threading.Thread] = []  # threads that joined this pass
        self.left: queue.SimpleQueue = queue.SimpleQueue()  # each member once it has left the pass
        self.closed = False
        # The loop may build the pass's steps itself (no hand-off to a thread and back; the threads stay bound,
        # idle): ``can_inline`` when it takes the workers' results itself and reads a local dataset, ``inline``
        # while the autotuner says so (docs/observe.md). Switched between steps, by the loop's own thread.
        self.can_inline = False
        self.inline = False

    @property
    def threads(self) -> int:
        """Threads taking tasks (retired ones not counted)."""
        return self.executor.threads if self.executor is not None else 0

    def resize(self, threads: int) -> None:
        if self.executor is not None:
            self.executor.resize(threads)

    def set_depth(self, depth: int) -> None:
        slots = self.channel.slots if self.channel is not None else depth
        self.depth = max(1, min(depth, slots))

    def close(self, timeout: float = 5.0, broken: bool = False) -> list[threading.Thread]:
        """End the pass: steps not started are not run; wait until its threads have left it (at most ``timeout``).

        Returns the threads still in a task of this pass after ``timeout``:
        they are left behind (they exit when their task returns) and the next
        pass starts fresh threads in their places. ``broken`` (a stalled pass) changes nothing
        here: the caller gives a short ``timeout``. Closing again does nothing.
        """
        if self.closed or self.executor is None:
            self.closed = True
            return []
        return self.executor._end(self, timeout)


class _Shared:
    """What the executor and its threads share (the threads hold this, never the executor's owner)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.work = PassWork(None, None, None, 1)  # the pass threads join: idle until a pass binds them
        self.workers: list[threading.Thread] = []  # threads that are to keep working (not retired, not left behind)
        self.excess = 0  # threads still to retire (the count came down; each retires at its next _RETIRE or pass change)
        self.left_behind: set[threading.Thread] = set()  # stuck in a task of an ended pass: exit when it returns
        self.stopped = False


def _leave(shared: _Shared, me: threading.Thread) -> bool:
    """Under the lock: whether ``me`` is to exit now (shut down, left behind, or retired), removed from the workers if so."""
    if shared.stopped or me in shared.left_behind:
        shared.left_behind.discard(me)
        if me in shared.workers:
            shared.workers.remove(me)
        return True
    if shared.excess > 0:
        shared.excess -= 1
        shared.workers.remove(me)
        return True
    return False


def _work(shared: _Shared, stage: StageCounter | None) -> None:
    clock = _clock
    sched = Adaptive()  # batch class while the tasks compute: a woken worker never preempts the loop (chute._sched)
    tasks, tasks_ns = 0, 0
    me = threading.current_thread()
    ident = threading.get_ident()
    cell = stage.cell() if stage is not None else None
    item: Any  # a batch, or the Failure delivered in its place
    while True:
        with shared.lock:
            if _leave(shared, me):
                return
            work = shared.work
            work.members.append(me)
        task = work.task
        get, put = work.queue.get, (work.channel.put if work.channel is not None else None)
        w = task.register(ident) if task is not None else -1
        idle = clock()
        while True:
            step = get()
            if step < 0:
                if step == _RETIRE:
                    with shared.lock:
                        if shared.excess <= 0:
                            continue  # the count went up again meanwhile: stay
                        shared.excess -= 1
                        shared.workers.remove(me)
                    work.left.put(me)
                    return
                break
            start = clock()
            try:
                item, end = task(step, start, w)  # type: ignore[misc]  # (no step is submitted to the idle pass)
            except BaseException as exc:  # delivered to the consumer at its step
                item, end = Failure(exc), clock()
            put(step, item)  # type: ignore[misc]
            item = None  # do not keep the last batch alive while idle
            if sched.active:
                tasks += 1
                tasks_ns += end - start
                if tasks == CHECK_EVERY:
                    sched.check(tasks_ns)
                    tasks, tasks_ns = 0, 0
            if cell is not None:  # the hand-over is work (it frees the batches the loop dropped): idle is only the wait for a step
                end = clock()
                cell.wait_out_ns += start - idle
                cell.busy_ns += end - start
                cell.items += 1
                idle = end
        work.left.put(me)
        work = task = get = put = None  # type: ignore[assignment]  # nothing of the ended pass is kept while idle
        if step == _STOP:
            with shared.lock:
                if me in shared.workers:
                    shared.workers.remove(me)
            return


class ThreadExecutor:
    """Daemon worker threads, kept across passes: :meth:`bind` gives them a pass's ``task`` and ``channel``."""

    def __init__(self, threads: int, depth: int, name: str = "chute-loader", stage: StageCounter | None = None) -> None:
        if threads < 1 or depth < 1:
            raise ValueError(f"threads and depth must be at least 1, got {threads} and {depth}")
        self.name, self.depth = name, depth
        self._stage = stage
        self._shared = _Shared()
        self._pid = os.getpid()
        self._numbers = itertools.count()
        self.resize(threads)

    @property
    def threads(self) -> int:
        """Threads taking tasks (retired ones not counted)."""
        shared = self._shared
        return len(shared.workers) - shared.excess

    @property
    def idents(self) -> list[int | None]:
        """The thread ids of the threads taking tasks."""
        return [t.ident for t in list(self._shared.workers)]

    def bind(self, task: Task, channel: Channel, threads: int | None = None, depth: int | None = None) -> PassWork:
        """The threads work on ``task``'s steps into ``channel`` from now on (the pass before, if any, is ended first)."""
        if depth is not None:
            self.depth = depth
        if self._pid != os.getpid():  # a forked child: it has none of its parent's threads
            threads = threads if threads is not None else max(1, self.threads)
            self._pid, self._shared = os.getpid(), _Shared()
        if threads is not None:
            self.resize(threads)
        work = PassWork(self, task, channel, min(self.depth, channel.slots))
        shared = self._shared
        with shared.lock:
            if shared.stopped:
                raise RuntimeError("this executor was shut down")
            before, shared.work = shared.work, work
            members = len(before.members)
        _drain(before.queue)
        for _ in range(members):
            before.queue.put(_NEXT)
        return work

    def resize(self, threads: int) -> None:
        """Run ``threads`` threads from now on: start new ones, or retire some."""
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        shared = self._shared
        new = []
        with shared.lock:
            if shared.stopped:
                return
            live = len(shared.workers) - shared.excess
            while live < threads and shared.excess:
                shared.excess -= 1  # a retirement not done yet is called off
                live += 1
            if live > threads:
                shared.excess += live - threads
                for _ in range(live - threads):
                    shared.work.queue.put(_RETIRE)
            for _ in range(threads - live):
                thread = threading.Thread(
                    target=_work, args=(shared, self._stage), name=f"{self.name}-{next(self._numbers)}", daemon=True,
                )
                shared.workers.append(thread)
                new.append(thread)
        for thread in new:
            thread.start()
        if self._stage is not None:
            self._stage.workers = threads

    def set_depth(self, depth: int) -> None:
        self.depth = max(1, depth)

    def _end(self, work: PassWork, timeout: float) -> list[threading.Thread]:
        """:meth:`PassWork.close`: the pass's threads go idle; those still busy after ``timeout`` are replaced."""
        shared = self._shared
        with shared.lock:
            if work.closed:
                return []
            work.closed = True
            if shared.work is work:
                shared.work = PassWork(None, None, None, 1)
            members = list(work.members)
        _drain(work.queue)
        for _ in members:
            work.queue.put(_NEXT)
        deadline = time.monotonic() + timeout
        gone: set[threading.Thread] = set()
        while len(gone) < len(members):
            try:
                gone.add(work.left.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        stuck = [t for t in members if t not in gone and t.is_alive()]
        if stuck:  # left behind: they exit when their task returns; the next pass's bind starts fresh ones
            with shared.lock:
                for thread in stuck:
                    shared.left_behind.add(thread)
                    if thread in shared.workers:
                        shared.workers.remove(thread)
        return stuck

    def shutdown(self, timeout: float = 5.0) -> list[threading.Thread]:
        """Stop every thread once its current task is done; return those still busy after ``timeout``."""
        shared = self._shared
        with shared.lock:
            if shared.stopped:
                return []
            shared.stopped = True
            work = shared.work
            everyone = list(shared.workers)
        _drain(work.queue)
        for _ in everyone:
            work.queue.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in everyone:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return [t for t in everyone if t.is_alive()]


def _drain(tasks: queue.SimpleQueue) -> None:
    """Drop what is queued (steps not started: their results would be dropped)."""
    while True:
        try:
            tasks.get_nowait()
        except queue.Empty:
            return
