"""benchmarks/tokens_megatron.py: its corpus is Megatron's layout, and it says how to install megatron-core when absent."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.tokens.test_files import write_megatron as documented_layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "tokens_megatron.py")


def _script():
    spec = importlib.util.spec_from_file_location("chute_bench_tokens_megatron", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_corpus_has_the_bytes_of_the_documented_layout(tmp_path):
    bench = _script()
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 50_000, int(rng.integers(1, 16))).astype(np.uint16) for _ in range(1000)]
    lengths = np.asarray([len(d) for d in docs], np.int32)
    flat = np.concatenate(docs)
    ends = np.cumsum(lengths, dtype=np.int64)
    bench.write_megatron(str(tmp_path / "bench"), lengths, lambda a, b: flat[(ends[a - 1] if a else 0) : ends[b - 1]])
    documented_layout(tmp_path / "doc", docs)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"bench{ext}").read_bytes() == (tmp_path / f"doc{ext}").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["bench.bin", "bench.idx", "doc.bin", "doc.idx"]  # no .tmp left


def test_without_megatron_core_it_says_how_to_install_it_and_exits_2():
    run = [sys.executable, "-c", "import runpy, sys; sys.modules['megatron'] = None; sys.argv = ['tokens_megatron.py']; "
           f"runpy.run_path({SCRIPT!r}, run_name='__main__')"]
    out = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "pip install megatron-core==0.16.1" in out.stderr


def test_megatron_unshuffled_samples_are_chutes_concat_windows(tmp_path):
    pytest.importorskip("megatron.core.datasets.gpt_dataset", reason="megatron-core is not installed (only the benchmark needs it)")
    said = _script().check(str(tmp_path), tiny=20_000, long=500_000)
    for prefix in ("tiny-20000", "long-500000"):
        windows = ((tmp_path / f"{prefix}.bin").stat().st_size // 2 - 1) // 2048  # concat windows of seq_len 2048
        assert f"{windows:,} of {windows:,}" in said
