"""The Loader: a dataset in, batches in the global order out, resumable at any batch.

A thin façade. It holds the settings (``chute.pipeline.config``), its chain
of stages (``chute.pipeline.chain``: chute's and the user's ``stages=``), its
root (``chute.pipeline.indices.Indices``: the epoch and the resume position),
and the things that outlive a pass (the output block pool, the counters and
autotuner, the worker processes, the device copier); each ``iter()`` builds a
pass (``chute.pipeline.build``) whose stream (``chute.pipeline.run``) the
training loop iterates. ``state_dict()`` records the position in the global
order that the *training loop has received*, so a restored Loader continues
with exactly the next batch, on any number of workers or ranks. A Loader is a
stage itself (``chute.Stage``: ``next``, ``reset``, ``state``), the source of
stages after it. See ``chute/pipeline/README.md`` for the life of a batch.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import chute._arena  # noqa: E402,F401

# What every Loader uses, loaded with this module (``from chute import Loader``) instead of inside
# the first Loader(): a fresh process's first batch then waits for its own work, not for imports
# (docs/benchmarks.md, design figures). The functions import them again by name.
import chute.observe.passes  # noqa: E402,F401
import chute.observe.watchdog  # noqa: E402,F401
import chute.pipeline.build  # noqa: E402,F401
import chute.pipeline.threads  # noqa: E402,F401
import chute.storage.open  # noqa: E402,F401
from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.observe.hooks import Hooks
from chute.pipeline.chain import plan
from chute.pipeline.config import Watchdog, Workers, refuse_habits
from chute.pipeline.indices import Indices
from chute.pipeline.lifecycle import Action, Event, delivering
from chute.pipeline.spec import LoaderSpec
from chute.pipeline.stage import Stage

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from chute.pipeline.spec import Options

log = logging.getLogger("chute")


class Loader(Stage):
    """Batches of a chute dataset in a deterministic, resumable global order.

    Args:
        dataset: a :class:`chute.Dataset` (``chute.open(...)``), or a path or URL to open.
        batch_size: samples per batch on this rank.
        shuffle: ``True`` (shards are permuted, then samples within windows of
            4 shards, from ``(seed, epoch)``), ``False`` (dataset order), or
            ``chute.Shuffle(window=N)``.
        seed: the order's seed (and the transforms' randomness).
        drop_last: drop the last partial step instead of padding it (padding
            repeats the first samples of the epoch's order so that every rank
            gets the same number of batches).
        transform: a function of one sample (a dict, as ``dataset[i]``), run in
            a worker for every sample and collated; or a batch-level transform
            object (``transform_batch(batch, ctx)``, e.g. ``chute.images``).
        batch_transform: a function of a whole batch, run in the worker after
            the transform (``chute.BatchStage(fn, name="batch_transform")``).
        collate: list of samples -> batch (default: as ``default_collate``,
            built into reused memory).
        on_error: ``"raise"`` (default) or ``"skip"`` samples whose transform raises.
        stages: stages of one's own, in order after those above
            (``chute.BatchStage(fn, name=..., where="workers" | "thread" |
            "loop")``, or a ``chute.Stage`` subclass in the loop): each is a
            row of ``report()``, and ``state_dict()`` holds the state of those
            that keep one.
        columnar: variable-size columns (strings, bytes, maps, JSON, ragged)
            as Arrow arrays instead of Python objects per sample.
        device: if set (``"cuda"``, ``"cuda:1"``, ``"cpu"``), batches arrive on
            it, copied from pinned memory on a side stream ahead of use.
        workers: ``chute.Workers(...)`` (threads or processes, count, prefetch,
            budgets), or ``"threads"``, ``"processes"``, or a number of threads.
            Default: threads, autotuned.
        rank, world_size: this process's place (default: torch.distributed's).
        columnar, device, workers and watchdog are the Loader's own; the others
        (``chute.pipeline.spec.Options``) ``chute.TorchIterable`` takes too.
        watchdog: the hang watchdog: ``"auto"`` (default), seconds, None (off),
            or ``chute.Watchdog(timeout=..., on_stall="warn"|"raise")``.

    Epochs (docs/loader.md): each ``iter()`` runs one pass from the loader's
    position. A pass whose last batch has been delivered has finished: the
    epoch advances then, whether or not the loop asks for the end of the
    iterator. A pass left early restarts at the same place next time.
    ``set_epoch`` always wins; ``load_state_dict`` sets the position.
    """

    name = "loader"

    def __init__(
        self,
        dataset: Dataset | str | os.PathLike,
        batch_size: int,
        *,
        columnar: bool = False,
        device: Any = None,
        workers: Workers | str | int | None = None,
        watchdog: Watchdog | float | str | None = "auto",
        **options: Unpack[Options],
    ) -> None:
        rest: dict[str, Any] = dict(options)
        counters_on = rest.pop("_counters", True)  # False only to measure the counters' cost
        self.spec = spec = LoaderSpec.of(dataset, batch_size, rest)
        refuse_habits(rest)
        self.dataset, self.order, self.batch_size, self.shuffle = spec.dataset, spec.order, spec.batch_size, spec.shuffle
        self.fns, self.rank, self.world_size = spec.fns, spec.rank, spec.world_size
        self.columnar = bool(columnar)
        self.workers = Workers.of(workers)
        self.watchdog = Watchdog.of(watchdog)
        self.chain = plan(self.fns, spec.stages, device is not None, self.columnar)
        if self.workers.kind == "processes":
            from chute.pipeline.processes import check_picklable

            check_picklable(self.fns, self.chain.workers)  # a lambda fails here, not at the first batch
        self.device = device
        self._copier_: Any = None
        self._kept: Any = None  # the stage threads kept across passes (chute.pipeline.kept), made on first use
        if device is not None:
            from chute.device import resolve_device

            resolved = resolve_device(device)
            pin = resolved is not None and resolved.type == "cuda"
        else:
            pin = False
        from chute._arena import Arena

        self._pool = Arena(pin=pin)
        self.root = Indices(self)  # the position in the global order (epoch, consumed) and each pass's rows
        self._pass: Any = None  # the last pass started; its state (chute.pipeline.lifecycle) says what it holds
        self._batches: Any = None  # the pass next() pulls from (the Loader as a stage)
        self._processes: Any = None
        self._threads: Any = None  # the worker threads (chute.pipeline.threads.ThreadExecutor), kept across passes
        self._ring: Any = None  # the native gather threads (chute.pipeline.native_gather), kept across passes
        self._ring_pid = 0
        self._start_method = "spawn"  # of worker processes ("fork" only in tests: unsafe with threads and torch)
        self.skipped: list[int] = []
        self.hooks = Hooks()  # observers of the passes' events (chute.observe.hooks)
        self._setup_measurement(counters_on)
        self._setup_storage()
        self._loop: Any = None  # the stages in the loop, measured (chute.pipeline.build.LoopStages)
        self._loop_armed = False  # a state was loaded into them since the last pass started
        if self.chain.loop:
            from chute.pipeline.build import LoopStages

            self._loop = LoopStages(self.chain.loop, self.root, self.counters)

    @property
    def epoch(self) -> int:
        """The epoch the next pass runs (while a pass runs: the one after it, once it has finished)."""
        return self.root.epoch

    @property
    def _start(self) -> int:
        return self.root.start

    def _setup_measurement(self, on: bool) -> None:
        """The always-on counters, the autotuner, the stall history (docs/observe.md)."""
        from chute.observe.autotune import DEFAULT_MAX_BYTES, Autotuner, Policy, default_max_threads
        from chute.observe.counters import Counters
        from chute.observe.passes import LoaderMeter, cpu_budget
        from chute.observe.watchdog import WaitHistory

        w = self.workers
        self.cpu_budget = cpu_budget()  # cores; the autotuner counts the CPU its threads really use against it
        self.max_threads = w.max_count if w.max_count is not None else default_max_threads(self.cpu_budget)
        self.max_prefetch_bytes = w.max_prefetch_bytes if w.max_prefetch_bytes is not None else DEFAULT_MAX_BYTES
        if w.count is not None:
            self.num_threads = w.count
        elif w.kind == "threads":  # autotuned from one thread, or one per core for work without the GIL
            self.num_threads = min(self.max_threads, self.cpu_budget) if self._gil_free() else 1
        else:  # processes are not autotuned
            self.num_threads = min(8, w.max_count or self.cpu_budget)
        self.prefetch = w.prefetch if w.prefetch is not None else self._first_depth()
        self.counters = Counters() if on else None
        tuner = None
        if self.counters is not None and w.kind == "threads" and (w.count is None or w.prefetch is None):
            policy = Policy(
                self.num_threads, self.prefetch, max_threads=self.max_threads, cpu_budget=self.cpu_budget,
                max_bytes=self.max_prefetch_bytes,
                tune_threads=w.count is None, tune_depth=w.prefetch is None, probe=not self._gather_only(),
            )
            tuner = Autotuner(policy, self.counters)
        self._meter = None if self.counters is None else LoaderMeter(self.counters, tuner, getattr(self.dataset, "cache", None))
        if self._meter is not None:
            self.hooks.add(self._meter)
        self._waits = WaitHistory()  # the loop's recent waits, for the adaptive stall timeout

    def _gil_free(self) -> bool:
        """Whether a batch's work runs without the GIL: every stage on the workers says so (a transform object
        with ``gil_free``, a ``BatchStage(gil=False)``), or a batch is one native gather (:meth:`_gather_only`)."""
        free = self.chain.gil_free
        return self._gather_only() if free is None else free

    def _gather_only(self) -> bool:
        """No stage but the gather over a dataset whose columns are all fixed-size: a batch is one native
        gather, a copy bound by memory bandwidth (the autotuner does not probe a thread beyond the cores)."""
        variable = getattr(self.dataset, "variable_columns", None)
        native = getattr(self.dataset, "native_batches", False)  # variable columns made in the same native call
        return bool(self.chain.gather_only and variable is not None and (not variable or native))

    def _first_depth(self) -> int:
        """Batches in flight to start with: 16, or fewer when 16 batches would not fit the memory budget.

        Small batches whose decoding holds the GIL ran faster with the worker
        running ahead of the loop than waiting for its next step, and 16 was as
        fast as 8 or faster on W1-W3 at the thread counts the autotuner reaches
        there (docs/benchmarks.md, design figures). A batch's size is estimated from
        the dataset's bytes per row.
        """
        rows = max(1, len(self.dataset))
        batch_bytes = max(1.0, getattr(self.dataset, "nbytes", 0) / rows * self.batch_size)
        fits = int(self.max_prefetch_bytes // batch_bytes)
        return max(2 * self.num_threads, min(16, fits), 1)

    def _setup_storage(self) -> None:
        """Progressive mode (a dataset opened with progressive=True), or a check that the cache is big enough."""
        cache = getattr(self.dataset, "cache", None)
        self._progressive = None
        if getattr(self.dataset, "progressive", False):
            from chute.storage.node.progressive import Progressive

            if self.workers.kind == "processes":
                raise ValueError("a progressive dataset is read with workers='threads'")
            self._progressive = Progressive(self.dataset, self.order, self.order.seed)
        elif cache is not None and cache.limit is not None:  # a too small cache fails here, not mid-epoch
            from chute.storage.node.fetcher import check_limit, worst_resident_bytes

            # the bound over every epoch, so the minimum it states holds for the whole run
            check_limit(cache, need=worst_resident_bytes(self.order, [s.bytes for s in self.dataset.shards], self.world_size))

    # ------------------------------------------------------------------ epochs and length

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next, from its start (also when called during a pass: it applies to the next one)."""
        self._loop_armed = False
        self.root.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches the next pass delivers on this rank (progressive: were it to start now), through the stages in
        the loop (TypeError naming a stage of one's own that does not say how many it hands on: ``Stage.length``)."""
        batches = self._steps()
        for stage in self.chain.loop:
            batches = stage.length(batches)
        return batches

    def _steps(self) -> int:
        """Steps of the next pass on this rank (the batches the loop stages take)."""
        run = self._pass
        if run is not None and delivering(run.state):
            return run.steps
        root = self.root
        if self._progressive is not None:
            loaded = root.epoch_shards
            if loaded is not None and loaded[0] == root.epoch:  # resuming: the rest of the loaded epoch
                rows = sum(self.dataset.shards[i].rows for i in loaded[1])
                return self._progressive.order_for(rows).num_batches(self.world_size, root.start)
            cache = self.dataset.cache
            rows = sum(s.rows for i, s in enumerate(self.dataset.shards) if cache.cached(i))
            return self._progressive.order_for(rows).num_batches(self.world_size, 0)
        return self.order.num_batches(self.world_size, root.start)

    @property
    def progressive_epochs(self) -> list[dict[str, Any]]:
        """Progressive mode: what each epoch covered (epoch, shards, samples, new shards)."""
        return [] if self._progressive is None else list(self._progressive.epochs)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is: the epoch and the global position of what it has received.

        With stages of one's own in the loop that keep state, theirs nests the
        position (``chute.Stage.state``): what the last of them returns.
        """
        if self._loop is not None:
            return self._loop.leaf.state()
        return self.root.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, possibly of another world size)."""
        if self._loop is not None:
            self._loop.leaf.reset(state)  # each stage takes its part; the root sets the position
            self._loop_armed = True
            return
        self.root.load(state)

    def skip(self, steps: int) -> None:
        """Skip the next ``steps`` steps without reading them (e.g. past a loss spike); from the next ``iter()``.

        Every rank calls it with the same ``steps``: a step is a global batch.
        The position moves as if the loop had received those batches (across
        epoch ends too), so ``state_dict`` and the order after it are exactly
        those of a run that read them. Built on :meth:`state_dict` /
        :meth:`load_state_dict`; a pass in progress is not changed.
        """
        steps = int(steps)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if self._progressive is not None:
            raise ChuteError("skip is not supported in progressive mode: an epoch's length depends on the cache")
        state = self.root.state()
        epoch, consumed, order, world = int(state["epoch"]), int(state["consumed"]), self.order, self.world_size
        left = order.num_batches(world, consumed)
        if steps >= left and left:  # into the following epochs (whole epochs at once)
            steps, epoch, consumed = steps - left, epoch + 1, 0
            per_epoch = order.num_batches(world, 0)
            if per_epoch:
                epoch, steps = epoch + steps // per_epoch, steps % per_epoch
        consumed = order.consumed_after(steps, world, consumed)
        self._loop_armed = False
        self.root.load({**order.state(epoch, consumed), "batch_size": self.batch_size, "world_size": world})

    def set_weights(self, weights: dict[str, float]) -> None:
        """A mixture's new weights, by source name, from the next batch the loop receives on.

        Recorded in the order (and so in :meth:`state_dict`): a resumed run
        follows the same weights at the same positions. Batches built ahead with
        the old weights are dropped and built again.
        """
        change = getattr(self.order, "set_weights", None)
        if change is None:
            raise ChuteError("set_weights needs a mixture: chute.Loader(chute.mix({...}, weights={...}), ...)")
        run = self._pass
        if run is not None and delivering(run.state) and (self.device is not None or self.chain.threads):
            raise ChuteError(
                "set_weights during a pass is not supported with device=... or a stage on a thread of its own: batches "
                "already copied or handed on would keep the old weights; call it between passes (before iter(loader))"
            )
        state = self.root.state()
        change(int(state["epoch"]), int(state["consumed"]), weights)
        if run is not None:
            run.on(Event.SET_WEIGHTS)  # a running pass rebuilds its stages before its next batch

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        """A new pass from the loader's position (a whole epoch once the last one finished)."""
        from chute.pipeline.build import iterate

        return iterate(self, self.root.epoch, self.root.start)

    # ------------------------------------------------------------------ the Loader as a stage (chute.Stage)

    def next(self) -> Any:
        """The next batch of the pass :meth:`reset` started (one is started if none runs)."""
        if self._batches is None:
            self._batches = iter(self)
        return next(self._batches)

    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Start a pass: from ``state`` if given (:meth:`load_state_dict`), else from the loader's position."""
        Stage.reset(self, state)
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()
        if state is not None:
            self.load_state_dict(state)

    def state(self) -> dict[str, Any]:
        return self.state_dict()

    def _start_pass(self, run: Any) -> None:
        """Make the stages of ``run`` and start its threads (its stream's first ``next()``)."""
        from chute.pipeline.build import start

        start(self, run)

    def _begin(self, run: Any) -> None:
        """A pass starts: the one before it, if still open, stops now."""
        previous = self._pass
        self._pass = run
        run.on(Event.START)
        if previous is not None and previous is not run:
            previous.on(Event.CLOSE)
            previous.close()

    def _finished(self, run: Any) -> None:
        """The last batch of ``run`` is delivered: the next pass runs the next epoch (unless set since)."""
        if run.on(Event.LAST) is Action.ADVANCE and self._pass is run:
            self.root.finished(run)

    def _ended(self, run: Any, event: Event = Event.END) -> None:
        """The stream of ``run`` has ended: exhausted or left early (``END``), or it raised (``FAIL``)."""
        run.on(event)
        if run.skipped:
            self.skipped.extend(run.skipped)
            log.warning(
                "chute: skipped %d sample(s) whose transform raised in epoch %d (first: %s)",
                len(run.skipped), run.epoch, run.skipped[:10],
            )
        # A pass left early stays the loader's last pass: state_dict() still reports what the loop
        # received, and the next iter() restarts the epoch from where this pass started.

    def _threads_and_depth(self) -> tuple[int, int]:
        """Worker threads and prefetch depth for a new pass (where the autotuner got to)."""
        tuner = self._meter.tuner if self._meter is not None else None
        if tuner is not None:
            self.num_threads, self.prefetch = tuner.policy.threads, tuner.policy.depth
        return self.num_threads, self.prefetch

    def _inline(self) -> bool:
        """Whether a new pass's loop builds its batches itself (where the autotuner got to; docs/observe.md)."""
        tuner = self._meter.tuner if self._meter is not None else None
        return tuner is not None and tuner.policy.inline

    def _native(self) -> bool:
        """Whether a new gather-only pass may run on native threads: once the autotuner saw the loop wait for
        data in its last windows (before that, and while the loop computes, the worker threads, whose hand-over
        costs the loop less of its step); with no autotuner (settings fixed by hand, counters off), always
        (docs/loader.md, "Workers")."""
        tuner = self._meter.tuner if self._meter is not None else None
        return tuner is None or tuner.policy.data_bound is True

    def _watch(self) -> Any:
        """The hang watchdog of a new pass (None when off)."""
        if self.watchdog is None:
            return None
        from chute.observe.watchdog import StallWatch

        return StallWatch(self.watchdog.timeout, self.watchdog.on_stall, self._waits, _describe_pass)

    def describe_pass(self, run: Any) -> Any:
        return _describe_pass(run)

    def _copier(self) -> Any:
        if self._copier_ is None:
            from chute.device import DeviceCopier

            self._copier_ = DeviceCopier(self.device)
        return self._copier_

    def _thread_executor(self) -> Any:
        """The worker threads (started on first use, kept across passes until ``close``; the autotuner's count).

        They hold no reference to the Loader: a finalizer stops them when it is
        garbage-collected, and at interpreter exit.
        """
        if self._threads is None:
            from chute.pipeline.threads import ThreadExecutor

            counters = self.counters
            self._threads = ThreadExecutor(
                self.num_threads, self.prefetch, name=f"chute-loader-r{self.rank}",
                stage=None if counters is None else counters.stage("workers"),
            )
            self._threads_finalizer = weakref.finalize(self, self._threads.shutdown, 1.0)
        return self._threads

    def _kept_threads(self) -> Any:
        """The threads of the stages on threads of their own (the device copy among them), kept across passes
        until ``close``; they hold no reference to the Loader: a finalizer stops them when it is collected."""
        if self._kept is None:
            from chute.pipeline.kept import KeptThreads

            self._kept = KeptThreads()
            self._kept_finalizer = weakref.finalize(self, self._kept.stop, 1.0)
        return self._kept

    def _native_ring(self, threads: int) -> Any:
        """The native gather threads of gather-only passes (``chute.pipeline.native_gather``): made on first use,
        kept across passes until ``close`` (a finalizer stops them when the Loader is garbage-collected)."""
        ring = self._ring
        if ring is None or self._ring_pid != os.getpid():  # (a forked child has none of its parent's threads)
            from chute.pipeline.build import MAX_DEPTH
            from chute.pipeline.native_gather import make_ring

            ring = self._ring = make_ring(self.dataset, threads, MAX_DEPTH)
            self._ring_pid = os.getpid()
            self._ring_finalizer = weakref.finalize(self, ring.close)
        else:
            ring.resize(threads)
        return ring

    def _process_pool(self) -> Any:
        """The worker processes (started on first use, kept across epochs until ``close``)."""
        if self._processes is None:
            from chute.pipeline.processes import ProcessPool

            self._processes = ProcessPool(
                self.dataset, self.order, self.chain, self.rank, self.world_size, workers=self.num_threads,
                depth=self.prefetch, blocks=self._pool, counters=self.counters, start_method=self._start_method,
            )
            self._processes_finalizer = weakref.finalize(self, self._processes.close)
        return self._processes

    def close(self) -> None:
        """Stop the worker threads or processes (kept across passes until now) and a progressive filler."""
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()
        if self._pass is not None:
            self._pass.on(Event.CLOSE)
            self._pass.close()
        if self._progressive is not None:
            self._progressive.close()
        if self._threads is not None:
            self._threads_finalizer.detach()
            stuck = self._threads.shutdown()
            self._threads = None
            if stuck:
                log.warning("chute: %d loader thread(s) still busy after close: %s", len(stuck), [t.name for t in stuck])
        if self._ring is not None:
            self._ring_finalizer.detach()
            self._ring.close()
            self._ring = None
        if self._kept is not None:
            self._kept_finalizer.detach()
            stuck = self._kept.stop()
            self._kept = None
            if stuck:
                log.warning("chute: %d stage thread(s) still busy after close: %s", len(stuck), [t.name for t in stuck])
        if self._processes is not None:
            self._processes_finalizer.detach()
            self._processes.close()
            self._processes = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ measurement (docs/observe.md)

    def report(self, since: str = "pass") -> Any:
        """Why the training loop waits for data, if it does: a :class:`chute.observe.report.Report`.

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
            "inline": tuner is not None and tuner.policy.inline,  # the loop builds the batches (docs/observe.md)
            "autotune": tuner is not None,
            "tuned": [] if tuner is None else [n for n, on in (("threads", tuner.policy.tune_threads), ("prefetch", tuner.policy.tune_depth)) if on],
            "workers": self.workers.kind,
            "max_threads": self.max_threads,
            "max_prefetch_bytes": self.max_prefetch_bytes,
        }
        return self._meter.report(settings, self.cpu_budget, self.workers.kind, since)

    def trace(self, path: str | os.PathLike, batches: int | None = None) -> str:
        """Write a Chrome trace (Perfetto, chrome://tracing) of the last batches to ``path``; return the path."""
        if self.counters is None:
            raise ChuteError("this Loader was made with _counters=False: it has no trace to write")
        from chute.observe.trace import write_trace

        return write_trace(self.counters, path, batches)

    def __repr__(self) -> str:
        return (
            f"chute.Loader({getattr(self.dataset, 'root', self.dataset)!r}, batch_size={self.batch_size}, "
            f"shuffle={self.order.shuffle}, rank={self.rank}/{self.world_size}, workers={self.workers.kind}, "
            f"threads={self.num_threads}, prefetch={self.prefetch})"
        )


def _describe_pass(run: Any) -> Any:
    """What ``run`` is doing, for the hang watchdog (a function of the pass: the watchdog holds no Loader)."""
    from chute.pipeline.probe import describe

    return describe(run.loader, run)
