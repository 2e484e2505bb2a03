"""Threads a Loader keeps across its passes: the stages on threads of their own (the device copy among them).

A pass used to start a thread per such stage and join it at its end; a short
pass (a validation set, a small dataset) paid that at every start. Now the
Loader keeps one daemon thread per stage (:class:`KeptThreads`, by the
relay's place and name) and a pass hands it its relay loop as a job
(:meth:`Kept.run`), then waits at its end for that job to return
(:meth:`Kept.wait`):

* between jobs a thread holds nothing of a pass or of the Loader (the job is
  dropped once it returns), so a Loader dropped unclosed is collected, and its
  finalizer stops the threads;
* a thread whose job does not return when its pass closes (stuck in a user's
  stage) is left behind by the next pass (:meth:`KeptThreads.get`): it exits
  once that job returns, and that pass gets a new thread of that name;
* in a forked child none of the parent's threads run: the child starts its own
  at its first pass, and waits for none of the parent's jobs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

log = logging.getLogger("chute")


class Kept:
    """A daemon thread named ``name`` that runs one job at a time, in the order given."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.returns = _Returns()
        self.given = 0  # jobs handed to the thread; it has returned from ``returns.count`` of them
        # (the thread holds the queue and the tally, never this object)
        self.thread = threading.Thread(target=_serve, args=(self.jobs, self.returns), name=name, daemon=True)
        self.thread.start()

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` next (after the job before it has returned)."""
        self.given += 1
        self.jobs.put(job)

    def wait(self, timeout: float) -> bool:
        """Whether every job given so far has returned, waiting at most ``timeout`` seconds."""
        if self.thread is threading.current_thread() or not self.thread.is_alive():
            return True  # (a job closing its own pass; a forked child's copy of its parent's thread: no job runs here)
        return self.returns.reach(self.given, max(0.0, timeout))

    def stop(self, timeout: float | None = None) -> bool:
        """The thread exits once its job (if any) has returned; with ``timeout``, wait for it: whether it has exited."""
        self.jobs.put(None)
        if timeout is None or self.thread is threading.current_thread():
            return False
        self.thread.join(timeout)
        return not self.thread.is_alive()


class _Returns:
    """How many jobs a kept thread has returned from, and a wait for a number of them."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def add(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def reach(self, count: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, timeout)


def _serve(jobs: queue.SimpleQueue[Callable[[], None] | None], returns: _Returns) -> None:
    """A kept thread's body: run each job until the ``None`` that stops it (a job sets its own scheduling class)."""
    while (job := jobs.get()) is not None:
        try:
            job()
        except BaseException:  # noqa: BLE001 - a job reports its own failures (to its pass); the thread stays
            log.exception("chute: a job of the kept thread %s failed", threading.current_thread().name)
        job = None  # nothing of the pass is kept while idle
        returns.add()


class KeptThreads:
    """A Loader's kept threads, one per key (a relay's place in the pass and its thread's name; ``"order"``)."""

    def __init__(self) -> None:
        self._threads: dict[str, Kept] = {}
        self._lock = threading.Lock()  # later() is called from any thread
        self._stopped = False

    def get(self, key: str, name: str) -> Kept:
        """The thread for ``key``, started on first use, or again: in a forked child (the parent's is not
        running there), or when the one there is still in a job of a pass that has closed (stuck): that one
        is left behind and exits once its job returns."""
        kept = self._threads.get(key)
        if kept is not None and kept.thread.is_alive() and kept.returns.count < kept.given:
            kept.stop()
            kept = None
        if kept is None or not kept.thread.is_alive():
            kept = self._threads[key] = Kept(name)
        return kept

    def later(self, key: str, name: str, job: Callable[[], None]) -> bool:
        """Queue ``job`` on the thread for ``key`` (started on first use, or again in a forked child), after the
        jobs given to it before; nobody waits for it. False once the threads are stopped (``job`` is not run)."""
        with self._lock:
            if self._stopped:
                return False
            kept = self._threads.get(key)
            if kept is None or not kept.thread.is_alive():
                kept = self._threads[key] = Kept(name)
            kept.run(job)
        return True

    def stop(self, timeout: float = 5.0) -> list[threading.Thread]:
        """Stop every thread (each once its job has returned) and wait up to ``timeout`` s in all; those still running."""
        with self._lock:
            self._stopped = True
            stopping = [k.thread for k in self._threads.values()]
            for kept in self._threads.values():
                kept.stop()
            self._threads.clear()
        deadline = time.monotonic() + timeout
        stuck = []
        for thread in stopping:
            if thread is threading.current_thread():  # (a finalizer run by the collector in that thread)
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread)
        return stuck
