"""chute.tokens.sequences: windows and packed documents equal a slow reference; every token once per epoch."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import chute
from chute.order import Order
from chute.tokens.writer import TokenWriter
from tests.tokens.reference import concat_window, num_windows, pack_documents, packed_batch

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def write_docs(path, docs, *, shard_size="300B", vocab_size=65_536, eos_id=None):
    with TokenWriter(path, vocab_size=vocab_size, eos_id=eos_id, shard_size=shard_size, durable=False) as w:
        for doc in docs:
            w.append(doc)
    return chute.open(path)


def random_docs(n, seed, vocab=1000, longest=60):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(rng.integers(0, longest))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = random_docs(300, seed=1)
    ds = write_docs(tmp_path_factory.mktemp("tok") / "corpus", docs, eos_id=999)
    assert len(ds.shards) > 5
    return ds, [d + [999] for d in docs]


def test_concat_windows_equal_the_stream(corpus):
    ds, docs = corpus
    stream = [t for d in docs for t in d]
    view = chute.tokens.sequences(ds, 24)
    assert len(view) == num_windows(len(stream), 24)
    batch = view.get_batch(np.arange(len(view)))
    assert set(batch) == {"input_ids", "labels"} and batch["input_ids"].dtype == torch.int64
    for i in range(len(view)):
        inputs, labels = concat_window(stream, i, 24)
        assert batch["input_ids"][i].tolist() == inputs and batch["labels"][i].tolist() == labels


@pytest.mark.parametrize("seq_len", [16, 50])  # 16 is counted by the writer, 50 is counted at opening
def test_packed_sequences_equal_the_reference(corpus, seq_len):
    ds, docs = corpus
    view = chute.tokens.sequences(ds, seq_len, pack="documents", pad_id=3)
    expected = []
    for i in range(len(ds.shards)):
        expected += pack_documents(docs[int(ds.offsets[i]) : int(ds.offsets[i + 1])], seq_len)
    assert len(view) == len(expected)
    rng = np.random.default_rng(0)
    for indices in (np.arange(len(view)), rng.integers(0, len(view), 37)):
        batch = view.get_batch(indices)
        want = packed_batch([expected[i] for i in indices.tolist()], seq_len, 3)
        for name in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert batch[name].tolist() == want[name], name
        assert batch["cu_seqlens"].dtype == torch.int32
    one = view[5]
    assert one["cu_seqlens"].tolist() == packed_batch([expected[5]], seq_len, 3)["cu_seqlens"]


def epoch_rows(view, batch_size, world_size, seed, drop_last):
    """Every rank's rows of one shuffled epoch, the way a Loader on each rank takes them."""
    order = Order(tuple(s.rows for s in view.shards), batch_size, True, seed, 2, drop_last)
    rows = []
    for step in range(order.num_batches(world_size, 0)):
        for rank in range(world_size):
            rows += order.batch(0, step, rank, world_size, 0).tolist()
    return rows


@PROPERTY
@given(
    st.lists(st.integers(0, 90), min_size=1, max_size=40), st.integers(1, 33), st.integers(1, 7), st.integers(1, 9),
    st.booleans(), st.integers(0, 2**31),
)
def test_every_token_once_per_epoch(lengths, seq_len, world_size, batch_size, drop_last, seed):
    """Tokens are their stream positions: what each epoch delivers shows which tokens came, and how often."""
    positions = iter(range(sum(lengths)))
    docs = [[next(positions) for _ in range(n)] for n in lengths]
    total = sum(lengths)
    with tempfile.TemporaryDirectory() as tmp:
        ds = write_docs(f"{tmp}/t", docs, shard_size=int(seed % 400) + 40)
        for pack in ("concat", "documents"):
            view = chute.tokens.sequences(ds, seq_len, pack=pack, pad_id=-1)
            rows = epoch_rows(view, batch_size, world_size, seed, drop_last)
            counts = np.bincount(rows, minlength=len(view)) if rows else np.zeros(len(view), int)
            global_batch = batch_size * world_size
            if drop_last:
                assert counts.max(initial=0) <= 1 and len(rows) == len(view) // global_batch * global_batch
            else:  # every row, plus the last step's padding (repeats)
                assert counts.min(initial=1) >= 1 and len(rows) - len(view) < global_batch
            whole = view.get_batch(np.arange(len(view)))
            inputs = whole["input_ids"]
            if pack == "concat":
                assert inputs[:, 0].tolist() == [i * seq_len for i in range(len(view))]
                covered = torch.cat([inputs.reshape(-1), whole["labels"][-1:, -1]]) if len(view) else torch.zeros(0)
                assert covered.tolist() == list(range(len(covered)))  # the stream, then the dropped tail
                assert total - len(covered) < seq_len + 1
            else:
                tokens = inputs[inputs >= 0]
                assert sorted(tokens.tolist()) == list(range(total))  # every token of every document, once


def test_loader_reads_sequences_with_threads_and_processes(corpus):
    ds, _ = corpus
    view = chute.tokens.sequences(ds, 32, pack="documents")
    threads = chute.Loader(view, 4, shuffle=True, seed=2, workers=chute.Workers("threads", count=2))
    processes = chute.Loader(view, 4, shuffle=True, seed=2, workers=chute.Workers("processes", count=1))
    try:
        a, b = list(threads), list(processes)
    finally:
        processes.close()
    assert len(a) == len(b) == len(threads)
    for x, y in zip(a, b):
        assert set(x) == {"input_ids", "labels", "position_ids", "cu_seqlens"}
        assert all(torch.equal(x[k], y[k]) for k in x)
        assert x["input_ids"].shape == (4, 32) and x["cu_seqlens"][-1] == 4 * 32


def test_torch_iterable_reads_sequences(corpus):
    ds, _ = corpus
    view = chute.tokens.sequences(ds, 20)
    loader = chute.Loader(view, 8, shuffle=True, seed=4)
    expected = [b["input_ids"] for b in loader]
    got = [b["input_ids"] for b in chute.TorchIterable(view, 8, shuffle=True, seed=4)]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.fixture(scope="module")
def positions(tmp_path_factory):
    """A corpus whose tokens are their stream positions: a sequence's first token names it."""
    lengths = np.random.default_rng(5).integers(0, 50, 200).tolist()
    stream = iter(range(sum(lengths)))
    return write_docs(tmp_path_factory.mktemp("pos") / "corpus", [[next(stream) for _ in range(n)] for n in lengths],
                      vocab_size=2**20, shard_size="600B")


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_resume_on_another_world_size_and_worker_kind_is_exact(positions, pack):
    """3 ranks on 2 threads each stop after 4 steps; 2 ranks (one worker process; 3 threads) finish the epoch:
    every sequence once, plus the last step's padding."""
    view = chute.tokens.sequences(positions, 16, pack=pack)
    first_tokens = {int(t) for t in view.get_batch(np.arange(len(view)))["input_ids"][:, 0]}
    assert len(first_tokens) == len(view)

    def loaders(world, workers):
        return [chute.Loader(view, 5, shuffle=True, seed=11, rank=r, world_size=world, workers=w) for r, w in zip(range(world), workers)]

    first = loaders(3, [chute.Workers("threads", count=2)] * 3)
    iterators = [iter(x) for x in first]
    delivered = []
    for _ in range(4):
        for it in iterators:
            delivered += next(it)["input_ids"][:, 0].tolist()
    state = first[0].state_dict()
    assert all(x.state_dict() == state for x in first)
    del iterators
    second = loaders(2, [chute.Workers("processes", count=1), chute.Workers("threads", count=3)])
    try:
        for x in second:
            x.load_state_dict(state)
        rest = [[t for b in x for t in b["input_ids"][:, 0].tolist()] for x in second]
    finally:
        for x in second:
            x.close()
    delivered += rest[0] + rest[1]
    assert set(delivered) == first_tokens
    assert len(delivered) - len(view) < 2 * 5  # the last step's padding repeats the epoch's first sequences


def test_device_stage_carries_packed_batches(corpus):
    ds, _ = corpus
    view = chute.tokens.sequences(ds, 32, pack="documents")
    host = list(chute.Loader(view, 4, shuffle=True, seed=6, workers=1))
    moved = list(chute.Loader(view, 4, shuffle=True, seed=6, workers=1, device="cpu"))
    assert len(host) == len(moved)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(host, moved) for k in a)
