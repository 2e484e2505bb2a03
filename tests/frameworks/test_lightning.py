"""Lightning trains on chute for real (CPU, a tiny model): every epoch sees every sample once, in a new order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chute

pl = pytest.importorskip("pytorch_lightning")  # in the test extra; skipped only where it is not installed

N = 96


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("lightning") / "ds"
    samples = ({"x": np.full(4, i, np.float32), "y": np.float32(i % 2), "id": i} for i in range(N))
    return chute.write(samples, path, shard_size=600)


class Recorder(pl.LightningModule):
    """A linear model that records the sample ids of every batch it trains on, per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        prediction = self.layer(batch["x"]).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(prediction, batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(loader, epochs: int = 2) -> dict[int, list[int]]:
    model = Recorder()
    trainer = pl.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    return model.seen


def epoch_ids(ds, epoch: int, batch_size: int, seed: int) -> list[int]:
    reference = chute.Loader(ds, batch_size, shuffle=True, seed=seed)
    reference.set_epoch(epoch)
    return [i for b in reference for i in b["id"].tolist()]


def test_a_loader_under_lightning_reshuffles_every_epoch(ds):
    seen = fit(chute.Loader(ds, 16, shuffle=True, seed=1), epochs=3)
    assert sorted(seen) == [0, 1, 2]
    for epoch, ids in seen.items():
        assert ids == epoch_ids(ds, epoch, 16, seed=1)  # exactly chute's order of that epoch: each sample once
    assert seen[0] != seen[1] != seen[2] != seen[0]


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, True)])
def test_a_torch_iterable_under_lightning_reshuffles_every_epoch(ds, workers, persistent):
    batches = chute.TorchIterable(ds, 16, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers, persistent_workers=persistent)
    seen = fit(loader)
    assert sorted(seen) == [0, 1]
    assert seen[0] == epoch_ids(ds, 0, 16, seed=2) and seen[1] == epoch_ids(ds, 1, 16, seed=2)
    assert seen[0] != seen[1]
