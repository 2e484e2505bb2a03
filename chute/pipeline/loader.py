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
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chute.errors import ChuteError, StallError
from chute.format.reader import Dataset, open_dataset
from chute.order import DEFAULT_WINDOW, Order
from chute.format.reader import torch_dtype
from chute.format.schema import FIXED_SIZE, Tensor
from chute.pipeline.batch import BatchFns, Loaded, load_batch
from chute.pipeline.buffers import BufferPool
from chute.observe.autotune import DEFAULT_MAX_BYTES, Autotuner, Policy
from chute.observe.counters import Counters
from chute.observe.passes import LoaderMeter, cpu_budget, record_batch
from chute.observe.report import Report
from chute.observe.watchdog import LoaderProbe, StallTimeout, WaitHistory, Watchdog
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
        collate: list of samples -> batch (default: what ``default_collate`` gives, built
            sample by sample into reused buffers; see ``chute.pipeline.batch.StreamCollate``).
        num_threads: worker threads; ``None`` (default): autotuned, starting with one
            and adding threads while the loop waits for data (docs/observe.md).
            With ``workers="processes"``: worker processes (default: the CPU
            count, at most 8; not autotuned).
        workers: ``"threads"`` (default: the gather and decoding release the GIL)
            or ``"processes"`` for transforms that hold the GIL: batches are built in
            spawned processes and come back through a shared-memory ring of
            ``prefetch`` slots; functions must be module-level. Stopped by
            ``close()``/``with``, garbage collection or interpreter exit.
        prefetch: batches in flight ahead of the consumer (default: 2 per thread,
            then autotuned within ``max_prefetch_bytes``).
        max_threads: the autotuner's CPU budget (default: the CPUs this process may run on).
        max_prefetch_bytes: the autotuner's memory budget, bytes of batches in
            flight (default 512 MiB).
        rank, world_size: this process's place (default: torch.distributed's).
        on_error: ``"raise"`` (default) or ``"skip"`` samples whose transform raises.
        device: if set (e.g. ``"cuda"``), batches arrive on it, copied on a side
            stream ahead of use (``chute.to_device``).
        stall_timeout: seconds the training loop may wait in ``next()`` for one
            batch before the hang watchdog reports (stacks of every thread and
            worker, reads in flight, samples in flight, queue depths; see
            docs/watchdog.md). ``"auto"`` (default): 300 s for the first batch of a
            pass, then ``max(60 s, 20 x the 95th percentile of recent waits)``;
            ``None``: no watchdog.
        on_stall: ``"warn"`` (default: write the report to stderr and the
            ``"chute"`` logger, keep waiting, report again a timeout later) or
            ``"raise"`` (the wait raises :class:`chute.StallError` with the report).

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
        stall_timeout: float | str | None = "auto",
        on_stall: str = "warn",
        progressive: bool = False,
        max_threads: int | None = None,
        max_prefetch_bytes: int | None = None,
        _counters: bool = True,
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
        self.max_threads = max(1, int(max_threads)) if max_threads is not None else cpu_budget()
        self.max_prefetch_bytes = int(max_prefetch_bytes) if max_prefetch_bytes is not None else DEFAULT_MAX_BYTES
        if num_threads is not None:
            self.num_threads = max(1, int(num_threads))
        else:  # threads start small and are autotuned; processes are not
            self.num_threads = 1 if workers == "threads" else min(8, self.max_threads)
        self.prefetch = max(1, int(prefetch) if prefetch is not None else 2 * self.num_threads)
        # chute.observe: always-on counters (_counters=False only to measure their cost), the autotuner
        self.counters = Counters() if _counters else None
        tuner = None
        if self.counters is not None and workers == "threads" and (num_threads is None or prefetch is None):
            policy = Policy(
                self.num_threads, self.prefetch, max_threads=self.max_threads, max_bytes=self.max_prefetch_bytes,
                tune_threads=num_threads is None, tune_depth=prefetch is None,
            )
            tuner = Autotuner(policy, self.counters)
        self._meter = None if self.counters is None else LoaderMeter(self.counters, tuner, getattr(self.dataset, "cache", None))
        self.device = device
        self.epoch = 0
        self._start = 0  # position in the global order where the next pass starts
        self._pass: _Pass | None = None
        self._processes = None
        self._buffers = BufferPool(keep=self.prefetch + 4)
        if tuner is not None:  # remember as many reusable buffers as batches the autotuner lets be in flight
            tuner.on_change = lambda threads, depth, buffers=self._buffers: setattr(buffers, "keep", depth + threads + 4)
        if on_stall not in ("warn", "raise"):
            raise ValueError(f"on_stall must be 'warn' or 'raise', got {on_stall!r}")
        self._stall = StallTimeout(stall_timeout)
        self._waits = WaitHistory()  # the consumer's recent waits, for the adaptive stall timeout
        self.on_stall = on_stall
        cache = getattr(self.dataset, "cache", None)
        self._progressive = None
        self._epoch_shards: tuple[int, list[int]] | None = None  # progressive: (epoch, its shards) from a loaded state
        if progressive:
            from chute.storage.progressive import Progressive

            if workers == "processes":
                raise ValueError("progressive=True runs with workers='threads'")
            self._progressive = Progressive(self.dataset, self.order, self.order.seed)
        elif cache is not None and cache.limit is not None:  # a too small cache fails here, not mid-epoch
            from chute.storage.fetcher import check_limit, worst_resident_bytes

            # the bound over every epoch, so the minimum it states holds for the whole run
            check_limit(cache, need=worst_resident_bytes(self.order, [s.bytes for s in self.dataset.shards], self.world_size))
        self.skipped: list[int] = []

    @property
    def stall_timeout(self) -> float | str | None:
        """The hang watchdog's timeout (see the class docstring); may be changed between passes."""
        return self._stall.setting

    @stall_timeout.setter
    def stall_timeout(self, value: float | str | None) -> None:
        self._stall = StallTimeout(value)

    # ------------------------------------------------------------------ epochs and length

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (from its start, unless a loaded state is in this epoch)."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._start = 0

    def __len__(self) -> int:
        """Batches the next pass delivers on this rank (progressive: were it to start now)."""
        if self._pass is not None:
            return self._pass.order.num_batches(self.world_size, self._pass.start)
        if self._progressive is not None:
            cache = self.dataset.cache
            rows = sum(s.rows for i, s in enumerate(self.dataset.shards) if cache.cached(i))
            return self._progressive.order_for(rows).num_batches(self.world_size, 0)
        return self.order.num_batches(self.world_size, self._start)

    @property
    def progressive_epochs(self) -> list[dict[str, Any]]:
        """Progressive mode: what each epoch covered (epoch, shards, samples, new shards)."""
        return [] if self._progressive is None else list(self._progressive.epochs)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where the consumer is: the epoch and the global position of what it has received."""
        current = self._pass
        order = self.order if current is None else current.order
        if current is None:
            epoch, consumed = self.epoch, self._start
            shards = self._epoch_shards[1] if self._epoch_shards and self._epoch_shards[0] == epoch else None
        else:
            epoch, consumed = current.epoch, order.consumed_after(current.received, self.world_size, current.start)
            shards = current.shards
        if consumed >= order.num_rows and order.num_rows:
            epoch, consumed, shards = epoch + 1, 0, None
        if self._progressive is not None:
            state = self.order.state(epoch, 0)  # the whole dataset's identity ...
            state["consumed"] = consumed if shards is not None else 0  # ... and the position in this epoch's set
            state["progressive_shards"] = shards
        else:
            state = order.state(epoch, consumed)
        state["batch_size"] = self.batch_size
        state["world_size"] = self.world_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another world size)."""
        if self._progressive is not None:
            if "progressive_shards" not in state:
                raise ChuteError("cannot resume a progressive loader from the state of a non-progressive one")
            self.order.check_state({**state, "consumed": 0})
            epoch, shards = int(state["epoch"]), state["progressive_shards"]
            self._epoch_shards = None if shards is None else (epoch, [int(i) for i in shards])
            self.epoch, self._start, self._pass = epoch, int(state["consumed"]) if shards is not None else 0, None
            return
        try:
            epoch, consumed = self.order.check_state(state)
        except ValueError as exc:
            raise ChuteError(str(exc)) from None
        if consumed >= self.order.num_rows and self.order.num_rows:
            epoch, consumed = epoch + 1, 0
        self.epoch, self._start, self._pass = epoch, consumed, None

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        state = _Pass(self.epoch, self._start, self.dataset, self.order)
        if self._progressive is not None:
            self._begin_progressive(state)
        self._pass = state
        meter = self._meter
        if meter is not None:
            meter.start_pass()
        batches = self._host_batches(state)
        if self.device is not None:
            # device="cpu" runs the same device-stage thread and queue as CUDA (minus the copies)
            from chute.device import DeviceCopier, DevicePrefetcher

            timing = None if meter is None else meter.device()
            batches = DevicePrefetcher(
                batches if timing is None else timing.source(batches), DeviceCopier(self.device), depth=2,
                on_copied=None if timing is None else timing.copied,
            )
        if meter is not None:  # times the loop: waiting in next() vs computing between calls
            batches = meter.timed(batches, state.order.num_batches(self.world_size, state.start))
        return self._deliver(state, batches)

    def _begin_progressive(self, state: _Pass) -> None:
        """Progressive mode: this epoch's shards (a snapshot of the cache, or those of a loaded state)."""
        progressive = self._progressive
        if self._epoch_shards is not None and self._epoch_shards[0] == state.epoch:
            shards, view = self._epoch_shards[1], None  # resuming: fetch any that were evicted since
        else:
            shards, view = progressive.snapshot()
            state.start = 0
        self._epoch_shards = None
        state.dataset, state.order = progressive.epoch_dataset(shards, view)
        state.shards = shards
        if view is not None:
            from chute.storage.progressive import EpochHolds

            state.holds = EpochHolds(view, state.order.shard_uses(state.epoch, self.world_size, state.start), progressive.filler)
        progressive.record(state.epoch, shards)

    def _host_batches(self, state: _Pass) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for every step of the pass, built by the workers."""
        steps = range(state.order.num_batches(self.world_size, state.start))
        fetcher = self._fetcher(state)
        if self.workers == "processes":
            results = self._process_pool().map(state.epoch, state.start, steps)
            pool = None
        else:
            task = _Task(state.dataset, state.order, self.fns, state.epoch, state.start, self.rank, self.world_size, self._buffers)
            task.fetcher = fetcher
            meter = self._meter
            if meter is not None and meter.tuner is not None:  # start where the autotuner got to
                self.num_threads, self.prefetch = meter.tuner.policy.threads, meter.tuner.policy.depth
                self._buffers.keep = self.prefetch + self.num_threads + 4
            task.counters = self.counters
            workers = None if self.counters is None else self.counters.stage("workers")
            pool = OrderedPool(task, self.num_threads, self.prefetch, name=f"chute-loader-r{self.rank}", stage=workers)
            if meter is not None:
                meter.attach(pool)
            state.task, state.pool = task, pool  # for the hang watchdog's report
            results = pool.map(steps)
        finalizer = weakref.finalize(self, pool.close) if pool is not None else None
        stalled = False
        try:
            for step, loaded in zip(steps, results):
                state.skipped.extend(loaded.skipped)
                if self._meter is not None:
                    self._meter.produced(step, loaded, self.workers == "processes", self.num_threads)
                if fetcher is not None:
                    fetcher.received(step)  # the batch is a copy: its shards may go
                yield step, loaded.batch
        except StallError:
            stalled = True  # the watchdog gave up on a stuck task: do not wait for its thread
            raise
        finally:
            if fetcher is not None:
                fetcher.close()
            close = getattr(results, "close", None)
            if close is not None:
                close()  # a process pool's pass: cancel what it has queued
            if pool is not None:
                finalizer.detach()
                stuck = pool.close(timeout=0.1 if stalled else 5.0)
                if stuck:
                    log.warning("chute: %d loader thread(s) still busy after shutdown: %s", len(stuck), [t.name for t in stuck])

    def _fetcher(self, state: _Pass):
        """For a remote dataset: the downloader that keeps this pass's shards coming, ahead of use."""
        if state.holds is not None:
            return state.holds  # progressive: the epoch's shards are held since its snapshot
        cache = getattr(state.dataset, "cache", None)
        if cache is None:
            return None
        from chute.storage.fetcher import Fetcher

        uses = state.order.shard_uses(state.epoch, self.world_size, state.start)
        return Fetcher(cache, uses, threads=cache.remote.parallel, name=f"chute-fetch-r{self.rank}")

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
        """Stop worker processes, if any (threads stop at the end of each pass), and a progressive filler."""
        if self._progressive is not None:
            self._progressive.close()
        if self._processes is not None:
            self._processes_finalizer.detach()
            self._processes.close()
            self._processes = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ measurement (docs/observe.md)

    def report(self, since: str = "pass") -> Report:
        """Why the training loop waits for data, if it does: a :class:`chute.observe.Report`.

        Covers the last pass (the pass in progress, while it runs), or with
        ``since="start"`` the loader's whole life. ``print(loader.report())``
        reads; ``loader.report().to_json()`` logs.
        """
        if self._meter is None:
            raise ChuteError("this Loader was made with _counters=False: it has no counters to report from")
        tuner = self._meter.tuner
        settings = {
            "num_threads": tuner.policy.threads if tuner is not None else self.num_threads,
            "prefetch": tuner.policy.depth if tuner is not None else self.prefetch,
            "autotune": tuner is not None,
            "tuned": [] if tuner is None else [n for n, on in (("threads", tuner.policy.tune_threads), ("prefetch", tuner.policy.tune_depth)) if on],
            "workers": self.workers,
            "max_threads": self.max_threads,
            "max_prefetch_bytes": self.max_prefetch_bytes,
        }
        return self._meter.report(settings, self.max_threads, self.workers, since)

    def trace(self, path: str | os.PathLike, batches: int | None = None) -> str:
        """Write a Chrome trace (Perfetto, chrome://tracing) of the last batches to ``path``; return the path.

        One track per thread (workers, device copier, the training loop) with a
        span per stage and batch; ``batches`` limits it to the last so many
        steps (default: all the ring holds, a few hundred batches).
        """
        if self.counters is None:
            raise ChuteError("this Loader was made with _counters=False: it has no trace to write")
        from chute.observe.trace import write_trace

        return write_trace(self.counters, path, batches)

    def _deliver(self, state: _Pass, batches: Iterator[tuple[int, Any]]) -> Iterator[Any]:
        watchdog = None
        if self._stall.enabled:
            watchdog = Watchdog(self._stall, self._waits, self.on_stall, LoaderProbe(self, state), name=f"chute-watchdog-r{self.rank}")
            watchdog.start()
            watchdog.waiting()
        try:
            for step, batch in batches:
                state.received = step + 1
                if batch is not None:
                    if watchdog is not None:
                        watchdog.delivered()
                    yield batch
                    if watchdog is not None:
                        watchdog.waiting()
        finally:
            if watchdog is not None:
                watchdog.stop()
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            if state.skipped:
                self.skipped.extend(state.skipped)
                log.warning(
                    "chute: skipped %d sample(s) whose transform raised in epoch %d (first: %s)",
                    len(state.skipped), state.epoch, state.skipped[:10],
                )
        if state.received == state.order.num_batches(self.world_size, state.start) and self._pass is state:
            self.epoch, self._start, self._pass = state.epoch + 1, 0, None

    def __repr__(self) -> str:
        return (
            f"chute.Loader({self.dataset.root!r}, batch_size={self.batch_size}, shuffle={self.order.shuffle}, "
            f"rank={self.rank}/{self.world_size}, threads={self.num_threads}, prefetch={self.prefetch})"
        )


class _Pass:
    """Progress of one iteration over an epoch."""

    __slots__ = ("epoch", "start", "received", "skipped", "task", "pool", "dataset", "order", "holds", "shards")

    def __init__(self, epoch: int, start: int, dataset: Dataset, order: Order) -> None:
        self.epoch = epoch
        self.start = start
        self.dataset, self.order = dataset, order  # progressive: this epoch's subset
        self.holds = None  # progressive: the holds on the epoch's shards
        self.shards: list[int] | None = None  # progressive: the epoch's shards
        self.received = 0
        self.skipped: list[int] = []
        self.task: _Task | None = None  # threads mode: the batch task and its pool (for the watchdog)
        self.pool: OrderedPool | None = None


class _Task:
    """Builds batch ``step`` of one pass (runs in a worker thread)."""

    def __init__(
        self, dataset: Dataset, order: Order, fns: BatchFns, epoch: int, start: int, rank: int, world_size: int, buffers: BufferPool
    ) -> None:
        self.dataset, self.order, self.fns = dataset, order, fns
        self.epoch, self.start, self.rank, self.world_size = epoch, start, rank, world_size
        self.buffers = buffers
        self.running: dict[int, tuple[np.ndarray, int, float]] = {}  # step -> (indices, thread id, since): for the watchdog
        self.fixed = [
            (name, tuple(ctype.shape) if isinstance(ctype, Tensor) else (), torch_dtype(ctype.dtype))
            for name, ctype in dataset.schema
            if isinstance(ctype, FIXED_SIZE)
        ]

    fetcher = None  # a remote dataset's downloader: wait until the batch's shards are in the cache
    counters: Counters | None = None  # where the task counts its time (chute.observe.counters)

    def indices(self, step: int) -> np.ndarray:
        return self.order.batch(self.epoch, step, self.rank, self.world_size, self.start)

    def __call__(self, step: int) -> Loaded:
        counters = self.counters
        clock = time.perf_counter_ns
        began = clock() if counters is not None else 0
        indices = self.indices(step)
        ordered = clock() if counters is not None else 0
        self.running[step] = (indices, threading.get_ident(), time.monotonic())
        try:
            fetch_wait = 0
            if self.fetcher is not None:
                shards = np.unique(np.searchsorted(self.dataset.offsets, indices, side="right") - 1)
                waiting = clock()
                self.fetcher.wait(step, shards.tolist())
                fetch_wait = clock() - waiting  # counted as the read stage waiting on its input
            out = {name: self.buffers.take((len(indices), *shape), dtype) for name, shape, dtype in self.fixed}
            if counters is None:
                return load_batch(self.dataset, indices, self.fns, out=out, timed=False, buffers=self.buffers)
            read = counters.stage("read").cell()
            waited = read.wait_in_ns  # the storage layer may count waits inside get_batch here
            loaded = load_batch(self.dataset, indices, self.fns, out=out, buffers=self.buffers)
            record_batch(counters, step, len(indices), loaded, (began, ordered), fetch_wait, read.wait_in_ns - waited)
            return loaded
        finally:
            del self.running[step]
