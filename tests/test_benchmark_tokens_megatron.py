"""benchmarks/tokens_megatron.py: its corpus is Megatron's layout, and it says how to install megatron-core when absent.

The check that Megatron's unshuffled samples are chute's concat windows needs megatron-core, which is not a test
dependency: the benchmark runs it on every run (its `check`), so a test here would only be skipped in CI.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np

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
