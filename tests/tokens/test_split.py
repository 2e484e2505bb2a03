"""chute.tokens.split: held-out parts by whole documents, deterministic, disjoint and exact; read, resumed and mixed
like any token data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import chute
from chute.mixture.order import apportion
from tests.tokens.test_files import write_megatron
from tests.tokens.test_sequences import write_docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Tokens are their stream positions (1, 2, ...), so a token names its document."""
    lengths = np.random.default_rng(4).integers(0, 40, 400).tolist()
    stream = iter(range(1, sum(lengths) + 1))
    docs = [[next(stream) for _ in range(n)] for n in lengths]
    ds = write_docs(tmp_path_factory.mktemp("split") / "corpus", docs, vocab_size=2**20, shard_size="1KB")
    assert len(ds.shards) > 10
    return ds, docs


def _documents_read(view) -> list[int]:
    """The documents whose tokens an epoch of ``view`` holds (pack='documents': every token once), sorted."""
    batch = view.get_batch(np.arange(len(view)))
    tokens = batch["input_ids"][batch["input_ids"] > 0]
    return tokens.tolist()


def test_parts_are_disjoint_exact_and_whole_documents(corpus):
    ds, docs = corpus
    parts = chute.tokens.split(ds, {"train": 0.9, "val": 0.07, "test": 0.03}, seed=3)
    assert list(parts) == ["train", "val", "test"]
    sizes = [parts[n].documents for n in parts]
    from fractions import Fraction

    assert sizes == apportion(len(docs), [Fraction(0.9).limit_denominator(10**12), Fraction(0.07).limit_denominator(10**12),
                                         Fraction(0.03).limit_denominator(10**12)])
    owner = {t: i for i, d in enumerate(docs) for t in d}
    seen: dict[int, str] = {}
    for name, part in parts.items():
        tokens = _documents_read(chute.tokens.sequences(part, 32, pack="documents"))
        assert len(tokens) == len(set(tokens))  # every token once
        held = {owner[t] for t in tokens}
        for d in held:
            assert seen.setdefault(d, name) == name  # a document is in one part only
            assert set(docs[d]) <= set(tokens)  # ... whole
    nonempty = {i for i, d in enumerate(docs) if d}
    assert set(seen) == nonempty  # every document is in a part
    # the number of documents per part (empty ones included) is exact
    assert sum(int(p.shard_docs.sum()) for p in parts.values()) == len(docs)


def test_the_same_seed_gives_the_same_split_and_another_seed_another(corpus):
    ds, _ = corpus
    a = chute.tokens.split(ds, {"train": 0.9, "val": 0.1}, seed=1)
    b = chute.tokens.split(chute.open(ds.root), {"train": 0.9, "val": 0.1}, seed=1)
    c = chute.tokens.split(ds, {"train": 0.9, "val": 0.1}, seed=2)
    assert a["val"].ranges == b["val"].ranges and a["val"].ranges != c["val"].ranges
    view = chute.tokens.sequences(a["val"], 16)
    again = chute.tokens.sequences(b["val"], 16)
    assert torch.equal(view.get_batch(np.arange(len(view)))["input_ids"], again.get_batch(np.arange(len(again)))["input_ids"])


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_a_part_resumes_exactly_and_which_names_its_documents(corpus, pack):
    ds, docs = corpus
    val = chute.tokens.split(ds, {"train": 0.8, "val": 0.2}, seed=5)["val"]
    view = chute.tokens.sequences(val, 8, pack=pack, pad_id=-1)
    full = list(chute.Loader(view, 3, shuffle=True, seed=1, workers=1))
    first = chute.Loader(view, 3, shuffle=True, seed=1, workers=1)
    for step, _ in enumerate(first):
        if step == 4:
            break
    resumed = chute.Loader(view, 3, shuffle=True, seed=1, workers=1)
    resumed.load_state_dict(first.state_dict())
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(full) - 5 and all(torch.equal(a, b["input_ids"]) for a, b in zip(rest, full[5:]))
    pieces = chute.tokens.which(view, 6, 3, shuffle=True, seed=1)[0]
    for row in range(3):
        tokens = [t for p in pieces if p.row == row for t in docs[p.document][p.start : p.stop]]  # rows of the dataset
        ids = [t for t in full[6]["input_ids"][row].tolist() if t >= 0]
        assert tokens == (ids if pack == "documents" else ids + [full[6]["labels"][row, -1].item()])


def test_parts_mix_and_megatron_files_split(corpus, tmp_path):
    ds, _ = corpus
    parts = chute.tokens.split(ds, {"train": 0.5, "val": 0.5}, seed=0)
    mix = chute.mix({k: chute.tokens.sequences(p, 16) for k, p in parts.items()}, weights={"train": 1, "val": 1})
    batches = [b["input_ids"] for b in chute.Loader(mix, 4, shuffle=True, seed=0, workers=1)]
    assert len(batches) == -(-len(mix) // 4)
    write_megatron(tmp_path / "m", [[1, 2, 3]] * 10 + [[4, 5]] * 10)
    halves = chute.tokens.split(chute.tokens.megatron(tmp_path / "m"), {"a": 1, "b": 1}, seed=0)
    assert [h.documents for h in halves.values()] == [10, 10]
    tokens = [t for h in halves.values() for t in _documents_read(chute.tokens.sequences(h, 3, pack="documents"))]
    assert sorted(tokens) == sorted([1, 2, 3] * 10 + [4, 5] * 10)


@pytest.mark.parametrize("fractions, error, message", [
    ({"train": 0.9, "val": 0}, ValueError, "the fraction of part 'val' must be a positive number, got 0"),
    ({"train": True}, ValueError, "the fraction of part 'train' must be a positive number, got True"),
    ({}, ValueError, "split needs at least one part"),
])
def test_bad_fractions_are_refused(corpus, fractions, error, message):
    ds, _ = corpus
    with pytest.raises(error, match=message):
        chute.tokens.split(ds, fractions)
    with pytest.raises(TypeError, match="seed must be an integer, got float"):
        chute.tokens.split(ds, {"a": 1}, seed=1.0)
