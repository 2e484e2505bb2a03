"""Reads of a remote dataset outside a loader (``ds[i]``, ``get_batch``): exact rows, bounded holds, no livelock."""

from __future__ import annotations

import numpy as np

import chute


def test_a_batch_spanning_more_shards_than_the_direct_holds_reads_every_row_once(http_server, tmp_path):
    """One native gather needs all of a batch's shards mapped at once; a direct read holds them all until it is done."""
    chute.write(({"x": np.full(64, i, np.float32), "id": i} for i in range(2000)), http_server.root / "ds", shard_size=60_000)
    ds = chute.open(http_server.url + "ds", cache_dir=tmp_path / "cache")
    assert len(ds.shards) > 4
    order = np.random.default_rng(0).permutation(2000)
    batch = ds.get_batch(order)
    assert batch["id"].tolist() == order.tolist()
    assert batch["x"][:, 0].tolist() == order.astype(np.float32).tolist()
    assert ds.cache.stats()["shards_downloaded"] == len(ds.shards)  # each shard once
    assert ds[5]["id"] == 5 and ds[1999]["id"] == 1999
    held = sum(ds.cache.held(i) for i in range(len(ds.shards)))
    assert held <= 2  # after the read, at most the last few shards stay held
    ds.close()
    assert sum(ds.cache.held(i) for i in range(len(ds.shards))) == 0


def test_a_loader_pass_lets_go_of_the_shards_direct_reads_kept(http_server, tmp_path):
    """Shards kept after ``ds[i]`` are let go when a loader's pass starts (a process waiting for its
    turn in a shared cache must hold nothing), and the pass leaves nothing held behind it."""
    chute.write(({"x": np.full(64, i, np.float32), "id": i} for i in range(2000)), http_server.root / "ds", shard_size=60_000)
    ds = chute.open(http_server.url + "ds", cache_dir=tmp_path / "cache")
    assert ds[5]["id"] == 5 and ds[1999]["id"] == 1999
    assert sum(ds.cache.held(i) for i in range(len(ds.shards))) == 2
    ids = [i for batch in chute.Loader(ds, 100, shuffle=True, seed=1) for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(2000))
    assert sum(ds.cache.held(i) for i in range(len(ds.shards))) == 0
