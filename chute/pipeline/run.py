"""One pass of a Loader, running: its stages wired together, and the loop that delivers its batches.

:class:`Pass` holds what one ``iter()`` made (the indices, the batch task, the
channel, the executor, the downloader) and publishes where it is
(``received``, what each worker builds), which ``state_dict()``, the report
and the hang watchdog read. :func:`stream` is the consumer's side: the
generator the training loop iterates. Per batch it takes the step's result
from the channel, submits the step ``depth`` ahead, counts the loop's wait
and compute, and yields: a handful of calls, all of them C calls but the
channel's ``take``.

With a device, :func:`stream` runs in the device stage's thread instead
(``device_side=True``), and :func:`device_stream` is the training loop's side.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from chute._channel import Channel, Closed
from chute.errors import ChuteError, StallError
from chute.pipeline.lifecycle import Action, Event, State, after

log = logging.getLogger("chute")

#: Every how many batches the consumer samples the channel (finished batches waiting) for the autotuner.
READY_EVERY = 8
#: Every how many batches the adaptive stall timeout is recomputed.
TIMEOUT_EVERY = 64
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
        self.indices: Any = None
        self.task: Any = None
        self.channel: Channel | None = None
        self.executor: Any = None

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
        """Drop what was built ahead and go on, with new stages, from what the loop received (a mixture's new weights)."""
        position = self.order.consumed_after(self.received, self.world_size, self.start)
        self.close()
        self.start, self.received, self.submitted = position, 0, 0
        self.steps = self.order.num_batches(self.world_size, position)
        self.executor = None
        self.loader._start_pass(self)
        self.on(Event.RESTARTED)

    def close(self, broken: bool = False) -> None:
        """Stop the executor and the downloader; results not taken are dropped.

        ``broken`` (a stalled pass): its workers may be stuck for good, so they
        are not waited for. Closing again does nothing more.
        """
        channel, executor, fetcher = self.channel, self.executor, self.fetcher
        if channel is not None:
            channel.close()
        if fetcher is not None:
            fetcher.stop_waits()  # batch tasks waiting for a download give up (the executor joins them next)
        if executor is not None:
            stuck = executor.close(timeout=0.1 if broken else 5.0, broken=broken)
            if stuck:
                log.warning("chute: %d loader thread(s) still busy after shutdown: %s", len(stuck), [t.name for t in stuck])
        if fetcher is not None:
            fetcher.close()
        self.fetcher = None


def stream(run: Pass, watch: Any = None, meter: Any = None, device_side: bool = False) -> Iterator[Any]:
    """The batches of ``run``, in order (the training loop's side, or the device stage's with ``device_side``)."""
    loader = run.loader
    if run.executor is None:  # (its START event opens the report's window before the stages start)
        loader._start_pass(run)
    channel, executor, fetcher, n = run.channel, run.executor, run.fetcher, run.steps
    assert channel is not None  # made by the pass's start
    take, submit = channel.take, executor.submit
    submitted = _prime(executor, n)
    clock = time.perf_counter_ns
    timeout = watch.timeout(first=True) if watch is not None else -1
    counters = meter.counters if meter is not None and not device_side else None
    if counters is not None:
        consumer, trace, tuner = counters.consumer, counters.trace.append, meter.tuner
        tid = threading.get_ident()
        counters.name_thread()
        history = watch.history if watch is not None else None
        next_tick = tuner.next_ns if tuner is not None else 1 << 62
    per_batch = loader.hooks.per_batch  # subscribers to every batch: none by default, and then no call
    in_main = threading.current_thread() is threading.main_thread()  # see SIGNAL_WAKE_S
    called = clock()
    restarting = State.RESTARTING
    end = Event.END
    try:
        step = 0
        while step < n:
            if run.state is restarting:  # set_weights: what was built ahead is stale; go on from what was received
                run.restart()
                channel, executor, fetcher, n = run.channel, run.executor, run.fetcher, run.steps
                assert channel is not None
                take, submit = channel.take, executor.submit
                submitted, step = _prime(executor, n), 0
                continue
            try:
                try:
                    item = take(step, SIGNAL_WAKE_S if in_main else timeout)
                except TimeoutError:
                    try:
                        if not in_main:
                            raise
                        item = _take_waking(take, step, timeout, called)
                    except TimeoutError:
                        item = watch.wait(run, step, _waking(take) if in_main else take, called)
            except Closed:
                raise ended(run) from None
            got = clock()
            limit = step + 1 + executor.depth
            if limit > n:
                limit = n
            while submitted < limit:
                submit(submitted)
                submitted += 1
            if not device_side:
                run.received = step + 1
            if fetcher is not None:
                fetcher.received(step)  # the batch is a copy: its shards may go
            batch, rows, skipped = item
            item = None
            run.submitted = submitted
            if skipped:
                run.skipped.extend(skipped)
            if step == n - 1 and not device_side:
                loader._finished(run)  # the last batch is delivered: the epoch is over (docs/loader.md)
            if counters is None:
                if batch is not None:
                    if per_batch and not device_side:
                        loader.hooks.batch(run, step, got - called, rows)
                    yield (step, rows, batch) if device_side else batch
                    called = clock() if per_batch else called
                step += 1
                continue
            consumer.wait_ns += got - called  # (LoaderMeter.delivered, inline: a call per batch saved)
            if batch is not None:
                consumer.batches += 1
                consumer.samples += rows
                if consumer.first_wait_ns is None:
                    consumer.first_wait_ns = got - meter.pass_began
                if meter.first_batch_ns is None:
                    meter.first_batch_ns = got - meter.pass_began
                if history is not None and step:
                    history.values[history.count % history.size] = (got - called) / 1e9
                    history.count += 1
                if per_batch:
                    loader.hooks.batch(run, step, got - called, rows)
                yield batch
            done = clock()
            consumer.compute_ns += done - got
            trace(("loop", tid, called, got, done, step))
            if tuner is not None:
                if not step % READY_EVERY:
                    ready = channel.count_ready(step + 1, executor.depth)
                    if meter.ready is None or ready < meter.ready:
                        meter.ready = ready
                if done >= next_tick:
                    tuner.tick(done, n - step - 1, executor, meter)
                    next_tick = tuner.next_ns
            if watch is not None and not step % TIMEOUT_EVERY:
                timeout = watch.timeout(first=False)
            called = done
            step += 1
    except BaseException as exc:
        end = _raised(run, exc)
        raise
    finally:
        run.submitted = submitted
        if not device_side:
            loader._ended(run, end)  # (its END or FAIL event closes the report's window)
            run.close()


def _raised(run: Pass, exc: BaseException) -> Event:
    """The event of a stream left by ``exc``: the loop left (``GeneratorExit``), else it failed.

    A stall closes the pass at once without waiting for its workers: they may be stuck for good.
    """
    if isinstance(exc, GeneratorExit):
        return Event.END
    if isinstance(exc, StallError):
        run.close(broken=True)
    return Event.FAIL


def _prime(executor: Any, n: int) -> int:
    """Submit the first steps of a pass (as many as the executor's depth); how many were submitted."""
    submitted = min(n, executor.depth)
    for step in range(submitted):
        executor.submit(step)
    return submitted


def ended(run: Pass) -> ChuteError:
    """The error of a pass whose channel was closed under it."""
    by = "Loader.close()" if run.loader._pass is run else "a newer pass over the same loader"
    return ChuteError(f"this pass was ended by {by}; a Loader runs one pass at a time: iterate the new pass, or call iter(loader) again")




def device_stream(run: Pass, prefetcher: Any, watch: Any = None, meter: Any = None) -> Iterator[Any]:
    """The training loop's side with a device: batches from the device stage, in order.

    The device stage's thread runs :func:`stream` (``device_side=True``),
    which yields ``(step, rows, batch)``; the device stage moves the batch and
    hands the triple on.
    """
    clock = time.perf_counter_ns
    take = prefetcher.take
    timeout = watch.timeout(first=True) if watch is not None else -1
    counters = meter.counters if meter is not None else None
    loader = run.loader
    per_batch = loader.hooks.per_batch
    in_main = threading.current_thread() is threading.main_thread()  # see SIGNAL_WAKE_S
    called = clock()
    k = 0
    end = Event.END
    try:
        while True:
            try:
                try:
                    step, rows, batch = take(SIGNAL_WAKE_S if in_main else timeout)
                except TimeoutError:
                    take2 = lambda _, t: take(t)  # noqa: E731
                    try:
                        if not in_main:
                            raise
                        step, rows, batch = _take_waking(take2, None, timeout, called)
                    except TimeoutError:
                        step, rows, batch = watch.wait(run, run.received, _waking(take2) if in_main else take2, called)
            except Closed:
                raise ended(run) from None
            except StopIteration:
                if run.steps:  # the host took the last step, whose batch had every sample skipped
                    loader._finished(run)
                return
            got = clock()
            run.received = step + 1
            if step == run.steps - 1:
                loader._finished(run)  # the last batch is delivered: the epoch is over (docs/loader.md)
            if counters is not None:
                meter.delivered(called, got, rows)
                if watch is not None and k:
                    watch.history.add((got - called) / 1e9)
            if per_batch:
                loader.hooks.batch(run, step, got - called, rows)
            yield batch
            done = clock()
            if counters is not None:
                counters.consumer.compute_ns += done - got
                counters.trace.append(("loop", threading.get_ident(), called, got, done, step))
                tuner = meter.tuner
                if tuner is not None and done >= tuner.next_ns:
                    tuner.tick(done, run.steps - run.received, run.executor, meter)
            if watch is not None and not k % TIMEOUT_EVERY:
                timeout = watch.timeout(first=False)
            called = done
            k += 1
    except BaseException as exc:
        end = _raised(run, exc)
        raise
    finally:
        run.close()  # first: the device stage's thread may be waiting on the pass's channel
        prefetcher.close()
        loader._ended(run, end)  # (its END or FAIL event closes the report's window)


def empty_rows() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)
