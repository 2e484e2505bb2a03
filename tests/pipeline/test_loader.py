"""The Loader delivers the global order exactly, resumes at the next batch, and leaves nothing running."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import textwrap
import threading
import traceback

import numpy as np
import pytest
import torch

import chute
from chute.pipeline.transform import TransformError

N = 1000


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "ds"
    samples = ({"x": np.full(3, i, np.int32), "id": i, "name": f"s{i}"} for i in range(N))
    return chute.write(samples, path, shard_size=2000)  # ~12 shards


def ids(batches) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def loader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("chute-loader", "chute-device"))]


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    assert loader_threads() == []


def test_unshuffled_epoch_is_dataset_order(ds):
    loader = chute.Loader(ds, 64)
    batches = list(loader)
    assert len(batches) == len(loader) == 16
    assert ids(batches) == list(range(N))
    assert [len(b["id"]) for b in batches] == [64] * 15 + [N - 15 * 64]
    first = batches[0]
    assert first["x"].shape == (64, 3) and first["x"].dtype == torch.int32
    assert torch.equal(first["x"][:, 0], first["id"].to(torch.int32))
    assert first["name"][:3] == ["s0", "s1", "s2"]


def test_shuffled_epochs_cover_everything_once_and_differ(ds):
    loader = chute.Loader(ds, 50, shuffle=True, seed=3)
    epoch0, epoch1 = ids(loader), ids(loader)  # a finished pass advances the epoch
    assert sorted(epoch0) == sorted(epoch1) == list(range(N))
    assert epoch0 != epoch1
    again = chute.Loader(ds, 50, shuffle=True, seed=3, workers=1)
    again.set_epoch(1)
    assert ids(again) == epoch1  # the order depends on (seed, epoch), not on threads
    assert ids(chute.Loader(ds, 50, shuffle=True, seed=4)) != epoch0


def test_order_matches_chute_order(ds):
    loader = chute.Loader(ds, 32, shuffle=chute.Shuffle(window=2), seed=9)
    expected = [int(i) for b in loader.order.batches(0) for i in b]
    assert ids(loader) == expected


@pytest.mark.parametrize("stop_after", [0, 1, 7, 15])
def test_resume_continues_with_exactly_the_next_batch(ds, stop_after):
    full = chute.Loader(ds, 64, shuffle=True, seed=1, workers=chute.Workers(count=2, prefetch=8))
    full.set_epoch(2)
    reference = [b["id"].tolist() for b in full]

    first = chute.Loader(ds, 64, shuffle=True, seed=1, workers=chute.Workers(count=2, prefetch=8))
    first.set_epoch(2)
    received = []
    iterator = iter(first)
    for _ in range(stop_after):
        received.append(next(iterator)["id"].tolist())
    state = first.state_dict()  # what was received, not what the 8 prefetched batches hold
    assert state["epoch"] == 2 and state["consumed"] == 64 * stop_after
    del iterator

    second = chute.Loader(ds, 64, shuffle=True, seed=1, workers=chute.Workers(count=1, prefetch=1))
    second.load_state_dict(state)
    assert len(second) == len(reference) - stop_after
    received += [b["id"].tolist() for b in second]
    assert received == reference
    assert second.state_dict()["epoch"] == 3 and second.state_dict()["consumed"] == 0


def test_resume_on_another_world_size_covers_the_epoch_once(ds):
    def rank_loaders(world):
        return [chute.Loader(ds, 16, shuffle=True, seed=5, rank=r, world_size=world) for r in range(world)]

    before = rank_loaders(3)
    iterators = [iter(loader) for loader in before]
    delivered = []
    for _ in range(7):  # every rank takes 7 steps
        for it in iterators:
            delivered += next(it)["id"].tolist()
    states = [loader.state_dict() for loader in before]
    assert all(s == states[0] for s in states) and states[0]["consumed"] == 7 * 16 * 3
    del iterators

    after = rank_loaders(2)
    for loader in after:
        loader.load_state_dict(states[0])
    counts = [len(loader) for loader in after]
    assert counts[0] == counts[1]
    rest = [ids(loader) for loader in after]
    assert [len(r) for r in rest] == [len(rest[0])] * 2
    delivered += rest[0] + rest[1]
    # every sample once, plus padding of the last step (repeats of the epoch's first rows)
    assert set(delivered) == set(range(N))
    padding = len(delivered) - N
    assert 0 <= padding < 2
    assert np.bincount(delivered).max() <= 2


def test_state_from_another_seed_is_refused(ds):
    state = chute.Loader(ds, 10, shuffle=True, seed=1).state_dict()
    with pytest.raises(chute.ChuteError, match="seed=1.*seed=2"):
        chute.Loader(ds, 10, shuffle=True, seed=2).load_state_dict(state)


def test_break_then_iterate_restarts_the_epoch(ds):
    loader = chute.Loader(ds, 100, shuffle=True, seed=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert loader.state_dict()["consumed"] == 400  # the checkpoint position is still reported
    assert ids(loader) == ids(chute.Loader(ds, 100, shuffle=True, seed=2))


def test_transforms_per_sample_and_per_batch(ds):
    def double(sample):
        return {"x": sample["x"] * 2, "id": sample["id"], "upper": sample["name"].upper()}

    loader = chute.Loader(ds, 10, transform=double, batch_transform=lambda b: {**b, "n": len(b["id"])})
    batch = next(iter(loader))
    assert batch["x"][:, 0].tolist() == [2 * i for i in range(10)]
    assert batch["upper"][:2] == ["S0", "S1"] and batch["n"] == 10
    collated = next(iter(chute.Loader(ds, 4, collate=lambda samples: [s["id"] for s in samples])))
    assert collated == [0, 1, 2, 3]


def _explode_on_17(sample):
    if sample["id"] == 17:
        raise ValueError("bad pixel")
    return sample


def test_transform_error_names_sample_and_shard_with_original_traceback(ds):
    received = []
    with chute.Loader(ds, 10, transform=_explode_on_17) as loader, pytest.raises(TransformError) as error:
        for batch in loader:
            received.append(batch)
    assert len(received) == 1  # batch 0 arrived, batch 1 (rows 10-19) failed
    shard, row = ds.locate(17)
    message = str(error.value)
    assert "sample 17" in message and ds.shards[shard].file in message and f"row {row}" in message
    assert "bad pixel" in message and "on_error='skip'" in message
    assert isinstance(error.value, chute.ChuteError)
    cause = error.value.__cause__
    assert isinstance(cause, ValueError)
    assert "_explode_on_17" in "".join(traceback.format_tb(cause.__traceback__))


def test_on_error_skip_counts_and_reports(ds, caplog):
    loader = chute.Loader(ds, 10, transform=_explode_on_17, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="chute"):
        got = ids(loader)
    assert got == [i for i in range(N) if i != 17]
    assert loader.skipped == [17]
    assert "skipped 1 sample(s)" in caplog.text


@pytest.mark.parametrize("how", ["break", "del", "exception", "exhaust"])
def test_threads_are_kept_across_passes_and_stop_with_the_loader(ds, how):
    """However a pass ends, its threads stay the loader's (the next pass reuses them); they stop when the
    loader goes out of scope (no reference cycle keeps it: no garbage collection needed)."""
    loader = chute.Loader(ds, 10, workers=chute.Workers(count=3, prefetch=6))
    iterator = iter(loader)
    next(iterator)
    assert len(loader_threads()) == 3
    idents = sorted(loader._threads.idents)
    if how == "break":
        for _ in iterator:
            break
        iterator.close()
    elif how == "del":
        del iterator
    elif how == "exception":
        with pytest.raises(RuntimeError):
            for _ in iterator:
                raise RuntimeError("training step failed")
        del iterator
    else:
        list(iterator)
    assert len(loader_threads()) == 3
    assert [int(i) for b in loader for i in b["id"]] == list(range(N))  # a whole pass, on the same threads
    assert sorted(loader._threads.idents) == idents
    del loader
    assert loader_threads() == []


def test_close_stops_the_threads_and_a_later_pass_starts_new_ones(ds):
    loader = chute.Loader(ds, 10, workers=2)
    assert len(list(loader)) == N // 10 and len(loader_threads()) == 2
    loader.close()
    assert loader_threads() == []
    assert [int(i) for b in loader for i in b["id"]] == list(range(N))
    loader.close()


def test_a_loader_dropped_mid_pass_stops_its_threads_once_collected(ds):
    loader = chute.Loader(ds, 10, workers=2)
    iterator = iter(loader)
    next(iterator)
    del loader, iterator
    gc.collect()
    assert loader_threads() == []


def test_interpreter_exit_mid_epoch_does_not_hang(ds):
    script = textwrap.dedent(
        f"""
        import threading, chute
        def slow(sample):
            threading.Event().wait(0.05)
            return sample
        loader = chute.Loader({ds.root!r}, 8, transform=slow, workers=2)
        it = iter(loader)
        next(it)
        print("mid-epoch", flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "mid-epoch" in result.stdout


def test_torch_iterable_in_a_dataloader_gives_the_same_stream(ds):
    expected = ids(chute.Loader(ds, 32, shuffle=True, seed=8))
    for workers in (0, 2):
        batches = chute.TorchIterable(ds, 32, shuffle=True, seed=8)
        loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers)
        assert len(loader) == len(batches) == 32
        assert ids(loader) == expected, f"num_workers={workers}"


def test_torch_iterable_set_epoch_reaches_workers(ds):
    batches = chute.TorchIterable(ds, 100, shuffle=True, seed=8)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2)
    batches.set_epoch(1)
    reference = chute.Loader(ds, 100, shuffle=True, seed=8)
    reference.set_epoch(1)
    assert ids(loader) == ids(reference)


def test_device_stage_delivers_the_same_batches_and_counts_what_was_received(ds):
    reference = [b["id"].tolist() for b in chute.Loader(ds, 50, shuffle=True, seed=6)]
    loader = chute.Loader(ds, 50, shuffle=True, seed=6, device="cpu")
    iterator = iter(loader)
    received = [next(iterator)["id"].tolist() for _ in range(3)]
    assert any(name.startswith("chute-device") for name in loader_threads())
    assert loader.state_dict()["consumed"] == 150  # not what the device thread ran ahead to
    received += [b["id"].tolist() for b in iterator]
    assert received == reference


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batches_arrive_on_the_gpu_equal_to_the_host_batches(ds):
    reference = list(chute.Loader(ds, 64, shuffle=True, seed=6))
    for host, batch in zip(reference, chute.Loader(ds, 64, shuffle=True, seed=6, device="cuda")):
        assert batch["x"].is_cuda and batch["id"].is_cuda
        assert torch.equal(batch["x"].cpu(), host["x"]) and torch.equal(batch["id"].cpu(), host["id"])
        assert batch["name"] == host["name"]


def test_batches_and_views_the_loop_keeps_are_never_rewritten(ds):
    loader = chute.Loader(ds, 10, workers=chute.Workers(count=2, prefetch=2))
    kept_views, kept_batches = [], []
    for step, batch in enumerate(loader):
        if step % 3 == 0:
            kept_views.append((step, batch["x"][1:3]))  # a view of the batch's buffer
        if step % 5 == 0:
            kept_batches.append((step, batch))
    for step, view in kept_views:
        assert view[:, 0].tolist() == [10 * step + 1, 10 * step + 2]
    for step, batch in kept_batches:
        assert batch["id"].tolist() == list(range(10 * step, 10 * step + 10))
    # buffers nobody keeps are reused: a pass allocates a few per column, not one per batch
    reuse = chute.Loader(ds, 10, workers=chute.Workers(count=2, prefetch=2))
    for batch in reuse:
        pass
    assert len(reuse) == 100 and reuse._pool.allocated <= 2 * 8


@pytest.mark.parametrize("workers", [1, 2])
def test_one_hundred_batches_kept_by_the_loop_are_all_intact_at_the_end_of_the_epoch(ds, workers):
    """Blocks go back to the pool only when nothing refers to them: keep 100 batches, check every byte."""
    loader = chute.Loader(ds, 10, shuffle=True, seed=11, workers=chute.Workers(count=workers, prefetch=4))
    expected = [b.tolist() for b in loader.order.batches(0)]
    kept = list(loader)  # 100 batches, all alive at once
    assert len(kept) == 100
    for rows, batch in zip(expected, kept):
        assert batch["id"].tolist() == rows
        assert batch["x"].tolist() == [[r, r, r] for r in rows]
        assert batch["name"] == [f"s{r}" for r in rows]
    allocated = loader._pool.allocated
    assert allocated >= 2 * 100  # nothing the loop held was handed out again
    del kept, batch
    for _ in loader:  # now every block is free again: the next epoch allocates nothing new
        pass
    assert loader._pool.allocated == allocated
