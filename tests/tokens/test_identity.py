"""Documents traceable to their source: a converted corpus keeps each document's file and line (and the fields named
with keep=), records what it skipped and why, and which(loader, step) names documents whose text, read back from the
corpus and tokenized again, rebuilds the batch the loader delivered: also for a mixture, and after a resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

import chute
from chute.tokens.text import convert
from tests.tokens.text_corpus import train_tokenizer, write_parquet

tokenizers = pytest.importorskip("tokenizers")

WORDS = "the quick brown fox jumps over lazy dog hello world tokens for language models".split()
STEP = 37


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(0, 14)))) for _ in range(n)]


def _corpus(folder, seed: int) -> None:
    """Two JSON-lines files of documents with ids, blank lines between some, and empty documents (no tokens)."""
    folder.mkdir()
    texts = _texts(900, seed)
    for part, chunk in enumerate((texts[:460], texts[460:])):
        with open(folder / f"part{part}.jsonl", "w") as f:
            for i, text in enumerate(chunk):
                f.write(json.dumps({"id": f"s{seed}-p{part}-{i}", "text": text, "url": f"https://x/{i}"}) + "\n")
                if i % 17 == 0:
                    f.write("\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    tokenizer = train_tokenizer(str(root / "tokenizer.json"))
    corpora = {}
    for name, seed in (("web", 1), ("code", 2)):
        _corpus(root / f"{name}-text", seed)
        corpora[name] = convert(root / f"{name}-text", root / name, tokenizer=tokenizer, eos=True, keep=["id"],
                                workers=0, progress=False, shard_size="2KB")
    return root, tokenizer, corpora


def _text(root, name: str, fields: dict) -> dict:
    """The record at the piece's recorded file and line, read back from the corpus."""
    with open(root / f"{name}-text" / fields["source_file"]) as f:
        line = f.readlines()[fields["source_line"] - 1]
    return json.loads(line)


def _rebuilt(root, tokenizer, pieces, row: int, default: str) -> list[int]:
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    eos = tok.token_to_id("<|endoftext|>")
    out = []
    for p in pieces:
        if p.row != row:
            continue
        record = _text(root, p.dataset or default, p.fields)
        assert record["id"] == p.fields["id"]  # the kept field names the same document as the file and line
        out += (tok.encode(record["text"]).ids + [eos])[p.start : p.stop]
    return out


def _check(root, tokenizer, pieces, batch, default: str) -> None:
    for row in range(batch["input_ids"].shape[0]):
        ids = [t for t in batch["input_ids"][row].tolist() if t >= 0]  # pad_id=-1
        assert _rebuilt(root, tokenizer, pieces, row, default) == ids


def test_a_converted_corpus_keeps_origin_and_fields_and_records_what_it_skipped(setup):
    root, tokenizer, corpora = setup
    ds = corpora["web"]
    assert ds.schema.names == ["tokens", "source_file", "source_line", "id"]
    tok = tokenizers.Tokenizer.from_file(tokenizer)
    lines = {f: open(root / "web-text" / f).readlines() for f in ("part0.jsonl", "part1.jsonl")}
    empties = [(f, n + 1) for f, ls in lines.items() for n, line in enumerate(ls)
               if line.strip() and not tok.encode(json.loads(line)["text"]).ids]
    assert empties  # the corpus has documents with no tokens
    for i in range(len(ds)):
        row = ds[i]
        record = json.loads(lines[row["source_file"]][row["source_line"] - 1])
        assert row["id"] == record["id"]
        assert row["tokens"].tolist()[:-1] == tok.encode(record["text"]).ids
    skipped = ds.metadata["source"]["skipped"]
    assert skipped["count"] == len(empties) == skipped["by_why"]["empty"]
    assert [(s["source_file"], s["source_line"], s["why"]) for s in skipped["first"]] == [(f, n, "empty") for f, n in empties]
    assert ds.metadata["source"]["files"] == ["part0.jsonl", "part1.jsonl"]  # relative: no path of this machine


def test_parquet_rows_and_kept_columns(setup, tmp_path):
    _, tokenizer, _ = setup
    texts = ["the dog", "", "hello world", "tokens"]
    path = write_parquet(str(tmp_path / "c.parquet"), texts)
    ds = convert(path, tmp_path / "out", tokenizer=tokenizer, keep=["id"], workers=0, progress=False)
    assert [(ds[i]["source_file"], ds[i]["source_line"], ds[i]["id"]) for i in range(3)] == [
        ("c.parquet", 0, 0), ("c.parquet", 2, 2), ("c.parquet", 3, 3)]
    with pytest.raises(chute.TextError, match=r"c.parquet has no column 'nope'.*--keep names columns to keep"):
        convert(path, tmp_path / "bad", tokenizer=tokenizer, keep=["nope"], workers=0, progress=False)


@pytest.mark.parametrize("pack", ["documents", "concat"])
def test_which_of_a_loader_rebuilds_the_delivered_batch(setup, pack):
    root, tokenizer, corpora = setup
    view = chute.tokens.sequences(corpora["web"], 16, pack=pack, pad_id=-1)
    loader = chute.Loader(view, 3, shuffle=True, seed=5, workers=1)
    for step, batch in enumerate(loader):
        if step == STEP:
            pieces = chute.tokens.which(loader, STEP)  # from the loader itself, mid-epoch
            break
    assert len(pieces) == 1 and all(p.origin.startswith("part") for p in pieces[0])
    if pack == "documents":
        _check(root, tokenizer, pieces[0], batch, "web")
    else:  # a window's pieces hold its L + 1 tokens: the inputs, then the last label
        for row in range(3):
            ids = batch["input_ids"][row].tolist() + [batch["labels"][row, -1].item()]
            assert _rebuilt(root, tokenizer, pieces[0], row, "web") == ids
    assert chute.tokens.which(loader, STEP) == chute.tokens.which(view, STEP, 3, shuffle=True, seed=5)


def test_which_after_a_resume_on_another_world_size_and_from_a_state(setup):
    root, tokenizer, corpora = setup
    view = chute.tokens.sequences(corpora["web"], 16, pack="documents", pad_id=-1)
    first = chute.Loader(view, 4, shuffle=True, seed=2, workers=1, rank=0, world_size=2)
    for step, _ in enumerate(first):
        if step == 19:
            break
    state = first.state_dict()
    for rank in range(2):
        resumed = chute.Loader(view, 4, shuffle=True, seed=2, workers=1, rank=rank, world_size=2)
        resumed.load_state_dict(state)
        for step, batch in enumerate(resumed, start=20):
            if step == STEP:
                break
        pieces = chute.tokens.which(resumed, STEP)
        assert pieces == chute.tokens.which(state, STEP, data=view)
        _check(root, tokenizer, pieces[rank], batch, "web")
    single = chute.Loader(view, 4, shuffle=True, seed=2, workers=1)  # resumed on one rank: its steps go on from the
    single.load_state_dict(state)  # position, 160 sequences = step 40 at 4 sequences per step
    batch = next(b for s, b in enumerate(single, start=40) if s == 42)
    _check(root, tokenizer, chute.tokens.which(single, 42)[0], batch, "web")


def test_which_of_a_mixture_with_changed_weights_and_a_resume(setup):
    root, tokenizer, corpora = setup
    mix = chute.mix({n: chute.tokens.sequences(ds, 16, pack="documents", pad_id=-1) for n, ds in corpora.items()},
                    weights={"web": 3, "code": 1})
    loader = chute.Loader(mix, 4, shuffle=True, seed=9, workers=1)
    for step, _ in enumerate(loader):
        if step == 9:
            loader.set_weights({"web": 1, "code": 3})
        if step == 20:
            break
    state = loader.state_dict()
    resumed = chute.Loader(mix, 4, shuffle=True, seed=9, workers=1)
    resumed.load_state_dict(state)
    batch = next(b for s, b in enumerate(resumed, start=21) if s == STEP)
    pieces = chute.tokens.which(resumed, STEP)[0]
    assert pieces == chute.tokens.which(state, STEP, data=mix)[0]
    assert {p.dataset for p in pieces} == {"web", "code"}
    _check(root, tokenizer, pieces, batch, "web")
    early = chute.tokens.which(state, 3, data=mix)[0]  # before the position: the same settings from the epoch's start
    batch3 = next(b for s, b in enumerate(chute.Loader(mix, 4, shuffle=True, seed=9, workers=1)) if s == 3)
    _check(root, tokenizer, early, batch3, "web")


def test_which_refuses_what_does_not_fit(setup):
    _, _, corpora = setup
    view = chute.tokens.sequences(corpora["web"], 16)
    loader = chute.Loader(view, 4)
    with pytest.raises(ValueError, match=r"which\(loader, step\) takes batch_size, seed from the loader"):
        chute.tokens.which(loader, 1, 4, seed=3)
    with pytest.raises(ValueError, match=r"which\(state_dict, step\) needs data="):
        chute.tokens.which(loader.state_dict(), 1)
    other = chute.tokens.sequences(corpora["code"], 16)
    with pytest.raises(chute.ChuteError, match=r"the state does not belong to .*cannot resume"):
        chute.tokens.which(loader.state_dict(), 1, data=other)
    with pytest.raises(chute.ChuteError, match="step 100000 is outside the"):
        chute.tokens.which(loader, 100_000)
    with pytest.raises(TypeError, match="step must be an integer, got float"):
        chute.tokens.which(loader, 1.0)


def test_chute_which_from_a_saved_state_prints_origins_and_kept_fields(setup, tmp_path, capsys):
    from chute.cli import main

    root, _, corpora = setup
    view = chute.tokens.sequences(corpora["web"], 16, pack="documents")
    loader = chute.Loader(view, 3, shuffle=True, seed=5, workers=1)
    for step, _ in enumerate(loader):
        if step == 4:
            break
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    ds = corpora["web"].root
    assert main(["which", ds, "--step", "6", "--seq-len", "16", "--pack", "documents", "--state", str(state), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == [[p.to_json() for p in r] for r in chute.tokens.which(loader, 6)]
    assert got[0][0]["origin"].startswith("part") and "id" in got[0][0]["fields"]
    assert main(["which", ds, "--step", "6", "--seq-len", "16", "--pack", "documents", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "source" in out.splitlines()[0] and "id" in out.splitlines()[0] and " line " in out
    assert main(["which", ds, "--step", "6", "--seq-len", "16", "--state", str(state), "--seed", "1"]) == 1
    assert "--seed: not with --state" in capsys.readouterr().err


def test_which_needs_token_views(tmp_path):
    plain = chute.write([{"x": np.float32(i)} for i in range(8)], tmp_path / "plain")
    with pytest.raises(chute.ChuteError, match=r"which\(loader, step\) needs a loader of chute.tokens.sequences"):
        chute.tokens.which(chute.Loader(plain, 2), 0)
    mix = chute.mix({"a": plain, "b": plain}, weights={"a": 1, "b": 1})
    with pytest.raises(chute.ChuteError, match=r"the mixture's \['a', 'b'\] are not chute.tokens.sequences"):
        chute.tokens.which(chute.Loader(mix, 2), 0)
