"""The scheduling class of chute's own threads: batch work, which never preempts the training loop when it wakes.

A worker thread wakes when the loop takes a batch (the loop submits the next
step). Linux places a woken thread on the waker's CPU and lets it preempt the
thread running there: the training loop, which holds the GIL, so the worker
runs only long enough to find the GIL taken and sleep again, and the loop
pays two context switches and a cold cache for nothing, on every batch.
Under ``SCHED_BATCH`` a thread is scheduled as before and gets the same share
of the CPU under contention, but its wake-up never preempts a running thread:
it runs on an idle CPU at once, or when the running thread's time slice ends.
That is the right class for work that is done ahead of need (building
batches, copying them, downloading shards): no thread of chute waits for
latency, the prefetch depth covers it. No privilege is needed to lower a
thread to it. Elsewhere (macOS, Windows) nothing changes.

``CHUTE_THREAD_POLICY=normal`` in the environment keeps chute's threads in
the default class (to compare, or where a scheduler treats the class
differently).
"""

from __future__ import annotations

import os

_BATCH = getattr(os, "SCHED_BATCH", None)
_ENABLED = _BATCH is not None and os.environ.get("CHUTE_THREAD_POLICY", "batch") != "normal"


def background() -> bool:
    """Put the calling thread (on Linux: the thread, not the process) in the batch class; whether it is."""
    if not _ENABLED:
        return False
    try:
        os.sched_setscheduler(0, _BATCH, os.sched_param(0))  # type: ignore[arg-type]
    except (OSError, AttributeError):  # a sandbox that forbids it, or a platform without it
        return False
    return True
