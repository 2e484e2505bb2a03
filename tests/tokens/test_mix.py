"""chute.mix of token sequence views: weights are shares of the tokens, changed mid-run and resumed exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import chute
from tests.tokens.test_sequences import write_docs

B_BASE = 1_000_000  # corpus b's tokens are >= this: a token says which corpus it came from


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(0)
    out = {}
    for name, base, n in (("a", 0, 400), ("b", B_BASE, 150)):
        docs = [(base + rng.integers(0, 50_000, int(rng.integers(1, 60)))).tolist() for _ in range(n)]
        out[name] = write_docs(root / name, docs, vocab_size=2 * B_BASE, shard_size="2KB")
    return out


def token_shares(batch):
    ids = batch["input_ids"]
    from_b = int((ids >= B_BASE).sum())
    return ids.numel() - from_b, from_b


def test_weights_are_shares_of_tokens_and_change_mid_run_with_an_exact_resume(corpora):
    def make():
        views = {name: chute.tokens.sequences(ds, 32) for name, ds in corpora.items()}
        return chute.Loader(chute.mix(views, weights={"a": 3, "b": 1}), 8, shuffle=True, seed=1, workers=2)

    loader = make()
    iterator = iter(loader)
    before = [next(iterator) for _ in range(3)]
    assert [token_shares(b) for b in before] == [(6 * 32, 2 * 32)] * 3  # 75% / 25% of the tokens
    loader.set_weights({"a": 1, "b": 1})
    after = [next(iterator) for _ in range(3)]
    assert [token_shares(b) for b in after] == [(4 * 32, 4 * 32)] * 3
    state = loader.state_dict()
    tail = [b["input_ids"] for b in iterator]

    resumed = make()
    resumed.load_state_dict(state)  # the weight change travels in the state
    again = [b["input_ids"] for b in resumed]
    assert len(again) == len(tail) and all(torch.equal(x, y) for x, y in zip(again, tail))

    elastic = []  # the same state on 2 ranks: the same sequences, split between them
    for rank in range(2):
        views = {name: chute.tokens.sequences(ds, 32) for name, ds in corpora.items()}
        ranked = chute.Loader(chute.mix(views, weights={"a": 3, "b": 1}), 4, shuffle=True, seed=1, rank=rank, world_size=2)
        ranked.load_state_dict(state)
        elastic += [tuple(row) for b in ranked for row in b["input_ids"].tolist()]
    rest = [tuple(row) for t in tail for row in t.tolist()]
    # the same sequences, and the last step filled up to a whole batch per rank (with the streams' next rows)
    # (a small corpus cycles: a sequence may come twice; compare as multisets)
    assert not Counter(rest) - Counter(elastic) and 0 <= len(elastic) - len(rest) < 8


def test_packed_mixture_rebuilds_cu_seqlens_for_the_batch(corpora):
    views = {name: chute.tokens.sequences(ds, 48, pack="documents") for name, ds in corpora.items()}
    mixture = chute.mix(views, weights={"a": 1, "b": 1})
    indices = np.array([len(views["a"]) + 2, 0, 5, len(views["a"]) + 7, 1])  # b, a, a, b, a
    batch = mixture.get_batch(indices)
    expected_cu = [0]
    for row, i in enumerate(indices.tolist()):
        name, local = ("a", i) if i < len(views["a"]) else ("b", i - len(views["a"]))
        one = views[name][local]
        assert torch.equal(batch["input_ids"][row], one["input_ids"]) and torch.equal(batch["labels"][row], one["labels"])
        expected_cu += [row * 48 + int(c) for c in one["cu_seqlens"][1:]]
    assert batch["cu_seqlens"].tolist() == expected_cu and batch["cu_seqlens"].dtype == torch.int32
