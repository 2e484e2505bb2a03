"""A tiny causal language model trained with DistributedDataParallel (gloo, CPU) on a token dataset, stopped and resumed.

    python examples/tokens_ddp.py --data /tmp/chute-tokens --checkpoint /tmp/lm.pt --stop-at 0:3
    python examples/tokens_ddp.py --data /tmp/chute-tokens --checkpoint /tmp/lm.pt --resume

The data is a token dataset (``chute.tokens.write``; made at ``--data`` when
there is none: documents that count upwards, so the model has something to
learn) read as packed sequences of ``--seq-len`` tokens
(``chute.tokens.sequences(..., pack="documents")``: ``input_ids``, ``labels``,
``position_ids``, ``cu_seqlens``). Several documents share a row, so the model
attends within documents only: a block-diagonal causal mask built from
``cu_seqlens`` (:func:`document_mask`) for PyTorch's scaled_dot_product_attention,
positions restarting at every document (``position_ids``), and no loss where a
label would cross a document's end (``labels`` are -100 there). A plain causal
mask would let every token see the documents packed before it in its row.
The first command trains 2 ranks and stops after step 3 of
epoch 0 with a checkpoint, as a preempted job would; the second continues from
it with exactly the next batch. ``loader.state_dict()`` is the same small dict
on every rank, so rank 0 saves it. ``--record FILE`` appends, per rank, the
first token of every sequence each epoch trained on (JSON).
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

VOCAB = 256


def example_corpus(path: str, documents: int) -> chute.Dataset:
    """The token dataset at ``path``; made there first if there is none (documents counting upwards, then eos)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return chute.open(path)
    rng = np.random.default_rng(0)
    docs = [(int(rng.integers(0, VOCAB - 1)) + np.arange(int(rng.integers(5, 120)))) % (VOCAB - 1) for _ in range(documents)]
    return chute.tokens.write(docs, path, vocab_size=VOCAB, eos_id=VOCAB - 1, shard_size="16KB")


def document_mask(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """A ``[batch, 1, seq_len, seq_len]`` boolean mask for ``scaled_dot_product_attention`` (True: may attend):
    position ``i`` of a row attends to position ``j`` only if ``j <= i`` and both lie in the same piece, the pieces
    being what ``cu_seqlens`` bounds over the flattened batch (each document piece, and the padding run)."""
    flat = torch.arange(batch * seq_len, device=cu_seqlens.device)
    piece = torch.searchsorted(cu_seqlens[1:].to(torch.int64), flat, right=True).view(batch, seq_len)
    same = piece[:, :, None] == piece[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=cu_seqlens.device).tril()
    return (same & causal)[:, None]


class Block(torch.nn.Module):
    """One pre-norm transformer block whose attention takes an explicit mask (PyTorch's SDPA)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    """Embeddings (token + position), one causal self-attention block confined to documents, a head."""

    def __init__(self, dim: int = 32, seq_len: int = 64) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, dim)
        self.positions = torch.nn.Embedding(seq_len, dim)
        self.block = Block(dim, heads=2)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        mask = document_mask(cu_seqlens, *input_ids.shape)
        return self.head(self.block(self.tokens(input_ids) + self.positions(position_ids), mask))


def train(rank: int, world_size: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    loader = model = optimizer = None
    try:
        torch.manual_seed(0)
        view = chute.tokens.sequences(args.data, args.seq_len, pack="documents")
        loader = chute.Loader(view, args.batch_size, shuffle=True, seed=0, drop_last=True)  # rank, world size: from dist
        model = torch.nn.parallel.DistributedDataParallel(TinyLM(seq_len=args.seq_len))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        if args.resume:
            checkpoint = torch.load(args.checkpoint, weights_only=True)
            model.module.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            loader.load_state_dict(checkpoint["loader"])
        stop_epoch, stop_step = (int(v) for v in args.stop_at.split(":")) if args.stop_at else (-1, -1)
        seen: dict[int, list[int]] = {}
        while loader.epoch < args.epochs:
            epoch = loader.epoch
            for step, batch in enumerate(loader):
                seen.setdefault(epoch, []).extend(batch["input_ids"][:, 0].tolist())
                logits = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
                # labels are -100 at padding and at each document's last token: no loss there
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if (epoch, step) == (stop_epoch, stop_step):
                    if rank == 0:
                        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
                        torch.save(state, args.checkpoint + ".tmp")
                        os.replace(args.checkpoint + ".tmp", args.checkpoint)
                    print(f"rank {rank}: stopped after step {step} of epoch {epoch}", flush=True)
                    record(seen, rank, world_size, args.record)
                    dist.barrier()
                    return
            if rank == 0:
                print(f"epoch {epoch} done: loss {loss.item():.4f}", flush=True)
        record(seen, rank, world_size, args.record)
        dist.barrier()
    finally:
        if loader is not None:
            loader.close()
        model = optimizer = None  # DDP's last gloo work sits in reference cycles: free it before the group goes
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
    parser.add_argument("--data", required=True, help="a token dataset (made there if the folder has none)")
    parser.add_argument("--documents", type=int, default=400, help="documents of the dataset made when there is none")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--checkpoint", default="lm_checkpoint.pt")
    parser.add_argument("--stop-at", help="EPOCH:STEP: save a checkpoint after that step and stop")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--record", help="append the first token of each sequence each rank trained on to this JSON file")
    args = parser.parse_args()

    example_corpus(args.data, args.documents)
    if "RANK" in os.environ:  # started by torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.multiprocessing.spawn(train, args=(args.world_size, args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
