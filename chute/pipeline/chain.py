"""The chain of a Loader's passes: chute's stages and the user's, in order, by where they run.

    order ─► [read wait] ─► read (pack) ─► [transform] ─► [batch_transform] ─► user "workers" stages    (one task per batch, on the workers)
          ─► user "thread" stages ─► [device]                                                     (each on a thread of its own, in order)
          ─► user "loop" stages                                                                  (in the training loop's thread)

A batch moves from the workers to the threads to the loop, never back, so the
user's stages are given in that order (:func:`plan` says which stage breaks
it). The Loader's function arguments are sugar: ``transform=`` (and
``collate=``) is the :class:`~chute.pipeline.transform.Transform` stage,
``batch_transform=`` a :class:`~chute.pipeline.stage.BatchStage` named
``batch_transform`` on the workers, ``device=`` the device copy after the
thread stages. Pure: made once per Loader, no threads; the stages that depend
on a pass (the gather of its epoch's dataset, the wait for its downloads) are
made by :meth:`Chain.worker_stages` when the pass starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute.pipeline.gather import Gather, ShardWait, gather_name
from chute.pipeline.stage import BatchStage, Stage, batch_stages
from chute.pipeline.transform import Functions, Transform

#: Names of chute's own stages and counters: a user's stage takes another.
RESERVED = ("fetch", "order", "read", "pack", "transform", "device", "workers", "wait", "compute")
_RANK = {"workers": 0, "thread": 1, "loop": 2}


@dataclasses.dataclass(frozen=True)
class Chain:
    """The stages of every pass of one Loader (see the module docstring)."""

    fns: Functions  # the transform sugar (the Transform stage is made per pass: it names the pass's shards)
    workers: tuple[BatchStage, ...]  # after the transform, on the workers: batch_transform, then the user's
    threads: tuple[BatchStage, ...]  # each on a thread of its own, before the device copy
    loop: tuple[Stage, ...]  # in the loop, after the device copy
    device: bool  # whether the device copy runs (device=)
    columnar: bool = False

    def names(self, dataset: Any = None) -> list[str]:
        """Every stage's name (its report row), in the order a batch meets them (over ``dataset``)."""
        names = ["order", gather_name(dataset)]
        if self.fns.transforms:
            names.append("transform")
        names += [s.name for s in self.workers] + [s.name for s in self.threads]
        if self.device:
            names.append("device")
        return names + [s.name for s in self.loop]

    @property
    def gil_free(self) -> bool | None:
        """Whether the work of a batch runs without the GIL (the autotuner then starts at one thread per CPU):
        every stage on the workers after the gather says so (a transform object with ``gil_free = True``, as
        chute.images' decoders, a BatchStage made with ``gil=False``). None without such stages: the gather's
        own columns decide (fixed-size ones are one native call)."""
        gils = [s.gil for s in self.workers]
        if self.fns.transforms:
            gils.append(getattr(self.fns.transform, "gil_free", False) is not True or self.fns.collate is not None)
        return None if not gils else not any(gils)

    @property
    def gather_only(self) -> bool:
        """No stage on the workers but the gather (and the root)."""
        return not self.fns.transforms and not self.workers

    @property
    def pulls(self) -> bool:
        """Whether a stage runs in the loop (the loop then pulls each batch through them)."""
        return bool(self.loop)

    def worker_stages(self, dataset: Any, seed: int, fetcher: Any = None) -> list[BatchStage]:
        """The stages of one pass on the workers, in order (``fetcher``: a remote dataset's downloader to wait for)."""
        stages: list[BatchStage] = [] if fetcher is None else [ShardWait(fetcher, dataset)]
        stages.append(Gather(dataset, self.columnar))
        if self.fns.transforms:
            stages.append(Transform(self.fns, dataset, seed))
        return stages + list(self.workers)


def plan(fns: Functions, stages: Any, device: bool, columnar: bool = False) -> Chain:
    """The chain of a Loader with these functions, ``stages=`` and device, checked (each error says what to change)."""
    given = batch_stages(stages)
    sugar: list[BatchStage] = []
    if fns.batch_transform is not None:
        sugar.append(BatchStage(fns.batch_transform, name="batch_transform", where="workers"))
    seen: dict[str, Stage] = {}
    for stage in given:
        if stage.name in RESERVED or stage.name == "batch_transform" and sugar:
            raise ValueError(f"a stage is named {stage.name!r}, the name of one of chute's own: give it another name= (report rows are by name)")
        if stage.name in seen:
            raise ValueError(f"two stages are named {stage.name!r}: give each its own name= (report rows are by name)")
        seen[stage.name] = stage
    for before, after in zip(given, given[1:]):
        if _RANK[after.where] < _RANK[before.where]:
            raise ValueError(
                f"stage {after.name!r} runs where={after.where!r} but comes after {before.name!r} (where={before.where!r}): "
                "a batch goes from the workers to threads of their own to the loop, never back; list the stages in that order"
            )
    return Chain(
        fns,
        workers=tuple(sugar) + tuple(s for s in given if s.where == "workers"),  # type: ignore[misc]
        threads=tuple(s for s in given if s.where == "thread"),  # type: ignore[misc]
        loop=tuple(s for s in given if s.where == "loop"),
        device=device,
        columnar=columnar,
    )
