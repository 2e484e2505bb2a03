"""Steps as first-class: loader.skip, and which documents and token ranges fed a step (chute.tokens.which, `chute which`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import chute
from chute.cli import main
from tests.stages import Running
from tests.tokens.test_sequences import write_docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Tokens are their stream positions, so a batch says exactly which tokens it holds."""
    lengths = np.random.default_rng(2).integers(0, 70, 150).tolist()
    stream = iter(range(sum(lengths)))
    docs = [[next(stream) for _ in range(n)] for n in lengths]
    path = tmp_path_factory.mktemp("steps") / "corpus"
    return write_docs(path, docs, vocab_size=2**20, shard_size="1KB"), docs


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_skip_moves_exactly_as_reading_would(corpus, pack):
    ds, _ = corpus
    view = chute.tokens.sequences(ds, 16, pack=pack)

    def loader():
        return chute.Loader(view, 6, shuffle=True, seed=3, workers=1)

    full = loader()
    epoch0 = [b["input_ids"] for b in full]
    epoch1 = [b["input_ids"] for b in full]
    skipping = loader()
    skipping.skip(5)
    assert len(skipping) == len(epoch0) - 5
    got = [b["input_ids"] for b in skipping]
    assert all(torch.equal(a, b) for a, b in zip(got, epoch0[5:], strict=True))
    across = loader()  # past the epoch's end: into the next one, at the same place as reading would be
    across.skip(len(epoch0) + 2)
    assert across.state_dict()["epoch"] == 1
    got = [b["input_ids"] for b in across]
    assert all(torch.equal(a, b) for a, b in zip(got, epoch1[2:], strict=True))
    with pytest.raises(ValueError, match="steps must be >= 0"):
        across.skip(-1)


@pytest.mark.parametrize("pack", ["concat", "documents"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_which_names_the_tokens_each_rank_read_at_a_step(corpus, pack, world_size):
    ds, docs = corpus
    view = chute.tokens.sequences(ds, 16, pack=pack, pad_id=-1)
    step = 2
    ranks = chute.tokens.which(ds, step, 4, seq_len=16, pack=pack, world_size=world_size, seed=8, shuffle=True)
    assert len(ranks) == world_size
    for rank, pieces in enumerate(ranks):
        loader = chute.Loader(view, 4, shuffle=True, seed=8, rank=rank, world_size=world_size, workers=1)
        batch = [b for _, b in zip(range(step + 1), loader)][-1]
        for row in range(4):
            tokens = [t for p in pieces if p.row == row for t in docs[p.document][p.start : p.stop]]
            ids = batch["input_ids"][row].tolist()
            if pack == "concat":  # the window's L + 1 tokens: the inputs, then the last label
                assert tokens == ids + [batch["labels"][row, -1].item()]
            else:
                assert tokens == [t for t in ids if t >= 0]


def test_chute_which_prints_pieces_and_names_a_step_out_of_range(corpus, capsys):
    ds, _ = corpus
    assert main(["which", ds.root, "--step", "1", "--batch-size", "2", "--seq-len", "16", "--world-size", "2", "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)
    expected = chute.tokens.which(ds, 1, 2, seq_len=16, world_size=2)
    assert ranks == [[p.to_json() for p in pieces] for pieces in expected]
    assert main(["which", ds.root, "--step", "1", "--batch-size", "2", "--seq-len", "16"]) == 0
    assert "rank  row  sequence  shard  document  tokens" in capsys.readouterr().out
    assert main(["which", ds.root, "--step", "100000", "--batch-size", "2", "--seq-len", "16"]) == 1
    assert "step 100000 is outside the" in capsys.readouterr().err


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_which_finds_the_loader_state_nested_by_a_stateful_stage(corpus, pack):
    ds, docs = corpus
    view = chute.tokens.sequences(ds, 16, pack=pack, pad_id=-1)
    loader = chute.Loader(view, 4, shuffle=True, seed=8, workers=1, stages=[Running("input_ids")])
    for step, batch in enumerate(loader):
        if step == 5:
            break
    state = loader.state_dict()
    assert state["count"] == 24 and state["source"]["consumed"] == 24  # the Loader's state is nested
    expected = chute.tokens.which(view, 5, 4, shuffle=True, seed=8)
    assert chute.tokens.which(loader, 5) == expected
    assert chute.tokens.which(state, 5, data=view) == expected
    assert chute.tokens.which({"outer": [{"saved": state}]}, 5, data=view) == expected  # nested any other way
    pieces = expected[0]
    for row in range(4):
        tokens = [t for p in pieces if p.row == row for t in docs[p.document][p.start : p.stop]]
        ids = batch["input_ids"][row].tolist()
        assert tokens == (ids + [batch["labels"][row, -1].item()] if pack == "concat" else [t for t in ids if t >= 0])


def test_which_names_what_it_found_when_a_state_holds_no_loader_state(corpus):
    ds, _ = corpus
    view = chute.tokens.sequences(ds, 16)
    loader = chute.Loader(view, 4, stages=[Running("input_ids")])
    state = loader.state_dict()
    with pytest.raises(chute.ChuteError, match=r"found no Loader state in the state .*its keys are \['count'\]"):
        chute.tokens.which({"count": 3}, 1, data=view)
    inner = dict(state["source"])
    del inner["window"]
    with pytest.raises(chute.ChuteError, match=r"the state has no window \(at state\['source'\]\)"):
        chute.tokens.which({"source": inner, "count": 0}, 1, data=view)
    other = {**state["source"], "seed": 99}
    with pytest.raises(chute.ChuteError, match=r"holds 2 different Loader states, at state\['a'\], state\['b'\]"):
        chute.tokens.which({"a": state["source"], "b": other}, 1, data=view)
