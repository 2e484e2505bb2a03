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


def write(path: str) -> chute.Dataset:
    samples = ({"image": np.zeros((3, 32, 32), np.uint8), "label": i} for i in range(10))
    return chute.write(samples, path, overwrite=True)


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
