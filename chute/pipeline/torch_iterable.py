"""``TorchIterable``: a chute dataset as a torch ``IterableDataset`` of whole batches.

For code that wants a plain ``torch.utils.data.DataLoader`` (Lightning, the HF
Trainer)::

    batches = chute.TorchIterable(ds, batch_size=256, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=4,
                                         persistent_workers=True)

Each item is one batch in chute's global order. DataLoader worker ``w`` of ``n``
builds steps ``w, w + n, w + 2n, ...``; the DataLoader takes one item from each
worker in turn, so the stream is the same whatever ``num_workers`` is.

Epochs. Every pass over the DataLoader (every ``iter()``) runs the next epoch,
as ``DataLoader(shuffle=True)`` draws a new order for every pass: Lightning and
the HF Trainer never call ``set_epoch`` on an ``IterableDataset``.
``set_epoch(n)`` always wins: the next pass runs epoch ``n``, and the passes
after it ``n + 1``, ``n + 2``, ... The workers learn the epoch from a small
shared-memory counter made with the dataset (:class:`EpochCounter`), so they
see it also when they persist across epoch (``persistent_workers=True``).

Resume. The iterator of a pass has ``state_dict()`` / ``load_state_dict()``,
the protocol ``torchdata.stateful_dataloader.StatefulDataLoader`` uses for
iterable datasets: it takes each worker's state with every batch and gives it
back to the same worker on ``load_state_dict``, so
``StatefulDataLoader(TorchIterable(...), batch_size=None, num_workers=k)``
resumes with exactly the next batch (with the same ``num_workers`` it saved with).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import TYPE_CHECKING, Any

import torch

from chute._arena import Arena
from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.pipeline.chain import plan
from chute.pipeline.config import refuse_habits
from chute.pipeline.indices import BatchIndices
from chute.pipeline.spec import LoaderSpec
from chute.pipeline.task import Task

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from chute.pipeline.spec import Options

#: DataLoader workers an :class:`EpochCounter` keeps a count for.
MAX_WORKERS = 256
# Slots of the shared counter: the base epoch, the workers of the DataLoader counted, then one count per worker.
_BASE, _WORKERS, _COUNTS = 0, 1, 2


class EpochCounter:
    """The epoch of each pass, agreed on by every DataLoader worker through shared memory.

    Made with the dataset, before any worker starts, so forked and spawned
    workers (persistent or not) share it. Worker ``w`` counts the passes it
    has joined: its ``k``-th ``iter()`` is pass ``k`` of the DataLoader, and a
    pass's epoch is the last ``set_epoch`` value plus the pass's number. A
    count per worker, not one per pass: a persistent worker that starts late
    (its first ``iter()`` after the other worker's second) still joins the pass
    it belongs to. A DataLoader with another number of workers starts after
    the furthest pass any worker reached.
    """

    def __init__(self, values: tuple[int, ...] | None = None) -> None:
        # A spawn-context lock also works in forked workers; a fork-context one cannot be sent to spawned ones.
        self._shared = multiprocessing.get_context("spawn").Array("q", list(values or [0] * (_COUNTS + MAX_WORKERS)))

    def __deepcopy__(self, memo: dict) -> EpochCounter:
        """A copy counts its own passes, from where this one is."""
        with self._shared.get_lock():
            return EpochCounter(tuple(self._shared[:]))

    def set(self, epoch: int) -> None:
        """The next pass runs ``epoch``."""
        s = self._shared
        with s.get_lock():
            s[_BASE] = epoch
            s[_COUNTS:] = [0] * MAX_WORKERS

    def join(self, worker: int, workers: int) -> int:
        """Worker ``worker`` of a DataLoader with ``workers`` workers starts a pass: that pass's epoch."""
        if workers > MAX_WORKERS:
            raise ChuteError(f"a TorchIterable counts passes for at most {MAX_WORKERS} DataLoader workers, got num_workers={workers}")
        s = self._shared
        with s.get_lock():
            if s[_WORKERS] != workers:  # another DataLoader: its first pass comes after every pass seen
                s[_COUNTS:] = [max(s[_COUNTS:])] * MAX_WORKERS
                s[_WORKERS] = workers
            number = s[_COUNTS + worker]
            s[_COUNTS + worker] = number + 1
            return s[_BASE] + number

    def resumed(self, worker: int, epoch: int) -> None:
        """The pass ``worker`` just joined is resuming ``epoch``: count the passes after it from there."""
        s = self._shared
        with s.get_lock():
            s[_BASE] = epoch - max(s[_COUNTS + worker] - 1, 0)

    def next_epoch(self) -> int:
        """The epoch a pass starting now would run (for the repr; no worker joins)."""
        s = self._shared
        with s.get_lock():
            return s[_BASE] + min(s[_COUNTS:_COUNTS + max(1, s[_WORKERS])])


class TorchIterable(torch.utils.data.IterableDataset):
    """Batches of a chute dataset, for ``DataLoader(..., batch_size=None)`` (see the module docstring)."""

    def __init__(self, dataset: Dataset | str | os.PathLike, batch_size: int, **options: Unpack[Options]) -> None:
        rest: dict[str, Any] = dict(options)
        self.spec = spec = LoaderSpec.of(dataset, batch_size, rest)
        refuse_habits(rest, "chute.TorchIterable")
        self.dataset, self.order, self.batch_size = spec.dataset, spec.order, spec.batch_size
        self.fns, self.rank, self.world_size = spec.fns, spec.rank, spec.world_size
        self.chain = plan(spec.fns, spec.stages, device=False)
        if self.chain.threads or self.chain.loop:
            stage = (self.chain.threads + self.chain.loop)[0]  # type: ignore[operator]
            raise ValueError(
                f"stage {stage.name!r} runs where={stage.where!r}: a TorchIterable runs its stages in the DataLoader's "
                "workers (where='workers'); run the others after the DataLoader"
            )
        self.epochs = EpochCounter()

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` in the next pass (the workers see it, persistent or not)."""
        self.epochs.set(int(epoch))

    def __len__(self) -> int:
        return self.order.num_batches(self.world_size)

    def __iter__(self) -> TorchIterablePass:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return TorchIterablePass(self, self.epochs.join(worker, workers), worker, workers)

    def __repr__(self) -> str:
        return (
            f"chute.TorchIterable({getattr(self.dataset, 'root', self.dataset)!r}, batch_size={self.batch_size}, "
            f"shuffle={self.order.shuffle}, rank={self.rank}/{self.world_size}, next epoch={self.epochs.next_epoch()})"
        )


class TorchIterablePass:
    """One worker's share of one pass: steps ``worker, worker + workers, ...`` of ``epoch``.

    Stateful in ``torchdata``'s sense: ``state_dict()`` is where this worker
    is (the epoch and the next step it builds), ``load_state_dict`` continues
    from there. Nothing is read before the first ``next()``.
    """

    def __init__(self, source: TorchIterable, epoch: int, worker: int, workers: int) -> None:
        self.source = source
        self.epoch, self.worker, self.workers = epoch, worker, workers
        self.step = worker  # the next step this worker builds
        self._task: Task | None = None

    def __iter__(self) -> TorchIterablePass:
        return self

    def __next__(self) -> Any:
        source = self.source
        steps = len(source)
        while self.step < steps:
            step, self.step = self.step, self.step + self.workers
            if self._task is None:  # the Loader's fused task, run here (its blocks are reused once the batch is dropped)
                seed = source.order.seed
                indices = BatchIndices(source.order, self.epoch, source.rank, source.world_size, 0)
                self._task = Task(
                    indices, source.chain.worker_stages(source.dataset, seed), self.epoch, seed, Arena(),
                    dataset=source.dataset, on_error=source.fns.on_error,
                )
                self._task.register(0)
            (batch, _, _), _ = self._task(step, time.perf_counter_ns(), 0)
            if batch is not None:
                return batch
        raise StopIteration

    def state_dict(self) -> dict[str, Any]:
        """This worker's position: the epoch, the next step it builds, and the order it follows."""
        state = self.source.order.state(self.epoch, 0)
        del state["consumed"]
        state.update(
            step=self.step, worker=self.worker, workers=self.workers,
            batch_size=self.source.batch_size, rank=self.source.rank, world_size=self.source.world_size,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this worker's :meth:`state_dict` from an earlier run)."""
        source = self.source
        try:
            epoch, _ = source.order.check_state({**state, "consumed": 0})
        except (KeyError, ValueError) as exc:
            raise ChuteError(f"cannot resume this TorchIterable: {exc}") from None
        saved = (state.get("batch_size"), state.get("rank"), state.get("world_size"))
        if saved != (source.batch_size, source.rank, source.world_size):
            raise ChuteError(
                f"cannot resume this TorchIterable: the state was saved with batch_size, rank, world_size = {saved}, "
                f"this one has {(source.batch_size, source.rank, source.world_size)}; use the same settings"
            )
        if (state.get("worker"), state.get("workers")) != (self.worker, self.workers):
            raise ChuteError(
                f"cannot resume this TorchIterable: the state is DataLoader worker {state.get('worker')} of "
                f"{state.get('workers')}'s, this is worker {self.worker} of {self.workers}; resume with the same num_workers"
            )
        self.epoch, self.step = epoch, int(state["step"])
        self._task = None
        source.epochs.resumed(self.worker, epoch)
