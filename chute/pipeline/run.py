"""One pass of a Loader, running: the runtime of its chain, and the one loop that delivers its batches.

    steps ──► workers: Task (order, read, [transform], user stages)  ──► channel ──► Feed
          ──► [Relay per "thread" stage: user stages, device copy] ──► Output ──► [loop stages] ──► stream ──► the loop

:class:`Pass` holds what one ``iter()`` made (the table of rows, the task, the
channel, the executor, the relays, the downloader) and publishes where it is
(``received``; the task and the relays publish what each worker builds), which
``state_dict()``, the report and the hang watchdog read. The runtime runs
every stage and measures it; a stage measures nothing itself.

* :class:`Feed` takes each step from the workers' channel, in order, and
  submits the step ``depth`` ahead: the training loop's side when no stage
  runs on a thread of its own, else the first relay's.
* :class:`Output` hands the loop the next step (waiting with the hang
  watchdog's timeout), moves the pass's position and hands the batch over
  (the device copy's stream hand-over); as a stage it is the source of the
  stages in the loop, its state the root's.
* :func:`stream` is the generator the training loop iterates, with or
  without a device: per batch it takes the next one (from :class:`Output`, or
  through the loop's stages), counts the loop's wait and compute, and yields.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from chute._channel import Closed
from chute.errors import ChuteError, StallError
from chute.pipeline.lifecycle import Action, Event, State, after
from chute.pipeline.stage import Stage

log = logging.getLogger("chute")

_RESTARTING = State.RESTARTING  # (a module global: looked up per batch)
#: Every how many batches the workers' channel is sampled (finished batches waiting) for the autotuner.
READY_EVERY = 8
#: Every how many batches the adaptive stall timeout is recomputed.
TIMEOUT_EVERY = 64
#: A pass moves to the native gather threads mid-way only with at least this many times its prefetch depth of
#: steps left (the batches built ahead are dropped, and built again there).
NATIVE_LEFT = 8
#: The longest the training loop waits for a batch in one blocking call when it runs in the main thread.
#: CPython raises a Ctrl-C (SIGINT) in the main thread when that thread next runs Python code; if the kernel
#: delivered the signal to another thread (a worker, a download), a main thread blocked in a lock would
#: not wake for it: its wait wakes this often to let the KeyboardInterrupt through.
SIGNAL_WAKE_S = 0.25


def _take_waking(take: Any, step: Any, timeout: float, since_ns: int) -> Any:
    """``take(step, timeout)`` in the main thread, in waits of at most ``SIGNAL_WAKE_S`` (see there); raises
    ``TimeoutError`` once ``timeout`` seconds (-1: never) have passed since ``since_ns``."""
    while True:
        left = SIGNAL_WAKE_S if timeout < 0 else timeout - (time.perf_counter_ns() - since_ns) / 1e9
        if left <= 0:
            raise TimeoutError(step)
        try:
            return take(step, min(left, SIGNAL_WAKE_S))
        except TimeoutError:
            continue


def _waking(take: Any) -> Any:
    """``take(step, timeout)`` made to wake every ``SIGNAL_WAKE_S`` (the watchdog's waits in the main thread)."""
    return lambda step, timeout: _take_waking(take, step, timeout, time.perf_counter_ns())


class Pass:
    """The running state of one pass over ``epoch``, from global position ``start``."""

    def __init__(self, loader: Any, epoch: int, start: int, dataset: Any, order: Any) -> None:
        self.loader = loader
        self.epoch, self.start = epoch, start
        self.dataset, self.order = dataset, order  # progressive mode: this epoch's subset
        self.rank, self.world_size = loader.rank, loader.world_size
        self.steps = order.num_batches(self.world_size, start)
        self.received = 0  # batches the consumer has taken (the resume position is computed from it)
        self.submitted = 0
        self.skipped: list[int] = []
        self.state = State.NEW  # chute.pipeline.lifecycle: moved only by on()
        self.shards: list[int] | None = None  # progressive: the epoch's shards
        self.holds: Any = None  # progressive: the holds on the epoch's shards
        self.fetcher: Any = None  # a remote dataset's downloader (or progressive holds)
        self.indices: Any = None  # the table of rows (chute.pipeline.indices.BatchIndices)
        self.task: Any = None  # the fused worker stages (threads; the worker processes have their own)
        # the workers' results, in order: a Channel, or a NativePass (chute.pipeline.native_gather), which takes a
        # Channel's part as well as the executor's
        self.channel: Any = None
        self.executor: Any = None
        self.feed: Feed | None = None
        self.relays: list[Any] = []  # the stages on threads of their own, in order
        self.output: Output | None = None
        self.leaf: Any = None  # what the loop pulls: the output, or the last of the loop's stages
        self.watch: Any = None  # the hang watchdog (chute.observe.watchdog.StallWatch), or None
        self.build_watch: Any = None  # its thread while the loop builds the batches itself (BuildWatch; inline)
        self.native_later = False  # gather-only, on the worker threads for now: native threads once data-bound

    def on(self, event: Event) -> Action:
        """Apply ``event`` to the pass's state (``chute.pipeline.lifecycle``), tell the loader's hooks; the action to take."""
        before = self.state
        self.state, action = after(before, event)
        self.loader.hooks.pass_event(self, event.value, before.value, self.state.value)
        return action

    # ------------------------------------------------------------------ for the report and the watchdog

    @property
    def in_flight(self) -> int:
        """Batches submitted to the workers and not yet taken by the loop."""
        return max(0, self.submitted - self.received)

    def rows_of(self, step: int) -> list[int]:
        """The dataset rows of ``step``."""
        return self.indices.rows(step).tolist()

    def describe(self, index: int) -> str:
        try:
            shard, row = self.dataset.locate(index)
            return f"sample {index} (shard {self.dataset.shards[shard].file}, row {row})"
        except Exception:
            return f"sample {index}"

    def restart(self) -> None:
        """Drop what was built ahead and go on, with new stages, from what the loop received (a mixture's new weights;
        a gather-only pass moving to the native gather threads)."""
        position = self.order.consumed_after(self.received, self.world_size, self.start)
        self.close()
        self.start, self.received, self.submitted = position, 0, 0
        self.steps = self.order.num_batches(self.world_size, position)
        self.executor = None
        self.loader._start_pass(self)
        self.on(Event.RESTARTED)

    def close(self, broken: bool = False) -> None:
        """Stop the relays, the executor and the downloader; results not taken are dropped.

        ``broken`` (a stalled pass): its workers may be stuck for good, so they
        are not waited for. Closing again does nothing more.
        """
        channel, executor, fetcher = self.channel, self.executor, self.fetcher
        if self.build_watch is not None:
            self.build_watch.stop()
            self.build_watch = None
        if channel is not None:
            channel.close()
        for relay in self.relays:
            relay.channel.close()
        if fetcher is not None:
            fetcher.stop_waits()  # batch tasks waiting for a download give up (the executor joins them next)
        stuck = [relay.thread for relay in self.relays if not relay.close(timeout=0.1 if broken else 5.0)]
        if executor is not None:
            stuck += executor.close(timeout=0.1 if broken else 5.0, broken=broken)
        if stuck:
            log.warning("chute: %d loader thread(s) still busy after shutdown: %s", len(stuck), [t.name for t in stuck])
        if fetcher is not None:
            fetcher.close()
        self.fetcher = None


class Feed:
    """The workers' side of a pass: each step's result taken from their channel in order, the next steps submitted.

    Whoever takes the workers' results, in order, calls :meth:`took` after
    each step (:class:`Output` in the loop, or the first relay through
    :meth:`take`): the step ``depth`` ahead is submitted, the downloader is
    told the step was received (its shards may go), skipped samples are noted,
    and every ``READY_EVERY`` steps the finished results waiting are sampled
    for the autotuner. (:class:`Output` inlines the submission: the loop's
    budget of Python calls per batch.)
    """

    def __init__(self, run: Pass, meter: Any = None) -> None:
        self.run, self.meter = run, meter if meter is not None and meter.tuner is not None else None
        self.submitted = 0
        self.taken = 0  # the next step to take from the workers
        self.rebind()

    def rebind(self) -> None:
        """Take the pass's (new) channel and executor, and submit its first steps."""
        run = self.run
        self.channel, self.executor, self.fetcher, self.steps = run.channel, run.executor, run.fetcher, run.steps
        self.taken = 0
        self._w = -1  # the loop's worker number in the pass's task, once it built a step inline
        self._inline_next = -1  # the step the loop builds next when it goes on building inline
        self.submitted = submitted = 0 if getattr(self.executor, "inline", False) else min(self.steps, self.executor.depth)
        for step in range(submitted):
            self.executor.submit(step)
        run.submitted = submitted

    def first(self, step: int) -> tuple[Any, int, list[int]] | None:
        """``step``, which was not submitted to the workers: built in the calling thread (the loop's) when the
        pass runs inline (``executor.inline``: the autotuner found a batch's work cheaper than handing it to a
        worker and back), else submitted now with the steps up to ``depth`` ahead (None: take it from the channel).
        """
        executor = self.executor
        run = self.run
        if executor.inline:
            self.submitted = run.submitted = step + 1
            if step != self._inline_next:  # the loop starts building: the batches it took from the workers go
                self.channel.let_go()  # type: ignore[union-attr]
            self._inline_next = step + 1
            if self._w < 0:  # the loop's thread as one more worker of the task (its counters, the watchdog's view)
                self._w = run.task.register(threading.get_ident())
                if run.watch is not None and run.build_watch is None:  # its own work cannot time out: a thread looks
                    run.build_watch = run.watch.building(run)
            guard = run.build_watch
            start = time.perf_counter_ns()
            if guard is not None:
                guard.step, guard.since = step, start
            try:
                item, _ = run.task(step, start, self._w)
            finally:
                if guard is not None:
                    guard.since = 0
            return item  # type: ignore[no-any-return]
        limit = min(step + executor.depth, self.steps)
        for ahead in range(step, limit):
            executor.submit(ahead)
        self.submitted = run.submitted = limit
        return None

    def take(self, step: int, timeout: float = -1) -> tuple[Any, int, list[int]]:
        """The result of ``step`` (``TimeoutError`` after ``timeout`` seconds; -1: for ever), the next steps submitted."""
        channel = self.channel
        assert channel is not None  # made by the pass's start
        item = channel.take(step, timeout)
        self.took(step, item)
        return item

    def took(self, step: int, item: tuple[Any, int, list[int]]) -> None:
        """``step`` was taken: submit up to ``depth`` steps ahead of it, and the rest (see the class docstring)."""
        self.taken = step + 1
        executor = self.executor
        submitted = self.submitted
        limit = min(step + 1 + executor.depth, self.steps)
        while submitted < limit:
            executor.submit(submitted)
            submitted += 1
        self.submitted = self.run.submitted = submitted
        self.extras(step, item)

    def extras(self, step: int, item: tuple[Any, int, list[int]]) -> None:
        """What only some steps need: the downloader told, skipped samples noted, the channel sampled."""
        if self.fetcher is not None:
            self.fetcher.received(step)  # the batch is a copy: its shards may go
        if item[2]:
            self.run.skipped.extend(item[2])
        meter = self.meter
        if meter is not None and not step % READY_EVERY:
            channel: Any = self.channel
            ready = channel.count_ready(step + 1, self.executor.depth)
            if meter.ready is None or ready < meter.ready:
                meter.ready = ready


class Output(Stage):
    """The pass's batches as the loop receives them: the source of the loop's stages.

    :meth:`next` waits for the next step (from the :class:`Feed`, or the last
    relay) with the hang watchdog's timeout, moves the pass's position (the
    loop has received the step; its last step ends the epoch), skips steps
    whose every sample was skipped, and hands the batch over (``receive``: the
    device copy's). ``called``, ``timeout``: set by :func:`stream` (the time
    the loop asked, the watchdog's current timeout). As a stage its state is
    the root's (:class:`chute.pipeline.indices.Indices`).
    """

    name = "output"

    def __init__(self, run: Pass, take: Any, receive: Any, watch: Any, root: Any, feed: Feed | None = None) -> None:
        self.run, self._take, self.receive, self.watch, self.root = run, take, receive, watch, root
        self.feed = feed  # the workers' side, when the loop takes their channel itself (no stage on a thread of its own)
        self.step = 0  # the next step to take
        self.taken = -1  # the last step taken
        self.rows = 0  # its samples
        self.called = 0
        self.timeout = watch.timeout(first=True) if watch is not None else -1
        self.in_main = threading.current_thread() is threading.main_thread()  # see SIGNAL_WAKE_S

    def next(self) -> Any:
        run = self.run
        while True:
            step = self.step
            if step >= run.steps:
                raise StopIteration
            if run.state is _RESTARTING:  # set_weights: what was built ahead is stale; go on from what was received
                run.restart()
                self.step = 0
                if self.feed is not None:
                    channel: Any = self.feed.channel
                    self._take = channel.take  # (a channel of the new stages)
                continue
            feed = self.feed
            # a step not submitted to the workers: built here (the pass runs inline), or submitted now (it ran inline)
            item = feed.first(step) if feed is not None and step >= feed.submitted else None
            if item is None:
                take = self._take
                try:
                    try:
                        item = take(step, SIGNAL_WAKE_S if self.in_main else self.timeout)
                    except TimeoutError:
                        try:
                            if not self.in_main:
                                raise
                            item = _take_waking(take, step, self.timeout, self.called)
                        except TimeoutError:
                            item = self.watch.wait(run, step, _waking(take) if self.in_main else take, self.called)
                except Closed:
                    raise ended(run) from None
            if feed is not None:  # Feed.took, written out: submit up to depth ahead (and the rest, when a step needs it)
                feed.taken = step + 1
                executor = feed.executor
                submitted = feed.submitted
                limit = step + 1 + executor.depth if not executor.inline else 0
                if limit > feed.steps:
                    limit = feed.steps
                while submitted < limit:
                    executor.submit(submitted)
                    submitted += 1
                feed.submitted = run.submitted = submitted
                if feed.fetcher is not None or item[2] or not step % READY_EVERY:
                    feed.extras(step, item)
            self.step = step + 1
            run.received = step + 1
            self.taken = step
            if step == run.steps - 1:
                run.loader._finished(run)  # the last batch is delivered: the epoch is over (docs/loader.md)
            batch, self.rows, _ = item
            if batch is not None:
                return batch if self.receive is None else self.receive(batch)

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        if state is not None:
            self.root.load(state)

    def state(self) -> dict[str, Any]:
        return self.root.state()

    def close(self) -> None:
        self.run.close()


class Measured(Stage):
    """A stage in the loop as the runtime runs it: its time into its counter, less the time in its source.

    ``stage`` pulls from this wrapper's ``source`` (a wrapper too, or the
    pass's :class:`Output`); ``spent`` is the time spent in :meth:`next` so far,
    which the wrapper after this one takes out of its own stage's time. Without
    ``stage`` (the first wrapper, around the output) it only keeps ``spent``.
    """

    def __init__(self, stage: Stage | None, source: Any, counters: Any = None) -> None:
        self.stage, self.source = stage, source
        self.spent = 0
        self.name = stage.name if stage is not None else "output"
        self.counter = None if stage is None or counters is None else counters.stage(stage.name, "batches", where="loop", gil=stage.gil)
        if stage is not None:
            stage.source = source

    def next(self) -> Any:
        clock = time.perf_counter_ns
        began = clock()
        inner = getattr(self.source, "spent", 0)
        try:
            if self.stage is None:
                return self.source.next()
            return self.stage.next()
        finally:
            span = clock() - began
            self.spent += span
            counter = self.counter
            if counter is not None:
                counter.record(began, began + span, 1, 0, None, waited_ns=getattr(self.source, "spent", 0) - inner)

    def reset(self, state: dict[str, Any] | None = None) -> None:
        super().reset(state)
        (self.source if self.stage is None else self.stage).reset(state)

    def state(self) -> dict[str, Any]:
        return (self.source if self.stage is None else self.stage).state()

    def close(self) -> None:
        (self.source if self.stage is None else self.stage).close()


def stream(run: Pass, watch: Any = None, meter: Any = None) -> Iterator[Any]:
    """The batches of ``run`` as the training loop receives them, in order (with or without a device)."""
    loader = run.loader
    if run.output is None:  # (its START event opens the report's window before the stages start)
        loader._start_pass(run)
    out = run.output
    assert out is not None  # made by the pass's start
    pull = run.leaf.next
    clock = time.perf_counter_ns
    counters = meter.counters if meter is not None else None
    if counters is not None:
        consumer, trace, tuner = counters.consumer, counters.trace.append, meter.tuner
        tid = threading.get_ident()
        counters.name_thread()
        history = watch.history if watch is not None else None
        next_tick = tuner.next_ns if tuner is not None else 1 << 62
    per_batch = loader.hooks.per_batch  # subscribers to every batch: none by default, and then no call
    closed, running = State.CLOSED, State.RUNNING
    last = -1  # the last step counted (the loop's stages may hand on several batches per step)
    k = 0
    called = clock()
    end = Event.END
    try:
        while True:
            if run.state is closed:
                raise ended(run)
            out.called = called
            try:
                batch = pull()
            except StopIteration:
                break
            got = clock()
            step, rows = out.taken, out.rows
            if per_batch:
                loader.hooks.batch(run, step, got - called, rows)
            if counters is None:
                yield batch
                called = clock() if per_batch else called
                k += 1
                continue
            consumer.wait_ns += got - called
            consumer.batches += 1
            if step != last:
                consumer.samples += rows
                last = step
            if consumer.first_wait_ns is None:
                consumer.first_wait_ns = got - meter.pass_began
            if meter.first_batch_ns is None:
                meter.first_batch_ns = got - meter.pass_began
            if history is not None and k:
                history.values[history.count % history.size] = (got - called) / 1e9
                history.count += 1
            yield batch
            done = clock()
            consumer.compute_ns += done - got
            trace(("loop", tid, called, got, done, step))
            if done >= next_tick:
                tuner.tick(done, run.steps - run.received, run.executor, meter)
                next_tick = tuner.next_ns
                if run.native_later and tuner.policy.data_bound and run.state is running:
                    _go_native(run)
            if watch is not None and not k % TIMEOUT_EVERY:
                out.timeout = watch.timeout(first=False)
            called = done
            k += 1
    except BaseException as exc:
        end = _raised(run, exc)
        raise
    finally:
        loader._ended(run, end)  # (its END or FAIL event closes the report's window)
        run.close()
        run.loader = weakref.proxy(loader)  # the ended pass, still the loader's last, keeps it alive no more


def _go_native(run: Pass) -> None:
    """A gather-only pass that began on the worker threads, and the loop now waits for data: the rest of it on
    the native gather threads (docs/loader.md, "Workers"), when enough of it is left to pay for what the switch
    drops (the batches built ahead, built again there)."""
    run.native_later = False
    if run.steps - run.received >= NATIVE_LEFT * max(1, run.executor.depth):
        run.on(Event.NATIVE)  # the stream rebuilds the stages before its next batch (Output.next)


def _raised(run: Pass, exc: BaseException) -> Event:
    """The event of a stream left by ``exc``: the loop left (``GeneratorExit``), else it failed.

    A stall closes the pass at once without waiting for its workers: they may be stuck for good.
    """
    if isinstance(exc, GeneratorExit):
        return Event.END
    if isinstance(exc, StallError):
        run.close(broken=True)
    return Event.FAIL


def ended(run: Pass) -> ChuteError:
    """The error of a pass whose channel was closed under it."""
    by = "Loader.close()" if run.loader._pass is run else "a newer pass over the same loader"
    return ChuteError(f"this pass was ended by {by}; a Loader runs one pass at a time: iterate the new pass, or call iter(loader) again")

