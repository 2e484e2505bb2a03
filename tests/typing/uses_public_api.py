"""A user's program, for the type checker only (.ci/run runs mypy on it; pytest does not collect it).

It calls the public API the way README.md and docs/ do; mypy checks every call
against chute's annotations, so an annotation that contradicts the documented
use fails CI. Nothing here runs.
"""

from __future__ import annotations

import numpy as np
import torch

import chute


def train(path: str) -> None:
    ds: chute.Dataset = chute.open(path)
    loader = chute.Loader(ds, batch_size=256, shuffle=True, seed=0, workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            images: torch.Tensor = batch["image"]
            images.float()
    state = loader.state_dict()
    resumed = chute.Loader(path, 256, shuffle=True, seed=0)
    resumed.load_state_dict(state)
    print(loader.report())
    loader.close()
    resumed.close()


def double(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**batch, "image": batch["image"] * 2}


class Count(chute.Stage):
    name = "count"

    def __init__(self) -> None:
        self.seen = 0

    def reset(self, state: dict | None = None) -> None:
        super().reset(state)
        self.source.reset(None if state is None else state["source"])
        self.seen = 0 if state is None else state["seen"]

    def next(self) -> dict[str, torch.Tensor]:
        batch = self.source.next()
        self.seen += 1
        return batch

    def state(self) -> dict:
        return {"source": self.source.state(), "seen": self.seen}


def stages(path: str) -> None:
    loader = chute.Loader(path, 256, stages=[chute.BatchStage(double, name="double", where="workers"), Count()])
    after = chute.BatchStage(double, name="again", where="loop", source=loader)
    for batch in after:
        batch["image"].sum()
    loader.load_state_dict(loader.state_dict())
    iterable = chute.TorchIterable(path, 256, stages=[chute.BatchStage(double, name="double")])
    len(iterable)
    chute.Loader(path, 256, shuffle=True, seed=0, transform=None, on_error="skip", rank=0, world_size=1)


def write(path: str) -> chute.Dataset:
    samples = ({"image": np.zeros((3, 32, 32), np.uint8), "label": i} for i in range(10))
    return chute.write(samples, path, overwrite=True, shard_size="64MB", compression=None)


def wrap(batches: list[dict[str, torch.Tensor]]) -> None:
    for batch in chute.to_device(batches, "cpu"):
        batch["x"].sum()
    for _ in chute.observe(batches):
        pass


def errors(path: str) -> str:
    try:
        chute.open(path)
    except chute.ManifestError as error:
        return str(error)
    except chute.ChuteError as error:
        return str(error)
    return chute.__version__
