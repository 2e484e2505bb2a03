"""A fresh loader does only batch 0's work before delivering batch 0 (issue 22).

Counted, not timed: when batch 0's batch transform runs (in the one worker
thread, after batch 0 is gathered and before anything else is built), the
shards mapped into the process and the shards whose checksum was hashed are
exactly those batch 0 reads.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import chute


def _mapped_shards(root: str) -> set[str]:
    """Files under ``root`` mapped into this process (Linux: /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if root in line and line.rstrip().endswith(".arrow")}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps (Linux)")
@pytest.mark.parametrize("shuffle", [False, chute.Shuffle(window=2)])
def test_before_batch_0_only_its_shards_are_mapped_and_hashed(tmp_path, monkeypatch, shuffle) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(cache))  # no shard of this dataset verified on this "machine" yet
    root = str(tmp_path / "ds")
    rows = np.arange(8 * 40 * 16, dtype=np.int64).reshape(-1, 16)
    chute.write(({"x": r} for r in rows), root, shard_size=40 * 16 * 8 + 1)
    ds = chute.open(root)
    assert len(ds.shards) >= 8
    seen: dict[str, object] = {}

    def count_at_batch_0(batch):
        if not seen:
            verified = cache / "verified"
            # one marker per hashed shard, in a folder per dataset (docs/format.md); ``.dir`` names the folder's dataset
            seen["hashed"] = sum(1 for _, _, names in os.walk(verified) for name in names if not name.startswith("."))
            seen["mapped"] = _mapped_shards(os.path.realpath(root))
        return batch

    loader = chute.Loader(ds, batch_size=32, shuffle=shuffle, batch_transform=count_at_batch_0, workers=chute.Workers(count=1))
    reads = ds.shards_of(loader.order.batch(0, 0))
    next(iter(loader))
    files = {os.path.realpath(ds.shard_path(i)) for i in reads}
    assert seen["mapped"] == files
    assert seen["hashed"] == len(reads)
    assert len(reads) < len(ds.shards)
    loader.close()


def test_the_first_step_of_a_pass_is_computed_alone() -> None:
    from chute.order import Order
    from chute.pipeline.indices import BatchIndices

    order = Order((1000, 700, 1000, 300), 8, shuffle=True, seed=3, window=2)
    for start in (0, 24):
        indices = BatchIndices(order, 1, 0, 1, start)
        assert np.array_equal(indices.rows(0), order.batch(1, 0, 0, 1, start))
        assert all(chunk is None for chunk in indices.chunks)  # nothing but batch 0's rows yet
        assert np.array_equal(indices.rows(1), order.batch(1, 1, 0, 1, start))
        assert indices.chunks[0] is not None
