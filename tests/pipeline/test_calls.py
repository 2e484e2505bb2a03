"""The hot path's budget: a fixed-shape batch costs a handful of Python calls, whatever the batch size.

Counted with ``sys.setprofile``/``threading.setprofile`` (every Python-level call and
every call of a C function from Python, on the training loop's thread and the
workers'), over batches in the middle of an epoch, with the Loader's default
settings (autotuned threads, counters and watchdog on). A count, not a timing:
it holds on any machine and under any load.
"""

from __future__ import annotations

import collections
import sys
import threading

import numpy as np
import pytest

import chute

#: Python calls per W2 batch, all threads together (issue 10's budget).
BUDGET = 30


@pytest.fixture(scope="module")
def w2(tmp_path_factory):
    """A small W2: uint8[3,32,32] images and int64 labels, in several shards."""
    rows = 6000
    samples = ({"x": np.full((3, 32, 32), i % 251, np.uint8), "label": i} for i in range(rows))
    return chute.write(samples, tmp_path_factory.mktemp("calls") / "w2", shard_size=4 << 20)


def calls_per_batch(loader: chute.Loader, skip: int, count: int) -> tuple[float, collections.Counter]:
    counts: collections.Counter = collections.Counter()
    on = threading.Event()

    def profile(frame, event, arg):
        if not on.is_set():
            return
        if event == "call":
            counts[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1
        elif event == "c_call":
            counts[getattr(arg, "__qualname__", repr(arg))] += 1

    threading.setprofile(profile)  # the pass's worker threads start after this
    sys.setprofile(profile)
    try:
        iterator = iter(loader)
        for _ in range(skip):
            next(iterator)
        on.set()
        for _ in range(count):
            next(iterator)
        on.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    iterator.close()
    return sum(counts.values()) / count, counts


@pytest.mark.parametrize("batch_size", [64, 256])
def test_a_w2_batch_costs_at_most_thirty_python_calls(w2, batch_size):
    loader = chute.Loader(w2, batch_size, shuffle=True, seed=0)
    steps = len(loader)
    per_batch, counts = calls_per_batch(loader, skip=4, count=steps - 8)
    assert per_batch <= BUDGET, f"{per_batch:.1f} calls per batch; the most frequent: {counts.most_common(12)}"


def identity(sample):
    return sample


def test_a_per_sample_transform_costs_a_few_calls_per_sample(w2):
    """Around the user's function, chute makes at most three Python calls per sample (plus a fixed few per batch)."""
    loader = chute.Loader(w2, 256, shuffle=True, seed=0, transform=identity)
    per_batch, counts = calls_per_batch(loader, skip=2, count=len(loader) - 4)
    user = counts["test_calls.py:identity"] / (len(loader) - 4)
    assert user == 256
    assert (per_batch - user) / 256 <= 3, f"{per_batch:.0f} calls per batch; the most frequent: {counts.most_common(12)}"
