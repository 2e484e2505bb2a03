"""Train with PyTorch Lightning on a chute dataset: a chute.Loader, or a TorchIterable in a DataLoader.

    python examples/lightning_train.py --data /tmp/chute-example      # makes a small dataset there if empty
    python examples/lightning_train.py --data /tmp/chute-example --source iterable --workers 2

Lightning asks for ``len(loader)`` batches each epoch and never calls
``set_epoch``. Both ways still give a new order every epoch, each sample once:

- ``chute.Loader``: a pass whose last batch has been delivered advances the
  loader's epoch, whether or not Lightning asks for the end of the iterator.
- ``chute.TorchIterable`` in a ``DataLoader(batch_size=None)``: every pass runs
  the next epoch, also with ``persistent_workers=True`` (the workers share the
  epoch counter).

``--record FILE`` writes the sample ids each epoch trained on, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytorch_lightning as pl
import torch

import chute


def example_dataset(path: str, rows: int) -> chute.Dataset:
    """The dataset at ``path``; a small one made there first if there is none (16 features, a label, an id)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return chute.open(path)
    rng = np.random.default_rng(0)
    samples = ({"x": rng.standard_normal(16, dtype=np.float32), "y": np.float32(i % 2), "id": i} for i in range(rows))
    return chute.write(samples, path, shard_size="64KB")


class Classifier(pl.LightningModule):
    """A linear classifier that notes the ids of the samples each epoch trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        logits = self.layer(batch["x"]).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["y"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def make_loader(ds: chute.Dataset, source: str, batch_size: int, workers: int) -> object:
    if source == "loader":
        return chute.Loader(ds, batch_size, shuffle=True, seed=0)
    batches = chute.TorchIterable(ds, batch_size, shuffle=True, seed=0)
    return torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a chute dataset (made there if the folder has none)")
    parser.add_argument("--rows", type=int, default=4096, help="rows of the dataset made when there is none")
    parser.add_argument("--source", choices=["loader", "iterable"], default="loader")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (--source iterable)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--record", help="write the ids each epoch trained on to this JSON file")
    args = parser.parse_args()

    ds = example_dataset(args.data, args.rows)
    model = Classifier()
    trainer = pl.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=make_loader(ds, args.source, args.batch_size, args.workers))
    for epoch, ids in sorted(model.seen.items()):
        print(f"epoch {epoch}: {len(ids)} samples, {len(set(ids))} distinct, first ids {ids[:5]}")
    if args.record:
        with open(args.record, "w") as f:
            json.dump({str(epoch): ids for epoch, ids in model.seen.items()}, f)


if __name__ == "__main__":
    main()
