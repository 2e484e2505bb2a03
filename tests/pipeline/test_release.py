"""The training loop does not free the batches it drops: their last reference goes on a worker's thread.

Freeing a tensor releases the GIL in torch, and a tensor over the Loader's
blocks (numpy memory) takes it back in its deleter: a worker that takes the
GIL in that gap keeps the loop waiting (docs/loader.md, "Workers"). The pass's
channel keeps each batch taken until a producer's put after the loop has
taken two later ones (chute._channel.Channel, ``keep=True``), so a batch the
loop has dropped is freed there. What is freed on the loop's thread is what
the channel still keeps when the pass ends: at most the prefetch depth and
the last two batches.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

import chute

PREFETCH = 4


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    # (a variable-size column keeps the passes on the worker threads: gather-only ones of fixed-size columns run
    # on native threads, tests/pipeline/test_native_gather.py)
    samples = ({"x": np.full((3, 8, 8), i % 251, np.uint8), "label": i, "tag": str(i)} for i in range(2048))
    return chute.write(samples, tmp_path_factory.mktemp("release") / "ds", shard_size=1 << 16)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_the_batches_the_loop_drops_are_freed_off_its_thread(small, kind):
    loader = chute.Loader(small, 16, shuffle=True, seed=1, workers=chute.Workers(kind, count=2, prefetch=PREFETCH))
    loop = threading.get_ident()
    freed_on: list[int] = []
    labels = []
    try:
        for batch in loader:
            labels.append(batch["label"].clone())
            weakref.finalize(batch["x"], lambda: freed_on.append(threading.get_ident()))
        del batch
        steps = len(labels)
    finally:
        loader.close()
    assert steps == len(small) // 16
    assert sorted(np.concatenate(labels).tolist()) == list(range(len(small)))  # every sample, once
    assert len(freed_on) == steps  # every batch freed once the pass ended (nothing kept)
    on_the_loop = freed_on.count(loop)
    assert on_the_loop <= PREFETCH + 2, f"{on_the_loop} of {steps} batches were freed on the training loop's thread"
