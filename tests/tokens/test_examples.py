"""examples/tokens_ddp.py runs as a user runs it: 2 DDP ranks stop mid-epoch, resume, and train on every sequence once per epoch."""

from __future__ import annotations

import json

import torch

import chute
from tests.frameworks.test_examples import run


def test_tokens_ddp_example_resumes_mid_epoch_on_two_ranks(tmp_path):
    data, record, checkpoint = tmp_path / "data", tmp_path / "seen.json", tmp_path / "lm.pt"
    common = ("--data", data, "--documents", 120, "--epochs", 2, "--checkpoint", checkpoint, "--record", record)
    out = run("tokens_ddp.py", *common, "--stop-at", "0:3")
    assert "rank 0: stopped after step 3 of epoch 0" in out and checkpoint.exists()
    out = run("tokens_ddp.py", *common, "--resume")
    assert "epoch 1 done" in out
    first, resumed = json.loads(record.read_text())
    view = chute.tokens.sequences(data, 64, pack="documents")
    for rank in (0, 1):
        loader = chute.Loader(view, 4, shuffle=True, seed=0, drop_last=True, rank=rank, world_size=2)
        expected = [[t for b in loader for t in b["input_ids"][:, 0].tolist()] for _ in range(2)]
        trained = [first[rank].get(str(e), []) + resumed[rank].get(str(e), []) for e in range(2)]
        assert trained == expected, f"rank {rank}"
        assert len(first[rank]["0"]) == 4 * 4  # 4 steps before the stop, the rest after the resume


def _example():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tokens_ddp.py"
    spec = importlib.util.spec_from_file_location("tokens_ddp_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_attends_within_documents_only(tmp_path):
    example = _example()
    data = example.example_corpus(str(tmp_path / "data"), 80)
    view = chute.tokens.sequences(data, 64, pack="documents")
    batch = view.get_batch(list(range(6)))
    b, n = batch["input_ids"].shape
    mask = example.document_mask(batch["cu_seqlens"], b, n)
    # the reference: a piece starts where position_ids restart at 0; i may see j iff j <= i in the same piece
    piece = torch.cumsum((batch["position_ids"] == 0).to(torch.int64), dim=1)
    want = (piece[:, :, None] == piece[:, None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal(mask[:, 0], want)
    assert int((piece.max(dim=1).values > 1).sum()) >= 3  # rows that hold several documents: the case that matters
    # and the model shows it: changing every token outside one document leaves that document's outputs unchanged
    torch.manual_seed(0)
    model = example.TinyLM(seq_len=64).eval()
    row = int(torch.nonzero(piece.max(dim=1).values > 1)[0])
    first = int(torch.nonzero(piece[row] == 2)[0])  # the second document of the row: it has one before it
    inside = piece[row] == 2
    changed = batch["input_ids"].clone()
    changed[row][~inside] = (changed[row][~inside] + 7) % (example.VOCAB - 1)
    with torch.no_grad():
        a = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
        c = model(changed, batch["position_ids"], batch["cu_seqlens"])
    assert first > 0 and torch.allclose(a[row][inside], c[row][inside], atol=1e-6, rtol=0)
    assert not torch.allclose(a[row][~inside], c[row][~inside])
