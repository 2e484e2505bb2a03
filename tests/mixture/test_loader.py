"""A mixture through the Loader and TorchIterable: exact shares per batch, resume on another world size, set_weights."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import chute

A, B = 600, 200  # rows of the two sources; labels: a = 0..599, b = 1000..1199


def _write(path, start: int, n: int):
    samples = ({"x": np.full((2, 3), i % 251, np.uint8), "label": i, "name": f"row-{i}"} for i in range(start, start + n))
    return chute.write(samples, path, shard_size=1500)


@pytest.fixture
def here(tmp_path, monkeypatch):
    _write(tmp_path / "a", 0, A)
    _write(tmp_path / "b", 1000, B)
    monkeypatch.chdir(tmp_path)  # the exact call of the issue names the datasets by relative path
    return tmp_path


def _source_counts(labels: list[int]) -> tuple[int, int]:
    a = sum(1 for label in labels if label < 1000)
    return a, len(labels) - a


def test_the_documented_call_gives_exact_shares_in_every_batch(here):
    loader = chute.Loader(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}), batch_size=40, shuffle=True, seed=5)
    batches = [b["label"].tolist() for b in loader]
    assert len(batches) == len(loader) == (A + B) // 40
    for labels in batches:
        assert _source_counts(labels) == (30, 10)
    for batch_labels, batch in zip(batches, chute.Loader(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}),
                                                        batch_size=40, shuffle=True, seed=5)):
        assert batch["name"] == [f"row-{i}" for i in batch_labels]  # every column read from the right source
        assert batch["x"][:, 0, 0].tolist() == [i % 251 for i in batch_labels]
    # b (25% of 800 rows per epoch = 200) is seen exactly once; a (600) exactly once too
    seen = collections.Counter(label for labels in batches for label in labels)
    assert set(seen.values()) == {1}


def test_the_loader_delivers_the_mix_order(here):
    mixture = chute.mix({"a": "a", "b": "b"}, weights={"a": 3, "b": 1})
    loader = chute.Loader(mixture, 16, shuffle=True, seed=2)
    expected = [[int(mixture[int(i)]["label"]) for i in rows] for rows in loader.order.batches(0)]
    assert [b["label"].tolist() for b in loader] == expected


@pytest.mark.parametrize("stop_after", [3, 11])
def test_resume_on_two_ranks_continues_with_the_same_rows(here, stop_after):
    def make(rank=0, world_size=1):
        return chute.Loader(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}), 20, shuffle=True, seed=9,
                            rank=rank, world_size=world_size)

    reference = [b["label"].tolist() for b in make()]
    first = make()
    iterator = iter(first)
    head = [next(iterator)["label"].tolist() for _ in range(stop_after)]
    state = first.state_dict()
    iterator.close()
    assert head == reference[:stop_after]
    ranks = [make(r, 2) for r in range(2)]
    for loader in ranks:
        loader.load_state_dict(state)
    per_rank = [[b["label"].tolist() for b in loader] for loader in ranks]
    for batches in per_rank:  # each rank's full batch holds its half of each source's share (the last: its 10 rows)
        assert [_source_counts(labels) for labels in batches[:-1]] == [(15, 5)] * (len(batches) - 1)
        assert _source_counts(batches[-1]) in {(8, 2), (7, 3)}
    rest = [labels for batches in per_rank for labels in batches]
    remaining = sorted(label for labels in reference[stop_after:] for label in labels)
    assert sorted(label for labels in rest for label in labels) == remaining


def test_set_weights_mid_pass_applies_from_the_next_batch_and_resumes_exactly(here):
    def make():
        return chute.Loader(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}), 20, shuffle=True, seed=3,
                            workers=chute.Workers(count=2, prefetch=6))

    loader = make()
    iterator = iter(loader)
    before = [next(iterator)["label"].tolist() for _ in range(4)]
    loader.set_weights({"a": 0.5, "b": 0.5})
    after = [next(iterator)["label"].tolist() for _ in range(5)]
    assert [_source_counts(labels) for labels in before] == [(15, 5)] * 4
    assert [_source_counts(labels) for labels in after] == [(10, 10)] * 5  # nothing built ahead with the old weights
    state = loader.state_dict()
    tail = [b["label"].tolist() for b in iterator]

    resumed = make()
    resumed.load_state_dict(state)  # the weight history travels in the state
    assert [b["label"].tolist() for b in resumed] == tail
    with pytest.raises(chute.ChuteError, match="set_weights needs a mixture"):
        chute.Loader(chute.open("a"), 8).set_weights({"a": 1.0})


def test_torch_iterable_reads_a_mixture(here):
    batches = chute.TorchIterable(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}), 40, shuffle=True, seed=5)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    for batch in loader:
        assert _source_counts(batch["label"].tolist()) == (30, 10)



def _tagged(batch):
    batch = dict(batch)
    batch["tag"] = batch["label"] + 0  # a stage on a thread of its own: it sees every batch the loop gets
    return batch


@pytest.mark.parametrize("relay", ["stage", "device"])
def test_set_weights_mid_pass_is_refused_with_stages_on_threads_of_their_own_and_applies_to_the_next_pass(here, relay):
    extra = {"stages": [chute.BatchStage(_tagged, name="tag", where="thread")]} if relay == "stage" else {"device": "cpu"}
    with chute.Loader(chute.mix({"a": "a", "b": "b"}, weights={"a": 0.75, "b": 0.25}), 20, shuffle=True, seed=3,
                      workers=chute.Workers(count=2, prefetch=6), **extra) as loader:
        iterator = iter(loader)
        first = [next(iterator) for _ in range(4)]
        with pytest.raises(chute.ChuteError, match="call it between passes"):
            loader.set_weights({"a": 0.5, "b": 0.5})  # batches already handed on would keep the old weights
        rest = list(iterator)  # the pass goes on, unchanged
        loader.set_weights({"a": 0.5, "b": 0.5})  # between passes: the next one has them
        following = list(loader)
    assert [_source_counts(b["label"].tolist()) for b in first + rest] == [(15, 5)] * (len(first) + len(rest))
    assert sorted(label for b in first + rest for label in b["label"].tolist()) == list(range(600)) + list(range(1000, 1200))
    assert following and all(_source_counts(b["label"].tolist()) == (10, 10) for b in following)
    if relay == "stage":
        assert all(torch.equal(b["tag"], b["label"]) for b in first + rest + following)
