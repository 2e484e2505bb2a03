"""The storage side's rule for a batch built in another process: this process holds its shards before it is sent.

A worker process reads a remote dataset's shards under this process's holds
and lease (``share.py``). Sent any earlier, a worker reading a shard the
downloader has not reached would download it outside the lease and, in a
cache filled to its limit by that lease, wait for room that only the loop's
progress frees, while the loop waits for that batch. The executor that sends
steps to worker processes (``chute.pipeline.processes``) asks :meth:`StepGate.wait`
before it sends each one, in order; the time it waited is the storage's, and the
executor counts it as the gather's wait for its input, as a worker thread's wait
for the same shards is counted (``chute.pipeline.gather.ShardWait``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


class StepGate:
    """Holds, in this process, the shards of each step before it goes to a worker process.

    ``holder`` is the pass's downloader (``Fetcher``, or a progressive epoch's
    ``EpochHolds``): ``wait(step, shards)`` and ``stop_waits()``; ``shards_of(rows)``
    names the shards a step's rows read.
    """

    def __init__(self, holder: Any, shards_of: Callable[[Any], Iterable[int]]) -> None:
        self.holder, self.shards_of = holder, shards_of

    def wait(self, step: int, rows: Any) -> int:
        """Block until this process holds the shards that ``rows`` (those of ``step``) read; the nanoseconds
        waited. Raises the download's error, or a ``ChuteError`` once :meth:`stop_waits` was called."""
        began = time.perf_counter_ns()
        self.holder.wait(step, self.shards_of(rows))
        return time.perf_counter_ns() - began

    def stop_waits(self) -> None:
        """The pass ends: a wait in progress, and every later one, gives up."""
        self.holder.stop_waits()
