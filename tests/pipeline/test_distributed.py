"""Two real ranks (torch.distributed, gloo) share one epoch: each sample once, equal batch counts,
exact resume, also from two ranks into one process (issue 3, part 3).

The ranks are spawned processes that build their Loaders without ``rank`` or
``world_size``: the Loader must take them from the initialised process group.
Each records the ``id`` column (= the row's index in the dataset) of every batch
and writes it to a JSON file that the tests below check against ``chute.order``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import chute
from chute.order import Order

N = 2999  # the last step is partial: 2999 = 93 * (16 * 2) + 23, so 2 ranks get 12 rows each, 1 of them padding
SHARD_SIZE = 2400  # bytes: 300 int64 rows, 10 shards
BATCH = 16
SEED = 1234
WORLD = 2
STOP_AFTER = 37  # batches each rank delivers before the checkpoint
TIMEOUT = 60.0  # seconds for the two ranks together; a hang fails the test instead of blocking


# ---------------------------------------------------------------------------- inside each rank


def _ids(batch) -> list[int]:
    return batch["id"].tolist()


def _epoch_and_resume(root: str) -> dict:
    """What one rank delivers: a whole epoch, then the same epoch stopped and resumed."""
    import torch.distributed as dist

    ds = chute.open(root)
    whole = chute.Loader(ds, BATCH, shuffle=True, seed=SEED, workers=2)
    length = len(whole)
    epoch = [_ids(b) for b in whole]
    state_after_epoch = whole.state_dict()

    first = chute.Loader(ds, BATCH, shuffle=True, seed=SEED, workers=3)
    head, batches = [], iter(first)
    for batch in batches:
        head.append(_ids(batch))
        if len(head) == STOP_AFTER:
            break
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    batches.close()

    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)  # every rank must save the same position

    second = chute.Loader(ds, BATCH, shuffle=True, seed=SEED, workers=1)
    second.load_state_dict(state)
    resumed_length = len(second)
    tail = [_ids(b) for b in second]
    return {
        "placement": [whole.rank, whole.world_size, second.rank, second.world_size],
        "len": length,
        "epoch": epoch,
        "state_after_epoch": state_after_epoch,
        "head": head,
        "state": state,
        "states": states,
        "resumed_len": resumed_length,
        "tail": tail,
    }


def _rank_main(rank: int, port: int, root: str, out_dir: str) -> None:
    """Entry point of a spawned rank: results to ``rank<r>.json``, a traceback to ``rank<r>.error``."""
    out = Path(out_dir)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
        )
        try:
            result = _epoch_and_resume(root)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        tmp = out / f"rank{rank}.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.rename(out / f"rank{rank}.json")
    except BaseException:
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


# ---------------------------------------------------------------------------- in the test process


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(root: Path, out: Path) -> list[dict]:
    """Spawn the ranks, wait at most ``TIMEOUT`` seconds, kill whatever is left, return their results."""
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, str(root), str(out)), daemon=True) for r in range(WORLD)]
    deadline = time.monotonic() + TIMEOUT
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    errors = "\n".join(f.read_text() for f in sorted(out.glob("rank*.error")))
    assert not hung, f"rank(s) {hung} still running after {TIMEOUT:.0f} s (killed)\n{errors}"
    assert [p.exitcode for p in procs] == [0] * WORLD, f"exit codes {[p.exitcode for p in procs]}\n{errors}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> chute.Dataset:
    root = tmp_path_factory.mktemp("distributed") / "ds"
    return chute.write(({"id": i} for i in range(N)), root, shard_size=SHARD_SIZE)


@pytest.fixture(scope="module")
def ranks(dataset, tmp_path_factory) -> list[dict]:
    return _run_ranks(Path(dataset.root), tmp_path_factory.mktemp("ranks"))


@pytest.fixture(scope="module")
def order(dataset) -> Order:
    return Order(tuple(s.rows for s in dataset.shards), BATCH, shuffle=True, seed=SEED)


def _counts(batches_per_rank) -> np.ndarray:
    rows = [i for batches in batches_per_rank for batch in batches for i in batch]
    return np.bincount(np.asarray(rows, dtype=np.int64), minlength=N)


def _once_plus_padding(order: Order, world_size: int, consumed: int = 0) -> np.ndarray:
    """Each sample once, plus the padding of the last step of a pass of ``world_size`` ranks from ``consumed``."""
    g = order.global_order(0)
    rest = (N - consumed) % (BATCH * world_size)
    padding = -(-rest // world_size) * world_size - rest
    counts = np.ones(N, dtype=np.int64)
    np.add.at(counts, g[np.arange(padding) % N], 1)
    return counts


def test_dataset_has_several_shards(dataset) -> None:
    assert len(dataset) == N and len(dataset.shards) >= 5
    assert dataset[1234]["id"] == 1234


def test_loader_takes_rank_and_world_size_from_the_process_group(ranks) -> None:
    assert [r["placement"] for r in ranks] == [[0, WORLD, 0, WORLD], [1, WORLD, 1, WORLD]]


def test_two_ranks_deliver_the_epoch_once_plus_padding(ranks, order) -> None:
    epochs = [r["epoch"] for r in ranks]
    assert len(epochs[0]) == len(epochs[1]) == ranks[0]["len"] == ranks[1]["len"] == order.num_batches(WORLD)
    counts = _counts(epochs)
    expected = _once_plus_padding(order, WORLD)
    assert expected.sum() == N + 1  # the documented padding: one row, position 0 of the order
    assert np.array_equal(counts, expected), f"missing {np.flatnonzero(counts < expected)[:10]}, extra {np.flatnonzero(counts > expected)[:10]}"
    for rank, batches in enumerate(epochs):  # and it is exactly the order, batch for batch
        assert batches == [b.tolist() for b in order.batches(0, rank, WORLD)]
    assert all(len(b) == BATCH for batches in epochs for b in batches[:-1])
    assert [len(batches[-1]) for batches in epochs] == [12, 12]
    for r in ranks:
        assert (r["state_after_epoch"]["epoch"], r["state_after_epoch"]["consumed"]) == (1, 0)


def test_both_ranks_resume_with_exactly_the_next_batch(ranks, order) -> None:
    consumed = STOP_AFTER * BATCH * WORLD
    for rank, r in enumerate(ranks):
        assert r["states"] == [r["state"]] * WORLD, "ranks saved different positions"
        assert (r["state"]["epoch"], r["state"]["consumed"]) == (0, consumed)
        assert len(r["head"]) == STOP_AFTER
        assert r["resumed_len"] == len(r["tail"]) == order.num_batches(WORLD) - STOP_AFTER
        assert r["head"] + r["tail"] == r["epoch"], f"rank {rank}: the resumed run differs from the uninterrupted one"


def test_two_rank_state_resumes_in_one_process(ranks, dataset, order) -> None:
    state = ranks[0]["state"]
    loader = chute.Loader(dataset, BATCH, shuffle=True, seed=SEED, workers=2, rank=0, world_size=1)
    loader.load_state_dict(state)
    length = len(loader)
    assert length == order.num_batches(1, state["consumed"])
    tail = [_ids(b) for b in loader]
    assert len(tail) == length
    assert tail == [b.tolist() for b in order.batches(0, 0, 1, state["consumed"])]
    counts = _counts([ranks[0]["head"], ranks[1]["head"], tail])
    assert np.array_equal(counts, np.ones(N, dtype=np.int64)), "the epoch is not covered exactly once"
    assert loader.state_dict()["epoch"] == 1
