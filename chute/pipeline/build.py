"""The builder: from a Loader's chain (``chute.pipeline.chain``), the running stages of one pass.

    order ──► Task on the executor (worker stages, fused) ──► channel ──► Feed ──► [Relay ...] ──► Output ──► [loop stages] ──► loop

:func:`iterate` makes the :class:`Pass` of one ``iter()`` and returns its
stream (:func:`chute.pipeline.run.stream`): nothing starts before the first
``next()``. :func:`start`, called there, makes the rest: the epoch's dataset
and order (progressive mode: a snapshot of the cache), the table of rows, the
downloader of a remote dataset, the worker stages and their fused task, the
channel, the Loader's workers bound to it (its threads, kept across passes,
or its worker processes), a relay
per stage on a thread of its own (the device copy among them) and the
loop's side. Nothing here runs per batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from chute._channel import Channel
from chute.pipeline import native_gather
from chute.pipeline.gather import shard_uses
from chute.pipeline.relay import Relay
from chute.pipeline.run import Feed, Measured, Output, Pass, stream
from chute.pipeline.task import Task

#: Slots of a pass's channel: the most batches in flight the autotuner may ask for.
MAX_DEPTH = 256
#: A pass of at most this many steps makes a slot per step instead (each slot is a lock made at the pass's
#: start: two calls per step, not 512, for the short passes of a validation set or a small dataset).
SHORT_PASS = 64
#: Free output blocks of each shape kept at the start of a pass, beyond its batches in flight and its threads.
KEEP_SPARE = 8


def iterate(loader: Any, epoch: int, position: int) -> Iterator[Any]:
    """The training loop's side of a new pass over ``epoch`` from ``position``.

    Nothing starts before the first ``next()`` (an iterator made and dropped, as
    Lightning does to check a loader, leaves nothing running).
    """
    run = Pass(loader, epoch, position, loader.dataset, loader.order)
    run.watch = loader._watch()
    return stream(run, run.watch, loader._meter)


def start(loader: Any, run: Pass) -> None:
    """Make the stages of ``run`` and start its threads (called by the pass's stream on its first ``next()``)."""
    restarting = run.feed is not None
    if not restarting:
        loader._begin(run)  # the previous pass, if still open, stops now
    threads, depth = loader._threads_and_depth()
    loader._pool.trim(keep=depth + threads + KEEP_SPARE)  # blocks of batches a loop held, then dropped, go back
    if loader._progressive is not None and not restarting:
        _progressive_epoch(loader, run)
    chain, counters = loader.chain, loader.counters
    run.indices = loader.root.table(run)
    run.channel = Channel(max(1, run.steps) if run.steps <= SHORT_PASS else MAX_DEPTH, keep=True)
    # A remote dataset's shards are downloaded ahead and held by this process, also for worker
    # processes: they read under this process's hold (and its share of a node cache).
    run.fetcher = _fetcher(loader, run)
    seed = loader.order.seed
    if loader.workers.kind == "processes":
        run.executor = loader._process_pool().start_pass(run)
    else:
        stages = chain.worker_stages(run.dataset, seed, run.fetcher)
        run.task = Task(
            run.indices, stages, run.epoch, seed, loader._pool, dataset=run.dataset, on_error=chain.fns.on_error, counters=counters,
        )
        native = native_gather.eligible(run, stages)
        if native and loader._native():  # the gather alone, data-bound: native threads
            run.executor = run.channel = native_gather.NativePass(
                loader._native_ring(threads), run.task, run.dataset, stages[0], loader._pool, depth, counters)
        else:
            run.native_later = native  # the loop's wait may still move it there (chute.pipeline.run.stream)
            work = loader._thread_executor().bind(run.task, run.channel, threads, depth)
            # the loop may build the steps itself (the autotuner's choice) when it takes the workers' results itself
            # (no stage on a thread of its own) and reads a local dataset (no download to wait for)
            # and a stalled build can be reported (the watchdog only warns about the loop's own work: not with "raise")
            work.can_inline = run.fetcher is None and not chain.threads and not chain.device and (
                run.watch is None or run.watch.on_stall != "raise")
            work.inline = work.can_inline and loader._inline()
            run.executor = work
    if restarting:
        assert run.feed is not None
        run.feed.rebind()
    else:
        run.feed = Feed(run, loader._meter)
        _relays(loader, run)
        _loop_side(loader, run)
    _close_at_exit(run)


def _relays(loader: Any, run: Pass) -> None:
    """A relay per stage on a thread of its own, in order (the device copy last), each taking from the one before,
    each on a thread the Loader keeps across its passes (``chute.pipeline.kept``)."""
    chain = loader.chain
    stages = list(chain.threads)
    if chain.device:
        from chute.pipeline.device_copy import DeviceCopy

        stages.append(DeviceCopy(loader._copier()))
    if not stages:
        return
    assert run.feed is not None
    take = run.feed.take
    kept = loader._kept_threads()
    for i, stage in enumerate(stages):
        name = getattr(stage, "thread_name", None) or f"chute-stage-{stage.name}-r{run.rank}"
        relay = Relay(stage, take, run.steps, kept.get(f"{i}:{name}", name), loader.counters)
        run.relays.append(relay)
        take = _blocking(relay.take)
    for relay in run.relays:
        relay.start()


def _blocking(take: Any) -> Any:
    return lambda step: take(step, -1)


def _loop_side(loader: Any, run: Pass) -> None:
    """The output the loop takes from, and the loop's stages pulling through it (each measured)."""
    assert run.feed is not None
    if run.relays:
        last = run.relays[-1]
        output = Output(run, last.take, getattr(last.stage, "receive", None), run.watch, loader.root)
    else:  # the loop takes the workers' results itself
        assert run.channel is not None
        output = Output(run, run.channel.take, None, run.watch, loader.root, feed=run.feed)
    run.output = output
    run.leaf = output
    loop = loader._loop
    if loop is not None:  # the loop's stages pull through the output (wrappers made once per Loader: LoopStages)
        loop.inner.source = output
        if not loader._loop_armed:
            loop.leaf.reset(None)  # a pass from where the root is (a state loaded since is already in them)
        loader._loop_armed = False
        run.leaf = loop.leaf


class LoopStages:
    """A Loader's stages in the loop, each wrapped to be measured (:class:`chute.pipeline.run.Measured`).

    Made once per Loader, so their state is there between passes: ``leaf`` is
    the last stage's wrapper (its state is the Loader's), ``inner`` the first
    wrapper, whose source is the root (between passes) or the pass's output.
    """

    def __init__(self, stages: Any, root: Any, counters: Any) -> None:
        self.inner = leaf = Measured(None, root)
        for stage in stages:
            leaf = Measured(stage, leaf, counters)
        self.leaf = leaf


def _close_at_exit(run: Pass) -> None:
    """Stop the pass's threads when ``run`` is collected or at interpreter exit, whichever comes first.

    A pass left suspended (a loop that broke out and kept the iterator) would
    otherwise have its workers killed mid-task when the interpreter exits.
    """
    assert run.channel is not None  # the stages are made
    weakref.finalize(run, _stop_stages, run.channel, run.executor, run.fetcher, list(run.relays))


def _stop_stages(channel: Channel, executor: Any, fetcher: Any, relays: list[Any]) -> None:
    channel.close()
    for relay in relays:
        relay.channel.close()
    if fetcher is not None:
        fetcher.stop_waits()
    for relay in relays:
        relay.close(timeout=1.0)
    executor.close(timeout=1.0)
    if fetcher is not None:
        fetcher.close()


def _fetcher(loader: Any, run: Pass) -> Any:
    """For a remote dataset: the downloader that keeps this pass's shards coming, ahead of use."""
    if run.holds is not None:
        return run.holds  # progressive: the epoch's shards are held since its snapshot
    cache = getattr(run.dataset, "cache", None)
    if cache is None:
        return None
    from chute.storage.node.fetcher import Fetcher

    run.dataset.release_direct_holds()  # the pass holds what it reads; nothing else while it waits for a turn
    uses = shard_uses(run.dataset, run.order, run.epoch, run.world_size, run.start)
    then = shard_uses(run.dataset, run.order, run.epoch + 1, run.world_size, 0)  # kept for the next epoch
    return Fetcher(cache, uses, threads=cache.remote.parallel, name=f"chute-fetch-r{run.rank}", then=then)


def _progressive_epoch(loader: Any, run: Pass) -> None:
    """Progressive mode: this epoch's shards (a snapshot of the cache, or those of a loaded state)."""
    progressive = loader._progressive
    root = loader.root
    loaded = root.epoch_shards
    if loaded is not None and loaded[0] == run.epoch:
        shards, view = loaded[1], None  # resuming: fetch any that were evicted since
    else:
        shards, view = progressive.snapshot()
        run.start = 0
    root.epoch_shards = None
    run.dataset, run.order = progressive.epoch_dataset(shards, view)
    run.steps = run.order.num_batches(run.world_size, run.start)
    run.shards = shards
    if view is not None:
        from chute.storage.node.progressive import EpochHolds

        run.holds = EpochHolds(view, run.order.shard_uses(run.epoch, run.world_size, run.start), progressive.filler)
    progressive.record(run.epoch, shards)
