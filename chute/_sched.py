"""The scheduling class of chute's own threads: batch work, which never preempts the training loop when it wakes.

A worker thread wakes when the loop takes a batch (the loop submits the next
step). Linux places a woken thread on the waker's CPU and lets it preempt the
thread running there: the training loop, which holds the GIL, so the worker
runs only long enough to find the GIL taken and sleep again, and the loop
pays two context switches and a cold cache for nothing, on every batch.
Under ``SCHED_BATCH`` a thread is scheduled as before and gets the same share
of the CPU under contention, but its wake-up never preempts a running thread:
it runs on an idle CPU at once, or when the running thread's time slice ends.
A thread in the batch class also asks for a long time slice
(:data:`SLICE_NS`; honoured from Linux 6.12, whose scheduler, EEVDF, picks
the eligible thread whose slice ends first): the loop, which wakes with the
default slice after each step, is then picked before a worker waiting for a
CPU and takes the CPU from a worker that is running, where with equal slices
it waited for one or two of theirs; the workers' share of the CPU is the
same. That is the right class for work done ahead of need, as long as the work
computes: a thread whose tasks mostly wait (a transform that reads a file or
a socket sample by sample) wakes many times per task, and on a machine whose
CPUs are all busy each of those wake-ups would wait for a time slice to end.
:class:`Adaptive` keeps a worker thread in the batch class while its tasks
compute and moves it back to the default class while they mostly wait, many
times per task (a wait for the GIL, once or twice a task, does not count: a
woken thread that preempts the loop only to wait for the GIL is what the
batch class avoids). No privilege is needed to move a thread between the
two (``chute._native.thread_class``, which keeps the thread's nice value; the
standard library's call where the extension is missing, without the slice).
Elsewhere (macOS, Windows) nothing changes.

``CHUTE_THREAD_POLICY=normal`` in the environment keeps chute's threads in
the default class (to compare, or where a scheduler treats the class
differently).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

_BATCH = getattr(os, "SCHED_BATCH", None)
_OTHER = getattr(os, "SCHED_OTHER", 0)
_ENABLED = _BATCH is not None and os.environ.get("CHUTE_THREAD_POLICY", "batch") != "normal"

#: The time slice a thread in the batch class asks for (Linux 6.12+; the default is about 1-3 ms). A thread's
#: slice sets how soon after it becomes eligible to run it is picked (its deadline), not its share of the CPU: a
#: waking thread with the default slice (the training loop) is picked first and, from a worker that is running,
#: takes the CPU at once; a worker that runs uncontested is not cut into short slices.
SLICE_NS = 20_000_000

_thread_class: Callable[[int, int], bool] | None
try:
    from chute._native import thread_class as _thread_class
except ImportError:  # a build without the extension
    _thread_class = None

#: Tasks between two looks at how much of a worker's task time was CPU time.
CHECK_EVERY = 8
#: Blocking waits per task beyond which a task that is mostly waiting reads and sleeps (not the GIL).
WAITS = 4


def background() -> bool:
    """Put the calling thread (on Linux: the thread, not the process) in the batch class; whether it is."""
    return _ENABLED and _set(_BATCH)


def _set(policy: int | None) -> bool:
    if _thread_class is not None and policy is not None and _thread_class(policy, SLICE_NS if policy == _BATCH else 0):
        return True
    try:  # the class without the slice (a build without the extension, a sandbox that filters sched_setattr)
        os.sched_setscheduler(0, policy, os.sched_param(0))  # type: ignore[arg-type]
    except (OSError, AttributeError, TypeError):  # a sandbox that forbids it, or a platform without it
        return False
    return True


class Adaptive:
    """A worker thread's class, from what its tasks do: batch while they compute, the default while they mostly wait.

    The thread starts in the batch class. Every :data:`CHECK_EVERY` tasks it
    calls :meth:`check` with the wall time its tasks took: if less than half
    of it was the thread's own CPU time and the thread blocked more than
    :data:`WAITS` times a task (its voluntary context switches), the tasks
    read or sleep and the thread goes back to the default class, whose
    wake-ups preempt; once they compute again, it returns to the batch class.
    ``active`` is False where the class cannot be set (then nobody calls).
    """

    __slots__ = ("active", "batch", "_cpu_ns", "_waits")

    def __init__(self) -> None:
        self.batch = self.active = background()
        self._cpu_ns = time.thread_time_ns()
        self._waits = _waits()

    def check(self, busy_ns: int) -> None:
        """The last :data:`CHECK_EVERY` tasks took ``busy_ns`` of wall time: move the thread if what they do changed."""
        cpu, waits = time.thread_time_ns(), _waits()
        reading = 2 * (cpu - self._cpu_ns) < busy_ns and waits - self._waits > WAITS * CHECK_EVERY
        self._cpu_ns, self._waits = cpu, waits
        if reading == self.batch and _set(_OTHER if reading else _BATCH):
            self.batch = not reading


def _waits() -> int:
    """The calling thread's voluntary context switches so far (Linux; 0 elsewhere)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    except (ImportError, AttributeError, OSError):
        return 0
