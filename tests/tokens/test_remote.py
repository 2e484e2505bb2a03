"""A token dataset on S3 (moto's real server) read through the node cache: the Loader's batches of a sequence
view equal those of the same dataset on local disk, with a cache smaller than the dataset, and resume exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chute

pytest.importorskip("s3fs")


def _docs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(rng.integers(1, 80))).astype(np.int64) for _ in range(n)]


@pytest.fixture
def both(s3_bucket, moto_s3, tmp_path):
    """The same documents written locally and to S3; the S3 copy opened through a cache of half its size."""
    docs = _docs(400, seed=21)
    local = chute.tokens.write(docs, tmp_path / "local", vocab_size=1000, eos_id=999, shard_size="2KB")
    url = f"{s3_bucket}/corpus"
    chute.tokens.write(docs, url, vocab_size=1000, eos_id=999, shard_size="2KB", storage_options=moto_s3.storage_options)
    assert len(local.shards) >= 9
    limit = local.nbytes // 2
    remote = chute.open(url, cache_dir=tmp_path / "cache", cache_limit=limit, storage_options=moto_s3.storage_options)
    yield local, remote
    remote.close()
    local.close()


def _batches(view, **kw) -> list[dict[str, torch.Tensor]]:
    loader = chute.Loader(view, 4, shuffle=chute.Shuffle(window=2), seed=9, **kw)
    try:
        return list(loader)
    finally:
        loader.close()


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_remote_sequences_equal_local_ones(both, pack):
    local, remote = both
    expected = _batches(chute.tokens.sequences(local, 32, pack=pack))
    _same(_batches(chute.tokens.sequences(remote, 32, pack=pack)), expected)
    _same(_batches(chute.tokens.sequences(remote, 32, pack=pack), workers=2), expected)


def test_remote_sequences_resume_mid_epoch(both):
    local, remote = both
    expected = _batches(chute.tokens.sequences(local, 32, pack="documents"))
    view = chute.tokens.sequences(remote, 32, pack="documents")
    first = chute.Loader(view, 4, shuffle=chute.Shuffle(window=2), seed=9)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    first.close()
    second = chute.Loader(view, 4, shuffle=chute.Shuffle(window=2), seed=9)
    second.load_state_dict(state)
    try:
        tail = list(second)
    finally:
        second.close()
    _same(head + tail, expected)


def test_a_cache_too_small_for_the_windows_is_refused_before_any_download(s3_bucket, moto_s3, tmp_path):
    """Windows that run into the next shard count that shard in what the pass must hold."""
    url = f"{s3_bucket}/corpus"
    chute.tokens.write(_docs(400, seed=21), url, vocab_size=1000, eos_id=999, shard_size="2KB",
                       storage_options=moto_s3.storage_options)
    remote = chute.open(url, cache_dir=tmp_path / "cache", cache_limit="9KB", storage_options=moto_s3.storage_options)
    view = chute.tokens.sequences(remote, 32)
    with pytest.raises(chute.CacheFullError, match=r"cache_limit 9,000 bytes is smaller than the [\d,]+ bytes of shards this loader must hold at once"):
        _batches(view)
    assert remote.cache.stats()["shards_downloaded"] == 0
    remote.close()
