"""``chute bench``, ``chute tune`` and ``chute doctor``: output fields and exit codes.

Most run ``chute.cli.main`` in this process (fast); the open-file-limit test runs
the installed console script in a child with a lowered RLIMIT_NOFILE.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

import chute
from chute.cli import main

CHUTE = os.path.join(os.path.dirname(sys.executable), "chute")
ROWS = 200


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-observe") / "ds"
    samples = ({"image": np.full((3, 8, 8), i % 256, np.uint8), "label": i} for i in range(ROWS))
    return chute.write(samples, path, shard_size=20_000)  # a few shards


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_prints_throughput_first_batch_and_stage_utilisation(dataset, capsys):
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "16", "--threads", "2")
    assert code == 0, err
    assert f"{ROWS:,} rows in {len(dataset.shards)} shard(s)" in out
    assert "workers='threads', 2 worker(s)" in out and "(threads set by hand, prefetch autotuned)" in out
    assert f"({ROWS:,} samples in 13 batches" in out and "samples/s" in out and "MB/s of stored data" in out
    assert "steady state " in out and "after start-up" in out
    assert "first batch  0." in out
    assert "utilisation  " in out and "read " in out
    assert "chute.Loader report (loader life)" in out  # the loader's own report follows


def test_bench_counts_the_bytes_of_map_and_string_columns(tmp_path, capsys):
    samples = ({"tags": {f"k{j}": f"{i:05d}" for j in range(10)}, "text": f"sample {i}" * 5} for i in range(300))
    ds = chute.write(samples, tmp_path / "w1", shard_size=8000)
    code, out, err = _run(capsys, "bench", str(ds.root), "--batch-size", "64", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["samples"] == 300 and result["bytes"] == ds.nbytes > 0 and result["mb_per_s"] > 0


def test_steady_state_leaves_out_the_wait_for_the_first_batch():
    from chute.tools.bench import steady_rate

    # the first batch after 2 s of start-up, then a batch of 100 every 0.1 s: 1,000 samples/s
    stamps = [(2.0 + 0.1 * i, 100) for i in range(51)]
    start, rate = steady_rate(stamps)
    assert start == pytest.approx(2.0 + 0.2 * 5.0)
    assert rate == pytest.approx(1000.0)
    assert sum(n for _, n in stamps) / stamps[-1][0] == pytest.approx(5100 / 7.0)  # the mean, which start-up drags down
    assert steady_rate(stamps[:1]) == (0.0, 0.0)  # one batch: no rate to speak of


def test_bench_with_every_setting_given_tunes_nothing(dataset, capsys):
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "16", "--threads", "1", "--prefetch", "3")
    assert code == 0, err
    assert "1 worker(s), prefetch 3 (threads set by hand, prefetch set by hand)" in out


def test_bench_does_not_say_set_by_hand_for_what_the_user_left_alone():
    from chute.tools.bench import _how

    assert _how("prefetch", ("threads",), []) == "chute's default"  # autotuning off, prefetch not given
    assert _how("prefetch", ("threads",), ["prefetch"]) == "autotuned"
    assert _how("threads", ("threads",), ["prefetch"]) == "set by hand"


def test_bench_json_counts_every_sample_of_every_epoch(dataset, capsys):
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "32", "--epochs", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["samples"] == 2 * ROWS and result["batches"] == 2 * 7 and result["epochs"] == 2
    assert result["bytes"] == 2 * dataset.nbytes  # two passes read the dataset's stored bytes twice
    assert result["samples_per_s"] > 0 and result["mb_per_s"] > 0 and result["first_batch_s"] > 0
    assert 0 < result["steady_from_s"] <= result["elapsed_s"] and result["steady_samples_per_s"] > 0
    assert result["timeline"] and sum(1 for _ in result["timeline"]) <= 60
    assert "read" in result["report"]["stages"] and result["report"]["samples"] == 2 * ROWS
    assert result["report"]["settings"]["autotune"] is True


def test_bench_stops_after_seconds(dataset, capsys):
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "8", "--epochs", "1000", "--seconds", "0.5", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert 0.4 <= result["elapsed_s"] < 5 and result["epochs"] < 1000


def test_bench_plot_writes_a_png(dataset, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "16", "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert f"plot written to {png}" in out


def test_bench_plot_without_matplotlib_says_what_to_install(dataset, capsys, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, out, err = _run(capsys, "bench", dataset.root, "--plot", str(tmp_path / "x.png"))
    assert code == 1
    assert "chute bench: error: --plot needs matplotlib: pip install 'chute[plot]'" in err
    assert not (tmp_path / "x.png").exists()


def test_bench_of_a_missing_dataset_is_an_error_not_a_traceback(tmp_path, capsys):
    code, out, err = _run(capsys, "bench", str(tmp_path / "nothing"))
    assert code == 1 and "chute bench: error:" in err and "manifest.json" in err


def test_tune_prints_the_settings_found_and_the_decisions(dataset, capsys):
    code, out, err = _run(capsys, "tune", dataset.root, "--batch-size", "16", "--step-ms", "2", "--seconds", "1")
    assert code == 0, err
    assert out.startswith(f"chute tune {dataset.root}: batch 16, simulated step 2 ms")
    assert "settings found: chute.Workers(count=" in out and "prefetch=" in out
    assert "the step allows at most 8,000/s" in out
    assert "decisions" in out and "use them: chute.Loader(ds, 16, workers=chute.Workers(count=" in out


def test_tune_keeps_within_max_threads(dataset, capsys):
    code, out, err = _run(capsys, "tune", dataset.root, "--batch-size", "16", "--seconds", "1", "--max-threads", "1")
    assert code == 0, err
    assert "settings found: chute.Workers(count=1," in out


def test_tune_json_has_the_autotuner_settings(dataset, capsys):
    code, out, err = _run(capsys, "tune", dataset.root, "--batch-size", "16", "--step-ms", "1", "--seconds", "0.5", "--json")
    assert code == 0, err
    report = json.loads(out)["report"]
    assert report["settings"]["autotune"] is True and report["settings"]["num_threads"] >= 1
    assert isinstance(report["decisions"], list)


def test_doctor_prints_every_check(capsys, tmp_path):
    code, out, err = _run(capsys, "doctor", "--cache-dir", str(tmp_path))
    assert code == 0, err
    for name in ("CPUs", "memory", "/dev/shm", "open files", "torch", "pinned memory", "remote storage", "cache dir"):
        assert f"  {name} " in out
    assert str(tmp_path) in out


def test_doctor_with_a_dataset_and_json(dataset, capsys, tmp_path):
    code, out, err = _run(capsys, "doctor", dataset.root, "--cache-dir", str(tmp_path), "--json", "--batch-size", "4", "--prefetch", "2")
    assert code == 0, err
    checks = {c["name"]: c for c in json.loads(out)}
    assert f"{len(dataset.shards)} shard(s)" in checks["open files"]["found"]
    assert "prefetch 2 x batch 4" in checks["/dev/shm"]["found"]


def test_doctor_under_a_tiny_open_file_limit_warns_then_fails(dataset, tmp_path):
    need = len(dataset.shards) + 256

    def limit(soft: int, hard: int):
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    args = [CHUTE, "doctor", dataset.root, "--cache-dir", str(tmp_path)]
    soft = subprocess.run(args, capture_output=True, text=True, timeout=120, preexec_fn=limit(200, 4096))
    assert soft.returncode == 0, soft.stderr
    assert "WARN  open files" in soft.stdout and "limit 200 (hard 4,096)" in soft.stdout
    assert f"about {need} needed" in soft.stdout and "`ulimit -n 4096`" in soft.stdout
    hard = subprocess.run(args, capture_output=True, text=True, timeout=120, preexec_fn=limit(200, 200))
    assert hard.returncode == 1
    assert "FAIL  open files" in hard.stdout and f"--ulimit nofile={need}:{need}" in hard.stdout


def as_float(sample):
    """A per-sample transform for --transform (module-level, importable as tests.test_cli_observe:as_float)."""
    return {"image": sample["image"].float(), "label": sample["label"]}


def test_bench_runs_a_transform_named_module_colon_function(dataset, capsys):
    code, out, err = _run(capsys, "bench", dataset.root, "--batch-size", "50", "--transform", "tests.test_cli_observe:as_float", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["transform"] == "tests.test_cli_observe:as_float"
    assert result["bytes"] == dataset.nbytes  # MB/s counts what was read, whatever the transform makes of it
    code, out, err = _run(capsys, "bench", dataset.root, "--transform", "tests.test_cli_observe:nothing_here")
    assert code == 1 and "--transform tests.test_cli_observe:nothing_here: tests.test_cli_observe has no nothing_here" in err
    code, out, err = _run(capsys, "tune", dataset.root, "--transform", "as_float", "--seconds", "0.1")
    assert code == 1 and "--transform wants module:function" in err
