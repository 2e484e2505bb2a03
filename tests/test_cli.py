"""The ``chute`` command, run as a real subprocess (the installed console script)."""

from __future__ import annotations

import csv
import gzip
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import chute

CHUTE = os.path.join(os.path.dirname(sys.executable), "chute")


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CHUTE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def dataset(tmp_path):
    samples = ({"image": np.full((3, 4, 4), i, np.uint8), "label": i, "name": f"n{i}"} for i in range(100))
    return chute.write(samples, tmp_path / "ds", shard_size=1000, metadata={"class_names": ["a", "b"]})


def test_console_script_is_installed():
    assert os.path.exists(CHUTE), "pip install should put a `chute` script next to the interpreter"
    result = run("--help")
    assert result.returncode == 0 and "convert" in result.stdout and "inspect" in result.stdout


def test_inspect_shows_schema_rows_shards(dataset):
    result = run("inspect", dataset.root)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "100 in" in out and f"{len(dataset.shards)} shard(s)" in out
    assert "uint8 tensor of shape (3, 4, 4)" in out and "int64 scalar" in out
    assert "class_names" in out
    assert dataset.shards[0].file in out and dataset.shards[0].checksum in out


def test_inspect_verify_passes_then_names_the_corrupt_shard(dataset):
    result = run("inspect", dataset.root, "--verify")
    assert result.returncode == 0, result.stderr
    assert f"all {len(dataset.shards)} shard(s) match" in result.stdout
    bad = dataset.shards[3]
    path = os.path.join(dataset.root, bad.file)
    with open(path, "r+b") as f:
        f.seek(bad.bytes - 200)
        f.write(b"\x00garbage\x00")
    result = run("inspect", dataset.root, "--verify")
    assert result.returncode == 1
    assert f"FAILED: shard {bad.file} has checksum" in result.stdout
    assert "1 of" in result.stderr and "FAILED" in result.stderr


def test_inspect_of_a_broken_dataset_is_an_error_not_a_traceback(tmp_path):
    result = run("inspect", str(tmp_path))
    assert result.returncode == 1
    assert "chute inspect: error:" in result.stderr and "no manifest.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_convert_pickles_from_an_index(tmp_path):
    os.makedirs(tmp_path / "src")
    dicts = [{f"k{i}{j}": f"v{j}" for j in range(i % 4 + 1)} for i in range(30)]
    with open(tmp_path / "src" / "index.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for i, d in enumerate(dicts):
            with gzip.open(tmp_path / "src" / f"{i}.pkl.gz", "wb") as g:
                pickle.dump(d, g)
            writer.writerow([f"{i}.pkl.gz", i % 3])
    refused = run("convert", str(tmp_path / "src" / "index.csv"), str(tmp_path / "ds"), "--workers", "0")
    assert refused.returncode == 1 and "allow-pickle" in refused.stderr and "0.pkl.gz" in refused.stderr
    assert not (tmp_path / "ds" / "manifest.json").exists()
    result = run("convert", str(tmp_path / "src" / "index.csv"), str(tmp_path / "ds"), "--allow-pickle", "--workers", "2", "--quiet")
    assert result.returncode == 0, result.stderr
    assert "wrote 30 rows" in result.stdout
    ds = chute.open(tmp_path / "ds")
    assert ds.get_batch(range(30))["data"] == dicts
    assert run("inspect", str(tmp_path / "ds"), "--verify").returncode == 0


def test_demo_compares_like_for_like_and_prints_medians():
    result = run("demo", "--files", "300", "--steps", "8", "--runs", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "a shuffled pass delivers all 300 samples once, identical to the files, both ways" in result.stdout
    assert "reading every sample, shuffled, in batches of 64 (median of 2 passes each):" in result.stdout
    assert "8 steps of 128 uint8[3,32,32] images, shuffled (median of 2 runs each)" in result.stdout
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # the model's threads, the same in every row: printed
    assert f"tiny CNN on the CPU with {threads} torch thread{'s' if threads > 1 else ''} in every row (torch.set_num_threads({threads}))" in result.stdout
    rates = [line for line in lines if line.endswith("samples/s") or "samples/s " in line]
    assert len(rates) == 10, result.stdout
    for part in (rates[:5], rates[5:]):  # the four DataLoaders and chute, the same batch size
        assert "torch DataLoader, per-sample __getitem__, num_workers=0" in part[0]
        assert "torch DataLoader, per-sample __getitem__, num_workers=" in part[1]
        assert "torch DataLoader, batch __getitem__(list), num_workers=0" in part[2]
        assert "torch DataLoader, batch __getitem__(list), num_workers=" in part[3]
        assert "chute Loader" in part[4] and part[4].endswith("x the fastest DataLoader")
    assert all("waited for data" in line for line in rates[5:])
    assert "loss" not in result.stdout  # differs between runs by chance: not printed
    assert "MISSION" not in result.stdout


def test_demo_training_sets_the_models_threads_in_every_row_and_restores_them(tmp_path, capsys):
    import torch

    from chute.demo import compare_training

    before = torch.get_num_threads()
    seen: list[int] = []
    real_step = chute.demo.TinyCNN.step

    def step(self, batch):
        seen.append(torch.get_num_threads())
        return real_step(self, batch)

    chute.demo.TinyCNN.step = step
    try:
        rates = compare_training(str(tmp_path), workers=0, runs=1, steps=2, model_threads=1)
    finally:
        chute.demo.TinyCNN.step = real_step
    assert set(seen) == {1} and len(seen) == 3 * (5 + 2)  # two DataLoaders and chute: a warm-up run of 5 steps, then 2
    assert torch.get_num_threads() == before
    assert "with 1 torch thread in every row (torch.set_num_threads(1))" in capsys.readouterr().out
    assert len(rates) == 3
