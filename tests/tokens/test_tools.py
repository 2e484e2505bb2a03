"""The tools tell the truth about token data: bench counts samples as the Loader does (never from a ragged column)
and reads sequences with --seq-len/--pack; doctor sizes /dev/shm from sequences; inspect prints a token summary."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import chute
from chute._sizes import format_size
from chute.cli import main
from chute.observe.consumer import batch_size_of
from chute.tools import bench, doctor


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = [np.arange(1, 1 + (i % 50) + 40) for i in range(300)]  # every document longer than a batch
    return chute.tokens.write(docs, tmp_path_factory.mktemp("tools") / "ds", vocab_size=100, eos_id=0, shard_size="2KB")


def test_bench_counts_the_documents_the_loader_delivered(corpus):
    result = bench.run(corpus, batch_size=32, epochs=1)
    assert result.samples == len(corpus) == result.report["samples"] == 300
    assert result.batches == 10


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_chute_bench_reads_sequences_and_reports_the_loaders_samples(corpus, pack, capsys):
    assert main(["bench", corpus.root, "--seq-len", "16", "--pack", pack, "--batch-size", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    view = chute.tokens.sequences(corpus, 16, pack=pack)
    assert out["samples"] == len(view) == out["report"]["samples"] and out["rows"] == len(view)
    assert out["batches"] == -(-len(view) // 7)
    assert main(["bench", corpus.root, "--pack", "documents"]) == 1
    assert "--pack goes with --seq-len L" in capsys.readouterr().err


def test_a_ragged_column_is_no_count_of_samples():
    batch = {"tokens": [torch.arange(500), torch.arange(3)], "id": torch.tensor([1, 2])}
    assert batch_size_of(batch) == 2
    assert batch_size_of({"input_ids": torch.zeros(4, 16), "cu_seqlens": torch.zeros(9)}) == 4
    assert batch_size_of((torch.zeros(3, 2), torch.zeros(3))) == 3


def test_doctor_sizes_shared_memory_from_sequences(corpus):
    env = dataclasses.replace(doctor.gather(), shm_total=1 << 30, shm_free=1 << 30)  # whatever this machine has
    by_docs = next(c for c in doctor.check(env, corpus, batch_size=8, prefetch=2, workers=1) if c.name == "/dev/shm")
    assert "pass --seq-len L to size it from the sequences training reads" in by_docs.found
    line = next(c for c in doctor.check(env, corpus, batch_size=8, prefetch=2, workers=1, seq_len=1024, pack="documents")
                if c.name == "/dev/shm")
    per_sequence = 1024 * 8 * 3  # input_ids, labels, position_ids: int64
    assert f"x {format_size(per_sequence)}/sequence" in line.found


def test_inspect_prints_a_token_summary_line(corpus, capsys):
    assert main(["inspect", corpus.root]) == 0
    out = capsys.readouterr().out
    meta = corpus.metadata["tokens"]
    assert (f"tokens    300 documents, {meta['tokens']:,} tokens (uint16), vocabulary 100, end-of-document token 0"
            in out)
    assert "shard_tokens" not in out  # the per-shard lists are not what a person reads
