"""The root stage: the global position, and which rows each batch of a pass holds.

:class:`Indices` is the root of every Loader's chain (``order`` in the
report). It owns the position in the global ``chute.order.Order`` that the
training loop has received: the epoch and ``consumed``, so a Loader's state is
a few numbers and resumes on any number of workers or ranks. Its state is the
Loader's ``state_dict()`` (a stage of one's own after it nests it in its own).

:class:`BatchIndices` is one pass's table of rows, a thin layer over the
order: the rows of a *chunk* of steps (about
one shuffle window of rows) are computed at once with :meth:`Order.steps`
(one slice of the global order, one native grouping by shard), the next chunk
is computed when the second step of the current one starts being read, and a
batch's indices are then a row of the chunk: a list lookup, no Python call.
The first step of a pass is computed alone (its chunk comes with the step
after it): the first batch waits only for its own rows. The values are
exactly ``order.batch(epoch, step, rank, world_size, start)``.

A chunk takes milliseconds on a large dataset (a window's permutation and the
grouping by shard: docs/benchmarks.md, "What bounds W2"), and whoever computes
it holds up the pass: the loop's thread on native gather threads, a worker on
the others.
So the chunks after the first are computed on a thread the Loader keeps for
this (``chute-order-r<rank>``, given as ``later``), and once the pass's last
chunk starts being read, that thread computes the next epoch's first chunk too
(:meth:`Order.prepare`), which the pass after this one, if it starts that epoch
from its start, takes instead of computing it at its start.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from chute._state import check_state
from chute.errors import ChuteError
from chute.order import Order
from chute.pipeline.lifecycle import Event, holds_position
from chute.pipeline.stage import Stage

#: Rows per chunk of steps (the chunk is rounded to whole steps, at least one).
CHUNK_ROWS = 1 << 17


class BatchIndices:
    """The rows of every step of one pass (``order``, ``epoch``, this rank, from position ``start``).

    ``chunks[step // per_chunk][step % per_chunk]`` holds the rows of a full
    step once its chunk is computed (``None`` before: call :meth:`rows`). Any
    thread may call :meth:`rows` and :meth:`ahead`; a chunk is computed once.
    """

    def __init__(
        self, order: Order, epoch: int, rank: int, world_size: int, start: int, later: Callable[[Callable[[], None]], bool] | None = None,
    ) -> None:
        self.order, self.epoch, self.rank, self.world_size, self.start = order, epoch, rank, world_size, start
        self.steps = order.num_batches(world_size, start)
        self.full = order.full_steps(world_size, start)
        self.per_chunk = max(1, CHUNK_ROWS // (order.batch_size * world_size))
        self.chunks: list[np.ndarray | None] = [None] * (-(-self.full // self.per_chunk) + 1)  # + the last, partial step
        self._lock = threading.Lock()
        self._later = later  # runs a job on the Loader's order thread (False: it is stopped); None: no such thread
        prepared = getattr(order, "prepared", None)  # (an Order's: a mixture's order changes with its weights)
        if prepared is not None and self.full:  # computed during the pass before, if that ran the epoch before
            self.chunks[0] = prepared(epoch, 0, min(self.per_chunk, self.full), rank, world_size, start)

    def rows(self, step: int) -> np.ndarray:
        """The rows of ``step`` (computing its chunk if needed)."""
        if step >= self.full:
            if not 0 <= step < self.steps:
                raise IndexError(f"step {step} is outside the {self.steps} batches of this pass")
            return self.order.batch(self.epoch, step, self.rank, self.world_size, self.start)
        k = step // self.per_chunk
        chunk = self.chunks[k]
        if chunk is None:
            if step == 0 and self.per_chunk > 1:  # the first batch: its rows alone, the chunk comes later
                return self.order.steps(self.epoch, 0, 1, self.rank, self.world_size, self.start)[0]
            chunk = self._compute(k)
        return chunk[step - k * self.per_chunk]

    def ahead(self, step: int) -> None:
        """``step`` starts being read: compute the next chunk if ``step`` is the second of one, and drop one long done.

        (Not at a chunk's first step: a pass's first batch would wait for the next chunk.)
        """
        k, at = divmod(step, self.per_chunk)
        if at != min(1, self.per_chunk - 1) or step >= self.full:
            return
        if k + 1 < len(self.chunks) - 1:
            if self.chunks[k + 1] is None:
                self._soon(functools.partial(self._compute, k + 1), here=True)
        elif hasattr(self.order, "prepare"):  # the last chunk: the next epoch's first, for the pass after this one
            self._soon(self._next_epoch, here=False)
        if k >= 2:
            self.chunks[k - 2] = None  # every step of it was submitted long ago; rows() recomputes if ever needed

    def _soon(self, job: Callable[[], Any], here: bool) -> None:
        """Run ``job`` on the order thread; with no such thread (a table made by hand, or the Loader closed
        meanwhile), in this one if ``here``. A failure on the thread is dropped: rows() computes the chunk again
        when it needs it, and raises in the step that asked."""
        def quiet() -> None:
            with contextlib.suppress(Exception):
                job()

        if self._later is not None and self._later(quiet):
            return
        if here:
            job()

    def _next_epoch(self) -> None:
        order, world = self.order, self.world_size
        full = order.full_steps(world, 0)
        if full:
            order.prepare(self.epoch + 1, 0, min(self.per_chunk, full), self.rank, world, 0)

    def _compute(self, k: int) -> np.ndarray:
        with self._lock:
            chunk = self.chunks[k]
            if chunk is None:
                first = k * self.per_chunk
                count = min(self.per_chunk, self.full - first)
                chunk = self.chunks[k] = self.order.steps(self.epoch, first, count, self.rank, self.world_size, self.start)
            return chunk


class Indices(Stage):
    """The root of a Loader's chain: the position in the global order, and the rows of each step.

    ``epoch`` and ``start`` are where the next pass begins; while a pass holds
    the position (``chute.pipeline.lifecycle``), :meth:`state` is what its loop
    received. Pulled on its own (:meth:`next`), it hands out the rows of each
    step of the epoch from the position, and moves it.
    """

    name = "order"
    where = "workers"  # a row of a precomputed table, looked up in each batch task
    gil = False

    def __init__(self, loader: Any) -> None:
        # its order, world size, progressive mode, and the pass that holds the position (weakly: the Loader
        # holds this, and a Loader in no cycle is freed, and its threads stopped, as soon as it goes out of scope)
        self.loader = weakref.proxy(loader)
        self.epoch = 0
        self.start = 0  # position in the global order where the next pass starts
        self.epoch_shards: tuple[int, list[int]] | None = None  # progressive: (epoch, its shards) from a loaded state

    # ------------------------------------------------------------------ the protocol

    def next(self) -> np.ndarray:
        """The rows of the next step of this rank from the position (the position moves past them)."""
        loader = self.loader
        order, world = loader.order, loader.world_size
        if not order.num_batches(world, self.start):
            raise StopIteration
        rows = order.batch(self.epoch, 0, loader.rank, world, self.start)
        self.start = order.consumed_after(1, world, self.start)
        self._moved()
        return rows

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        if state is not None:
            self.load(state)

    def state(self) -> dict[str, Any]:
        """Where the training loop is: the epoch and the global position of what it has received."""
        loader = self.loader
        run = loader._pass
        if run is None or not holds_position(run.state):
            epoch, consumed, order = self.epoch, self.start, loader.order
            shards = self.epoch_shards[1] if self.epoch_shards and self.epoch_shards[0] == epoch else None
        else:
            order = run.order
            epoch, consumed = run.epoch, order.consumed_after(run.received, loader.world_size, run.start)
            shards = run.shards
        if consumed >= order.num_rows and order.num_rows:
            epoch, consumed, shards = epoch + 1, 0, None
        if loader._progressive is not None:
            state: dict[str, Any] = loader.order.state(epoch, 0)  # the whole dataset's identity ...
            state["consumed"] = consumed if shards is not None else 0  # ... and the position in this epoch's set
            state["progressive_shards"] = shards
        else:
            state = order.state(epoch, consumed)
        state["batch_size"] = loader.batch_size
        state["world_size"] = loader.world_size
        return state

    # ------------------------------------------------------------------ the position

    def load(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state`, possibly of another world size)."""
        loader = self.loader
        state = check_state(state)  # a malformed state: a ChuteError naming what is wrong, not a KeyError
        if loader._progressive is not None:
            if "progressive_shards" not in state:
                raise ChuteError("cannot resume a progressive loader from the state of a non-progressive one")
            loader.order.check_state({**state, "consumed": 0})
            epoch, shards = int(state["epoch"]), state["progressive_shards"]
            self.epoch_shards = None if shards is None else (epoch, [int(i) for i in shards])
            self.epoch, self.start = epoch, int(state["consumed"]) if shards is not None else 0
            self._moved()
            return
        try:
            epoch, consumed = loader.order.check_state(state)
        except ValueError as exc:
            raise ChuteError(str(exc)) from None
        if consumed >= loader.order.num_rows and loader.order.num_rows:
            epoch, consumed = epoch + 1, 0
        self.epoch, self.start = epoch, consumed
        self._moved()

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next, from its start."""
        self.epoch, self.start = int(epoch), 0
        self._moved()

    def finished(self, run: Any) -> None:
        """The last batch of ``run`` was delivered: the next pass runs the next epoch."""
        self.epoch, self.start = run.epoch + 1, 0

    def _moved(self) -> None:
        """The position is the loader's now, not its pass's (chute.pipeline.lifecycle)."""
        run = self.loader._pass
        if run is not None:
            run.on(Event.SET_POSITION)

    def table(self, run: Any) -> BatchIndices:
        """The rows of every step of ``run`` (its order, epoch and start; this rank)."""
        kept = self.loader._kept_threads()  # holds no reference to the Loader
        return BatchIndices(run.order, run.epoch, run.rank, run.world_size, run.start,
                            functools.partial(kept.later, "order", f"chute-order-r{run.rank}"))
