"""The scripts in examples/ run as a user runs them, and train on every sample once per epoch, reshuffled, resumed exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import chute

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 600  # seconds: a bound, not an expectation (a few seconds each on an idle machine)


def run(script: str, *args: object) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT, env=env,
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def reference(data: Path, batch_size: int, epochs: int, **kwargs) -> list[list[int]]:
    """The ids of each epoch in chute's order, from a Loader in this process."""
    loader = chute.Loader(chute.open(data), batch_size, shuffle=True, seed=0, **kwargs)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append([i for b in loader for i in b["id"].tolist()])
    return out


@pytest.mark.parametrize("source", ["loader", "iterable"])
def test_lightning_example_reshuffles_each_epoch(tmp_path, source):
    pytest.importorskip("pytorch_lightning")  # in the test extra
    data, record = tmp_path / "data", tmp_path / "seen.json"
    out = run("lightning_train.py", "--data", data, "--rows", 320, "--source", source, "--epochs", 2, "--record", record)
    assert "epoch 1: 320 samples, 320 distinct" in out
    seen = json.loads(record.read_text())
    expected = reference(data, 64, 2)
    assert [seen["0"], seen["1"]] == expected
    assert sorted(expected[0]) == list(range(320)) and expected[0] != expected[1]


def test_ddp_example_resumes_mid_epoch_on_two_ranks(tmp_path):
    data, record, checkpoint = tmp_path / "data", tmp_path / "seen.json", tmp_path / "ckpt.pt"
    common = ("--data", data, "--rows", 256, "--batch-size", 32, "--epochs", 3, "--checkpoint", checkpoint, "--record", record)
    out = run("ddp_train.py", *common, "--stop-at", "1:1")
    assert "rank 0: stopped after step 1 of epoch 1" in out and checkpoint.exists()
    out = run("ddp_train.py", *common, "--resume")
    assert "epoch 2 done" in out
    first, resumed = json.loads(record.read_text())
    expected = [reference(data, 32, 3, drop_last=True, rank=rank, world_size=2) for rank in (0, 1)]
    for rank in (0, 1):
        trained = [first[rank].get(str(e), []) + resumed[rank].get(str(e), []) for e in range(3)]
        assert trained == expected[rank], f"rank {rank}"
        assert len(first[rank]["1"]) == 2 * 32  # stopped after two steps of epoch 1; the rest came after the resume
    for epoch in range(3):  # the two ranks together: every sample once per epoch, in a new order each epoch
        assert sorted(expected[0][epoch] + expected[1][epoch]) == list(range(256))
    assert expected[0][0] != expected[0][1] != expected[0][2]


def test_stateful_dataloader_example_resumes_mid_epoch(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")  # in the test extra
    data, record, checkpoint = tmp_path / "data", tmp_path / "seen.json", tmp_path / "ckpt.pt"
    common = ("--data", data, "--rows", 320, "--workers", 2, "--epochs", 2, "--checkpoint", checkpoint, "--record", record)
    assert "stopped after step 2 of epoch 0" in run("stateful_dataloader.py", *common, "--stop-at", "0:2")
    assert "epoch 1 done" in run("stateful_dataloader.py", *common, "--resume")
    first, resumed = json.loads(record.read_text())
    expected = reference(data, 64, 2)
    assert first["0"] == expected[0][: 3 * 64]
    assert first["0"] + resumed["0"] == expected[0] and resumed["1"] == expected[1]
    assert sorted(expected[0]) == list(range(320)) and expected[0] != expected[1]
