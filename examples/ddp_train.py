"""Plain DistributedDataParallel on CPU (gloo), fed by chute.Loader, stopped mid-epoch and resumed.

    python examples/ddp_train.py --data /tmp/chute-example --checkpoint /tmp/ckpt.pt --stop-at 1:3
    python examples/ddp_train.py --data /tmp/chute-example --checkpoint /tmp/ckpt.pt --resume

The first command trains 2 ranks (``--world-size``) and stops after step 3 of
epoch 1, as a preempted job would, having saved a checkpoint after that step;
the second continues from it with exactly the next batch. The Loader takes its
rank and world size from ``torch.distributed``; every rank delivers the same
number of batches, and ``loader.state_dict()`` (a few numbers, the same on every
rank) is the position of the whole job in the epoch's global order, so rank 0's
is the one to save. The processes are started here with
``torch.multiprocessing.spawn``; under ``torchrun`` (RANK and WORLD_SIZE set)
the script runs as the rank it is given.

``--record FILE`` writes, per rank, the sample ids each epoch trained on (JSON;
a resumed run appends to it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket

import numpy as np
import torch
import torch.distributed as dist

import chute


def example_dataset(path: str, rows: int) -> chute.Dataset:
    """The dataset at ``path``; a small one made there first if there is none (16 features, a label, an id)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return chute.open(path)
    rng = np.random.default_rng(0)
    samples = ({"x": rng.standard_normal(16, dtype=np.float32), "y": np.float32(i % 2), "id": i} for i in range(rows))
    return chute.write(samples, path, shard_size="64KB")


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    loader = None
    try:
        ds = chute.open(args.data)
        loader = chute.Loader(ds, args.batch_size, shuffle=True, seed=0, drop_last=True)  # rank, world size: from dist
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        if args.resume:
            checkpoint = torch.load(args.checkpoint, weights_only=True)
            model.module.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            loader.load_state_dict(checkpoint["loader"])  # the epoch and the position in it
        stop_epoch, stop_step = (int(v) for v in args.stop_at.split(":")) if args.stop_at else (-1, -1)
        seen: dict[int, list[int]] = {}
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            for step, batch in enumerate(loader):
                seen.setdefault(epoch, []).extend(batch["id"].tolist())
                optimizer.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch["x"]).squeeze(1), batch["y"])
                loss.backward()  # DDP averages the gradients over the ranks
                optimizer.step()
                if (epoch, step) == (stop_epoch, stop_step):
                    if rank == 0:
                        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
                        torch.save(state, args.checkpoint + ".tmp")
                        os.replace(args.checkpoint + ".tmp", args.checkpoint)  # never a half-written checkpoint
                    print(f"rank {rank}: stopped after step {step} of epoch {epoch}", flush=True)
                    record(seen, rank, world_size, args.record)
                    dist.barrier()  # every rank is done with the process group before any rank destroys it
                    return
            if rank == 0:
                print(f"epoch {epoch} done: loss {loss.item():.4f}", flush=True)
        record(seen, rank, world_size, args.record)
        dist.barrier()  # every rank is done with the process group before any rank destroys it
    finally:
        if loader is not None:
            loader.close()  # its threads end here, not in the interpreter's shutdown
        # DDP keeps the last gradient all-reduce's gloo work (and its tensors) in reference cycles:
        # free them now, before the process group goes and while the interpreter is whole (freed
        # during its shutdown instead, they abort the process now and then).
        model = optimizer = None
        gc.collect()
        dist.destroy_process_group()


def record(seen: dict[int, list[int]], rank: int, world_size: int, path: str | None) -> None:
    """Append what each rank trained on to ``path`` (rank 0 writes what all ranks send it)."""
    if path is None:
        return
    everyone: list[dict[int, list[int]] | None] = [None] * world_size
    dist.all_gather_object(everyone, seen)
    if rank != 0:
        return
    runs = []
    if os.path.exists(path):
        with open(path) as f:
            runs = json.load(f)
    runs.append([{str(epoch): ids for epoch, ids in ranks.items()} for ranks in everyone])
    with open(path, "w") as f:
        json.dump(runs, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="a chute dataset (made there if the folder has none)")
    parser.add_argument("--rows", type=int, default=4096, help="rows of the dataset made when there is none")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint", default="ddp_checkpoint.pt")
    parser.add_argument("--stop-at", help="EPOCH:STEP: save a checkpoint after that step and stop")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--record", help="append the ids each rank trained on, per epoch, to this JSON file")
    args = parser.parse_args()

    example_dataset(args.data, args.rows)
    if "RANK" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.multiprocessing.spawn(train, args=(args.world_size, args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
