"""examples/tokens_ddp.py runs as a user runs it: 2 DDP ranks stop mid-epoch, resume, and train on every sequence once per epoch."""

from __future__ import annotations

import json

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
