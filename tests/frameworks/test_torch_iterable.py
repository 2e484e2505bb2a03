"""TorchIterable in torch's DataLoaders: epochs reach persistent workers, every pass reshuffles, StatefulDataLoader resumes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import chute

N = 500
BATCH = 25


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("iterable") / "ds"
    return chute.write(({"x": np.full(3, i, np.int32), "id": i} for i in range(N)), path, shard_size=2000)


@pytest.fixture(scope="module")
def epochs(ds):
    """The ids of epochs 0..4 in chute's order (the Loader's), the reference for every DataLoader here."""
    reference = chute.Loader(ds, BATCH, shuffle=True, seed=3)
    out = []
    for epoch in range(5):
        reference.set_epoch(epoch)
        out.append(ids(reference))
    return out


def ids(batches) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def batches(ds) -> chute.TorchIterable:
    return chute.TorchIterable(ds, BATCH, shuffle=True, seed=3)


@pytest.mark.parametrize("workers,persistent,context", [(0, False, None), (2, False, None), (2, True, None), (2, True, "spawn")])
def test_every_pass_runs_the_next_epoch_without_set_epoch(ds, epochs, workers, persistent, context):
    loader = torch.utils.data.DataLoader(
        batches(ds), batch_size=None, num_workers=workers, persistent_workers=persistent, multiprocessing_context=context,
    )
    assert [ids(loader) for _ in range(3)] == epochs[:3]  # as DataLoader(shuffle=True) draws a new order each pass
    assert sorted(epochs[0]) == list(range(N)) and epochs[0] != epochs[1]


def test_set_epoch_reaches_persistent_workers_and_counting_goes_on_from_it(ds, epochs):
    source = batches(ds)
    loader = torch.utils.data.DataLoader(source, batch_size=None, num_workers=2, persistent_workers=True)
    assert ids(loader) == epochs[0]
    source.set_epoch(3)
    assert ids(loader) == epochs[3]
    assert ids(loader) == epochs[4]  # not told: the next epoch
    source.set_epoch(1)
    assert ids(loader) == epochs[1]


def test_a_pass_left_early_counts_as_a_pass(ds, epochs):
    """Left once every worker has joined the pass: the next pass is the next epoch.

    The DataLoader takes batches from its workers in turn, so receiving two
    batches is the event that says both workers have joined (no timing involved).
    Leaving after one batch would race: a persistent worker that had not
    joined the pass yet could join it after the other worker's next pass began.
    """
    loader = torch.utils.data.DataLoader(batches(ds), batch_size=None, num_workers=2, persistent_workers=True)
    iterator = iter(loader)
    first = [next(iterator), next(iterator)]  # one from each worker
    assert ids(first) == epochs[0][: 2 * BATCH]
    del iterator
    assert ids(loader) == epochs[1]


def test_a_changed_number_of_workers_starts_a_new_pass(ds, epochs):
    source = batches(ds)
    assert ids(torch.utils.data.DataLoader(source, batch_size=None, num_workers=2)) == epochs[0]
    assert ids(torch.utils.data.DataLoader(source, batch_size=None, num_workers=3)) == epochs[1]
    assert ids(torch.utils.data.DataLoader(source, batch_size=None)) == epochs[2]


def test_a_copy_counts_its_own_passes(ds, epochs):
    source = batches(ds)
    assert ids(source) == epochs[0]
    twin = copy.deepcopy(source)
    assert ids(source) == epochs[1]
    assert ids(twin) == epochs[1]


def test_a_late_persistent_worker_joins_the_pass_it_belongs_to():
    """The order that raced: worker 0 starts pass 0 and its next pass before worker 1's first iter() arrives.

    Played on the shared counter directly, in that order (no processes, no timing).
    """
    from chute.pipeline.torch_iterable import EpochCounter

    counter = EpochCounter()
    counter.set(7)
    assert counter.join(0, 2) == 7  # worker 0, pass 0 (the pass the loop left after one batch)
    assert counter.join(0, 2) == 8  # worker 0, the next pass
    assert counter.join(1, 2) == 7  # worker 1's first iter(), late: still pass 0 (its iterator is dropped)
    assert counter.join(1, 2) == 8  # worker 1, the next pass: the same epoch as worker 0's
    assert counter.join(0, 3) == 9  # another DataLoader (3 workers) starts after every pass seen
