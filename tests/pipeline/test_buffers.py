"""Output blocks a loop held and dropped go back when the next pass starts (the pool does not keep a burst for life)."""

from __future__ import annotations

import gc

import numpy as np

import chute
from chute.pipeline.build import KEEP_SPARE


def test_blocks_of_held_batches_are_trimmed_when_the_next_pass_starts(tmp_path):
    rows = ({"x": np.full((3, 32, 32), i % 251, np.uint8), "label": i} for i in range(300 * 4))
    w2 = chute.write(rows, tmp_path / "w2", shard_size=1 << 20)
    loader = chute.Loader(w2, 4, workers=chute.Workers(count=2, prefetch=4))
    held = list(loader)  # the loop keeps all 300 batches: every one needs blocks of its own
    assert len(held) == 300
    pool = loader._pool
    assert pool.out >= 2 * 300  # two fixed-size columns per batch
    del held
    gc.collect()
    assert pool.free >= 2 * 300 and pool.out == 0  # dropped: back in the pool, all of them

    it = iter(loader)
    first = next(it)
    keep = 4 + 2 + KEEP_SPARE  # in flight + threads + spare, per shape
    assert pool.free + pool.out <= 2 * keep + 2 * 8  # two shapes; the pass's own batches are among them
    assert first["label"].tolist() == [0, 1, 2, 3]
    loader.close()
