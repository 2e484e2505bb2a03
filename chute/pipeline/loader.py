"""The Loader: a dataset in, batches in the global order out, resumable at any batch.

    order ──► batch tasks on a thread pool (gather + transform + collate) ──► [device] ──► loop

The order (``chute.order.Order``) says which rows each batch holds; worker
threads build whole batches (never single samples) and the consumer receives
them in order. ``state_dict()`` records the position in the global order that
the *consumer has received*, so a restored Loader continues with exactly the
next batch, on any number of threads or ranks.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.format.reader import Dataset, open_dataset
from chute.order import DEFAULT_WINDOW, Order
from chute.format.reader import torch_dtype
from chute.format.schema import FIXED_SIZE, Tensor
from chute.pipeline.batch import BatchFns, Loaded, load_batch
from chute.pipeline.buffers import BufferPool
from chute.pipeline.threads import OrderedPool

log = logging.getLogger("chute")


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments, else torch.distributed's, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, world_size={world_size}")
    return rank, world_size


def dataset_and_order(
    dataset: Dataset | str | os.PathLike, batch_size: int, shuffle: bool, seed: int, window: int, drop_last: bool
) -> tuple[Dataset, Order]:
    """The dataset (opened if given as a path) and the order of its rows for these settings."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset)
    order = Order(tuple(s.rows for s in ds.shards), int(batch_size), bool(shuffle), int(seed), int(window), bool(drop_last))
    return ds, order


class Loader:
    """Batches of a chute dataset in a deterministic, resumable global order.

    Args:
        dataset: a :class:`chute.Dataset` or a path to open.
        batch_size: samples per batch on this rank.
        shuffle, seed, window: the order (see ``chute.order``): with ``shuffle``
            the shards are permuted and samples are permuted within windows of
            ``window`` shards, from ``(seed, epoch)``.
        drop_last: drop the last partial step instead of padding it (padding
            repeats the first samples of the epoch's order so that every rank
            gets the same number of batches).
        transform: called on each sample (a dict, as ``dataset[i]``) in a
            worker thread; its results are collated with ``collate``.
        batch_transform: called once on each whole batch, last.
        collate: list of samples -> batch (default ``default_collate``).
        num_threads: worker threads (default: the CPU count, at most 8), or worker
            processes with ``workers="processes"``.
        workers: ``"threads"`` (default: the gather and decoding release the GIL)
            or ``"processes"`` for transforms that hold the GIL: batches are built in
            spawned processes and come back through a shared-memory ring of
            ``prefetch`` slots; functions must be module-level. Stopped by
            ``close()``/``with``, garbage collection or interpreter exit.
        prefetch: batches in flight ahead of the consumer (default 2 per thread).
        rank, world_size: this process's place (default: torch.distributed's).
        on_error: ``"raise"`` (default) or ``"skip"`` samples whose transform raises.
        device: if set (e.g. ``"cuda"``), batches arrive on it, copied on a side
            stream ahead of use (``chute.to_device``).

    Each ``iter()`` runs one epoch from the loader's position; an epoch that runs
    to the end advances ``epoch`` by one (or call ``set_epoch``). Breaking out of
    a pass and iterating again restarts that epoch unless a state was loaded.
    """

    def __init__(
        self,
        dataset: Dataset | str | os.PathLike,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        num_threads: int | None = None,
        workers: str = "threads",
        prefetch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        on_error: str = "raise",
        device: Any = None,
    ) -> None:
        self.dataset, self.order = dataset_and_order(dataset, batch_size, shuffle, seed, window, drop_last)
        self.batch_size = self.order.batch_size
        self.fns = BatchFns(transform, batch_transform, collate, on_error)
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        if workers not in ("threads", "processes"):
            raise ValueError(f"workers must be 'threads' or 'processes', got {workers!r}")
        if workers == "processes":
            from chute.pipeline.processes import check_picklable

            check_picklable(self.fns)  # a lambda fails here, not at the first batch
        self.workers = workers
        self.num_threads = max(1, int(num_threads) if num_threads is not None else min(8, os.cpu_count() or 1))
        self.prefetch = max(1, int(prefetch) if prefetch is not None else 2 * self.num_threads)
        self.device = device
        self.epoch = 0
        self._start = 0  # position in the global order where the next pass starts
        self._pass: _Pass | None = None
        self._processes = None
        self._buffers = BufferPool(keep=self.prefetch + 4)
        self.skipped: list[int] = []

    # ------------------------------------------------------------------ epochs and length

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (from its start, unless a loaded state is in this epoch)."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._start = 0

    def __len__(self) -> int:
        """Batches the next pass delivers on this rank."""
        return self.order.num_batches(self.world_size, self._start)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: the epoch and the global position of what it has received."""
        current = self._pass
        if current is None:
            epoch, consumed = self.epoch, self._start
        else:
            epoch, consumed = current.epoch, self.order.consumed_after(current.received, self.world_size, current.start)
        if consumed >= self.order.num_rows and self.order.num_rows:
            epoch, consumed = epoch + 1, 0
        state = self.order.state(epoch, consumed)
        state["batch_size"] = self.batch_size
        state["world_size"] = self.world_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another world size)."""
        try:
            epoch, consumed = self.order.check_state(state)
        except ValueError as exc:
            raise ChuteError(str(exc)) from None
        if consumed >= self.order.num_rows and self.order.num_rows:
            epoch, consumed = epoch + 1, 0
        self.epoch, self._start, self._pass = epoch, consumed, None

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        state = _Pass(self.epoch, self._start)
        self._pass = state
        if self.device is None:
            return self._deliver(state, self._host_batches(state))
        # device="cpu" runs the same device-stage thread and queue as CUDA (minus the copies)
        from chute.device import DeviceCopier, DevicePrefetcher

        prefetcher = DevicePrefetcher(self._host_batches(state), DeviceCopier(self.device), depth=2)
        return self._deliver(state, prefetcher)

    def _host_batches(self, state: _Pass) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for every step of the pass, built by the workers."""
        steps = range(self.order.num_batches(self.world_size, state.start))
        if self.workers == "processes":
            results = self._process_pool().map(state.epoch, state.start, steps)
            pool = None
        else:
            task = _Task(self.dataset, self.order, self.fns, state.epoch, state.start, self.rank, self.world_size, self._buffers)
            pool = OrderedPool(task, self.num_threads, self.prefetch, name=f"chute-loader-r{self.rank}")
            results = pool.map(steps)
        finalizer = weakref.finalize(self, pool.close) if pool is not None else None
        try:
            for step, loaded in zip(steps, results):
                state.skipped.extend(loaded.skipped)
                yield step, loaded.batch
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()  # a process pool's pass: cancel what it has queued
            if pool is not None:
                finalizer.detach()
                stuck = pool.close()
                if stuck:
                    log.warning("chute: %d loader thread(s) still busy after shutdown: %s", len(stuck), [t.name for t in stuck])

    def _process_pool(self):
        """The worker processes (started on first use, kept across epochs until ``close``)."""
        if self._processes is None:
            from chute.pipeline.processes import ProcessPool

            self._processes = ProcessPool(
                self.dataset, self.order, self.fns, self.rank, self.world_size, workers=self.num_threads, depth=self.prefetch
            )
            self._processes_finalizer = weakref.finalize(self, self._processes.close)
        return self._processes

    def close(self) -> None:
        """Stop worker processes, if any (threads stop at the end of each pass)."""
        if self._processes is not None:
            self._processes_finalizer.detach()
            self._processes.close()
            self._processes = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _deliver(self, state: _Pass, batches: Iterator[tuple[int, Any]]) -> Iterator[Any]:
        try:
            for step, batch in batches:
                state.received = step + 1
                if batch is not None:
                    yield batch
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            if state.skipped:
                self.skipped.extend(state.skipped)
                log.warning(
                    "chute: skipped %d sample(s) whose transform raised in epoch %d (first: %s)",
                    len(state.skipped), state.epoch, state.skipped[:10],
                )
        if state.received == self.order.num_batches(self.world_size, state.start) and self._pass is state:
            self.epoch, self._start, self._pass = state.epoch + 1, 0, None

    def __repr__(self) -> str:
        return (
            f"chute.Loader({self.dataset.root!r}, batch_size={self.batch_size}, shuffle={self.order.shuffle}, "
            f"rank={self.rank}/{self.world_size}, threads={self.num_threads}, prefetch={self.prefetch})"
        )


class _Pass:
    """Progress of one iteration over an epoch."""

    __slots__ = ("epoch", "start", "received", "skipped")

    def __init__(self, epoch: int, start: int) -> None:
        self.epoch = epoch
        self.start = start
        self.received = 0
        self.skipped: list[int] = []


class _Task:
    """Builds batch ``step`` of one pass (runs in a worker thread)."""

    def __init__(
        self, dataset: Dataset, order: Order, fns: BatchFns, epoch: int, start: int, rank: int, world_size: int, buffers: BufferPool
    ) -> None:
        self.dataset, self.order, self.fns = dataset, order, fns
        self.epoch, self.start, self.rank, self.world_size = epoch, start, rank, world_size
        self.buffers = buffers
        self.fixed = [
            (name, tuple(ctype.shape) if isinstance(ctype, Tensor) else (), torch_dtype(ctype.dtype))
            for name, ctype in dataset.schema
            if isinstance(ctype, FIXED_SIZE)
        ]

    def indices(self, step: int) -> np.ndarray:
        return self.order.batch(self.epoch, step, self.rank, self.world_size, self.start)

    def __call__(self, step: int) -> Loaded:
        indices = self.indices(step)
        out = {name: self.buffers.take((len(indices), *shape), dtype) for name, shape, dtype in self.fixed}
        return load_batch(self.dataset, indices, self.fns, out=out)
