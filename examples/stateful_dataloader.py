"""A DataLoader that checkpoints mid-epoch: torchdata's StatefulDataLoader over chute.TorchIterable.

    python examples/stateful_dataloader.py --data /tmp/chute-example --checkpoint /tmp/sdl.pt --stop-at 0:5
    python examples/stateful_dataloader.py --data /tmp/chute-example --checkpoint /tmp/sdl.pt --resume

``StatefulDataLoader.state_dict()`` asks each DataLoader worker where its
iterator is; a ``TorchIterable`` pass answers with its epoch and the next step
that worker builds. Saved with the model, it lets a restarted job continue
with exactly the next batch (resume with the same ``--workers``). The first
command stops after step 5 of epoch 0 with a checkpoint saved; the second
finishes the run from there.

``--record FILE`` appends the sample ids each epoch trained on (JSON).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import chute


def example_dataset(path: str, rows: int) -> chute.Dataset:
    """The dataset at ``path``; a small one made there first if there is none (16 features, a label, an id)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return chute.open(path)
    rng = np.random.default_rng(0)
    samples = ({"x": rng.standard_normal(16, dtype=np.float32), "y": np.float32(i % 2), "id": i} for i in range(rows))
    return chute.write(samples, path, shard_size="64KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a chute dataset (made there if the folder has none)")
    parser.add_argument("--rows", type=int, default=4096, help="rows of the dataset made when there is none")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint", default="stateful_checkpoint.pt")
    parser.add_argument("--stop-at", help="EPOCH:STEP: save a checkpoint after that step and stop")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--record", help="append the ids each epoch trained on to this JSON file")
    args = parser.parse_args()

    ds = example_dataset(args.data, args.rows)
    batches = chute.TorchIterable(ds, args.batch_size, shuffle=True, seed=0)
    loader = StatefulDataLoader(batches, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    first_epoch = 0
    if args.resume:
        checkpoint = torch.load(args.checkpoint, weights_only=True)  # the loader state is plain numbers and strings
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        first_epoch = checkpoint["epoch"]
    stop_epoch, stop_step = (int(v) for v in args.stop_at.split(":")) if args.stop_at else (-1, -1)

    seen: dict[int, list[int]] = {}
    for epoch in range(first_epoch, args.epochs):
        for step, batch in enumerate(loader):  # a resumed epoch starts at the next batch; `step` counts from there
            seen.setdefault(epoch, []).extend(batch["id"].tolist())
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch["x"]).squeeze(1), batch["y"])
            loss.backward()
            optimizer.step()
            if (epoch, step) == (stop_epoch, stop_step):
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict(), "epoch": epoch}
                torch.save(state, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)  # never a half-written checkpoint
                print(f"stopped after step {step} of epoch {epoch}", flush=True)
                record(seen, args.record)
                return
        print(f"epoch {epoch} done: loss {loss.item():.4f}", flush=True)
    record(seen, args.record)


def record(seen: dict[int, list[int]], path: str | None) -> None:
    if path is None:
        return
    runs = []
    if os.path.exists(path):
        with open(path) as f:
            runs = json.load(f)
    runs.append({str(epoch): ids for epoch, ids in seen.items()})
    with open(path, "w") as f:
        json.dump(runs, f)


if __name__ == "__main__":
    main()
