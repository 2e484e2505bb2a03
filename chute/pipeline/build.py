"""The builder: from a Loader's settings, the running stages of one pass.

    indices ──► batch task (gather, transform, collate) on the executor ──► channel ──► [device stage] ──► loop

:func:`build_pass` makes the :class:`Pass` of one ``iter()``: the epoch's
dataset and order (progressive mode: a snapshot of the cache), the indices,
the batch task, the channel, the executor (threads, or the Loader's worker
processes) and, for a remote dataset, the downloader. :func:`iterate` wires
the consumer's side (:func:`chute.pipeline.run.stream`, through the device
stage when there is one). Nothing here runs per batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from chute._channel import Channel
from chute.pipeline.gather import Gather
from chute.pipeline.indices import BatchIndices
from chute.pipeline.run import Pass, device_stream, stream
from chute.pipeline.task import BatchTask
from chute.pipeline.transform import Transform

#: Slots of a pass's channel: the most batches in flight the autotuner may ask for.
MAX_DEPTH = 256
#: Free output blocks of each shape kept at the start of a pass, beyond its batches in flight and its threads.
KEEP_SPARE = 8


def start(loader: Any, run: Pass) -> None:
    """Make the stages of ``run`` and start its threads (called by the pass's stream on its first ``next()``)."""
    loader._begin(run)  # the previous pass, if still open, stops now
    threads, depth = loader._threads_and_depth()
    loader._pool.trim(keep=depth + threads + KEEP_SPARE)  # blocks of batches a loop held, then dropped, go back
    if loader._progressive is not None:
        _progressive_epoch(loader, run)
    counters = loader.counters
    run.indices = BatchIndices(run.order, run.epoch, run.rank, run.world_size, run.start, None if counters is None else counters.order)
    run.channel = Channel(MAX_DEPTH)
    # A remote dataset's shards are downloaded ahead and held by this process, also for worker
    # processes: they read under this process's hold (and its share of a node cache).
    run.fetcher = _fetcher(loader, run)
    if loader.workers.kind == "processes":
        run.executor = loader._process_pool().start_pass(run)
        _close_at_exit(run)
        return
    fns = loader.fns
    transform = None if fns.identity else Transform(fns, run.dataset, loader._pool, loader.order.seed)
    run.task = BatchTask(run.indices, Gather(run.dataset, loader._pool, loader.columnar), transform, run.epoch, run.fetcher, counters)
    from chute.pipeline.threads import ThreadExecutor

    run.executor = ThreadExecutor(
        run.task, run.channel, threads, depth, name=f"chute-loader-r{run.rank}",
        stage=None if counters is None else counters.stage("workers"),
    )
    _close_at_exit(run)


def _close_at_exit(run: Pass) -> None:
    """Stop the pass's threads when ``run`` is collected or at interpreter exit, whichever comes first.

    A pass left suspended (a loop that broke out and kept the iterator) would
    otherwise have its workers killed mid-task when the interpreter exits.
    """
    assert run.channel is not None  # the stages are made
    weakref.finalize(run, _stop_stages, run.channel, run.executor, run.fetcher)


def _stop_stages(channel: Channel, executor: Any, fetcher: Any) -> None:
    channel.close()
    if fetcher is not None:
        fetcher.stop_waits()
    executor.close(timeout=1.0)
    if fetcher is not None:
        fetcher.close()


def iterate(loader: Any, epoch: int, position: int) -> Iterator[Any]:
    """The consumer's side of a new pass over ``epoch`` from ``position``: directly, or through the device stage.

    Nothing starts before the first ``next()`` (an iterator made and dropped, as
    Lightning does to check a loader, leaves nothing running).
    """
    run = Pass(loader, epoch, position, loader.dataset, loader.order)
    watch, meter = loader._watch(), loader._meter
    if loader.device is None:
        return stream(run, watch, meter)
    from chute.device import DevicePrefetcher

    def on_device() -> Iterator[Any]:
        start(loader, run)  # (its START event opens the report's window)  # in the training loop's thread, before the device stage's thread exists
        host = stream(run, None, meter, device_side=True)
        timing = None if meter is None else meter.device(run)
        prefetcher = DevicePrefetcher(
            host if timing is None else timing.source(host), loader._copier(), depth=2,
            on_copied=None if timing is None else timing.copied,
        )
        yield from device_stream(run, prefetcher, watch, meter)

    return on_device()


def _fetcher(loader: Any, run: Pass) -> Any:
    """For a remote dataset: the downloader that keeps this pass's shards coming, ahead of use."""
    if run.holds is not None:
        return run.holds  # progressive: the epoch's shards are held since its snapshot
    cache = getattr(run.dataset, "cache", None)
    if cache is None:
        return None
    from chute.storage.node.fetcher import Fetcher

    run.dataset.release_direct_holds()  # the pass holds what it reads; nothing else while it waits for a turn
    uses = _with_reads(run.dataset, run.order.shard_uses(run.epoch, run.world_size, run.start))
    then = _with_reads(run.dataset, run.order.shard_uses(run.epoch + 1, run.world_size, 0))  # kept for the next epoch
    return Fetcher(cache, uses, threads=cache.remote.parallel, name=f"chute-fetch-r{run.rank}", then=then)


def _with_reads(dataset: Any, uses: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The shard uses of a view whose shards also read other shards (``dataset.reads(shard)``: the
    windows of a token sequence view run into the next shards), each read shard held as long."""
    reads = getattr(dataset, "reads", None)
    if reads is None:
        return uses
    return [(first, last, read) for first, last, shard in uses for read in reads(shard)]


def _progressive_epoch(loader: Any, run: Pass) -> None:
    """Progressive mode: this epoch's shards (a snapshot of the cache, or those of a loaded state)."""
    progressive = loader._progressive
    loaded = loader._epoch_shards
    if loaded is not None and loaded[0] == run.epoch:
        shards, view = loaded[1], None  # resuming: fetch any that were evicted since
    else:
        shards, view = progressive.snapshot()
        run.start = 0
    loader._epoch_shards = None
    run.dataset, run.order = progressive.epoch_dataset(shards, view)
    run.steps = run.order.num_batches(run.world_size, run.start)
    run.shards = shards
    if view is not None:
        from chute.storage.node.progressive import EpochHolds

        run.holds = EpochHolds(view, run.order.shard_uses(run.epoch, run.world_size, run.start), progressive.filler)
    progressive.record(run.epoch, shards)
