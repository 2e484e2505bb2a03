"""StatefulDataLoader(TorchIterable(...)) resumes at the exact next batch, on 0, 1 or 2 workers."""

from __future__ import annotations

import pytest

import chute
from tests.frameworks.test_torch_iterable import BATCH, batches, ds, epochs, ids  # noqa: F401 (fixtures)

stateful = pytest.importorskip("torchdata.stateful_dataloader")  # in the test extra; skipped only where it is not installed


def stateful_loader(ds, workers: int, persistent: bool = False):
    return stateful.StatefulDataLoader(batches(ds), batch_size=None, num_workers=workers, persistent_workers=persistent)


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("at", [1, 7, 20])
def test_stateful_dataloader_resumes_at_the_exact_next_batch(ds, epochs, workers, at):
    loader = stateful_loader(ds, workers)
    iterator = iter(loader)
    head = [next(iterator)["id"].tolist() for _ in range(at)]
    state = loader.state_dict()
    del iterator

    resumed = stateful_loader(ds, workers)  # a new process would build exactly this
    resumed.load_state_dict(state)
    tail = [b["id"].tolist() for b in resumed]
    assert [i for b in head + tail for i in b] == epochs[0]  # every sample of the epoch once, in order
    assert ids(resumed) == epochs[1]  # and the next pass is the next epoch


def test_a_state_saved_at_the_end_of_an_epoch_resumes_with_the_next(ds, epochs):
    loader = stateful_loader(ds, 2, persistent=True)
    assert ids(loader) == epochs[0]
    state = loader.state_dict()
    resumed = stateful_loader(ds, 2, persistent=True)
    resumed.load_state_dict(state)
    assert ids(resumed) == epochs[1]
    assert ids(resumed) == epochs[2]


def test_a_state_from_another_dataset_order_is_refused(ds):
    loader = stateful_loader(ds, 0)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    other = stateful.StatefulDataLoader(chute.TorchIterable(ds, BATCH, shuffle=True, seed=4), batch_size=None)
    other.load_state_dict(state)
    with pytest.raises(chute.ChuteError, match=r"cannot resume this TorchIterable: .*seed=3 but this loader has seed=4"):
        next(iter(other))


def test_a_state_from_another_number_of_workers_is_refused_with_what_to_do(ds):
    loader = stateful_loader(ds, 2)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del iterator
    resumed = stateful_loader(ds, 1)
    resumed.load_state_dict(state)
    with pytest.raises(chute.ChuteError, match=r"DataLoader worker 0 of 2's, this is worker 0 of 1; resume with the same num_workers"):
        next(iter(resumed))
