"""chute.tokens.write: documents in, a chute dataset out that chute.open reads back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chute


def _docs(n: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(0, 40)) for _ in range(n)]


def test_round_trip_uint16_with_eos(tmp_path):
    docs = _docs(500, 50_000)
    ds = chute.tokens.write(docs, tmp_path / "t", vocab_size=50_257, eos_id=50_256, shard_size="2KB")
    assert len(ds) == 500 and len(ds.shards) > 3
    meta = ds.metadata["tokens"]
    assert meta["dtype"] == "uint16" and meta["eos_id"] == 50_256 and meta["documents"] == 500
    assert meta["tokens"] == sum(len(d) + 1 for d in docs)
    assert meta["shard_tokens"] == [
        sum(len(docs[j]) + 1 for j in range(int(ds.offsets[i]), int(ds.offsets[i + 1]))) for i in range(len(ds.shards))
    ]
    again = chute.open(tmp_path / "t")
    for i in (0, 17, 499):
        got = again[i]["tokens"]
        assert got.dtype == torch.uint16
        assert got.to(torch.int64).tolist() == [*docs[i].tolist(), 50_256]


def test_dtype_follows_the_vocabulary(tmp_path):
    docs = [np.array([0, 70_000, 5]), torch.tensor([1, 2]), [3]]
    ds = chute.tokens.write(docs, tmp_path / "big", vocab_size=100_000)
    assert ds.metadata["tokens"]["dtype"] == "uint32"
    assert ds[0]["tokens"].to(torch.int64).tolist() == [0, 70_000, 5]
    inferred = chute.tokens.write([[1, 2], [70_000]], tmp_path / "inferred")
    assert inferred.metadata["tokens"]["dtype"] == "uint32"
    small = chute.tokens.write([[1, 2], [], [65_535]], tmp_path / "small")
    assert small.metadata["tokens"]["dtype"] == "uint16" and small[1]["tokens"].numel() == 0


@pytest.mark.parametrize(
    "doc, message",
    [
        (np.array([[1, 2]]), "document 1 is a 2-D array"),
        (np.array([1.5]), "document 1 holds float64 values"),
        (np.array([-1]), "document 1 holds token id -1"),
        (np.array([10]), "document 1 holds token id 10, outside the vocabulary of 10 ids"),
    ],
)
def test_bad_documents_name_the_document_and_leave_nothing(tmp_path, doc, message):
    with pytest.raises(chute.SchemaError, match=message):
        chute.tokens.write([np.array([1, 2]), doc], tmp_path / "bad", vocab_size=10)
    assert not (tmp_path / "bad").exists()


def test_inferred_dtype_overflow_is_an_error(tmp_path):
    docs = [np.array([1, 2])] * 200 + [np.array([70_000])]
    with pytest.raises(chute.SchemaError, match="document 200 holds token id 70000.*pass vocab_size="):
        chute.tokens.write(docs, tmp_path / "bad", shard_size="100B")


def test_write_to_s3_reads_back_through_the_cache(s3_bucket, moto_s3, tmp_path):
    docs = _docs(200, 1000, seed=3)
    url = f"{s3_bucket}/corpus"
    chute.tokens.write(docs, url, vocab_size=1000, shard_size="1KB", storage_options=moto_s3.storage_options)
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=moto_s3.storage_options)
    assert ds.metadata["tokens"]["documents"] == 200 and len(ds.shards) > 2
    assert ds[150]["tokens"].to(torch.int64).tolist() == docs[150].tolist()


def test_extend_writes_many_documents_at_once(tmp_path):
    docs = _docs(300, 1000, seed=9)
    with chute.tokens.TokenWriter(tmp_path / "bulk", vocab_size=1000, eos_id=999, shard_size="1KB") as w:
        w.extend(np.concatenate(docs[:100]), [len(d) for d in docs[:100]])
        for d in docs[100:150]:
            w.append(d)
        w.extend(np.concatenate(docs[150:]), [len(d) for d in docs[150:]])
    one_by_one = chute.tokens.write(docs, tmp_path / "single", vocab_size=1000, eos_id=999, shard_size="1KB")
    bulk = chute.open(tmp_path / "bulk")
    assert bulk.metadata["tokens"] == one_by_one.metadata["tokens"]
    assert all(torch.equal(bulk[i]["tokens"], one_by_one[i]["tokens"]) for i in range(300))
    with pytest.raises(chute.SchemaError, match="document 2 holds token id 1000, outside"):
        with chute.tokens.TokenWriter(tmp_path / "bad", vocab_size=1000) as w:
            w.extend(np.array([1, 2, 3, 1000]), [1, 2, 1])
