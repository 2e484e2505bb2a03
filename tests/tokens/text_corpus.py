"""A small text corpus and a tokenizer trained on it in the test (no downloads), written in every source layout."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "",  # an empty document
    "hello world, hello chute: tokens for language models",
    "naïve café — ünïcode ✓ and emoji 🚀 survive",
    "a\nmulti-line\n\tdocument with\ttabs",
    "   ",  # whitespace only: no tokens with a whitespace pre-tokenizer
    *(f"document {i}: " + "lazy dogs jump " * (i % 9) + "the end" for i in range(60)),
]


def train_tokenizer(path: str) -> str:
    """A tiny BPE tokenizer.json (trained on :data:`TEXTS`, with an ``<|endoftext|>`` special token) at ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator(TEXTS * 3, trainer)
    tokenizer.save(path)
    return path


def expected(tokenizer_path: str, texts=TEXTS, *, eos: int | None = None, keep_empty: bool = False) -> list[list[int]]:
    """What a conversion must write: each text's ``tokenizer.encode(text).ids`` (+ eos), empty ones dropped."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    docs = []
    for text in texts:
        ids = tokenizer.encode(text).ids
        if ids or keep_empty:
            docs.append(ids + ([eos] if eos is not None else []))
    return docs


def documents(ds) -> list[list[int]]:
    return [ds[i]["tokens"].tolist() for i in range(len(ds))]


def write_jsonl(path: str, texts=TEXTS, key: str = "text") -> str:
    lines = "".join(json.dumps({"id": i, key: t}) + "\n" for i, t in enumerate(texts)).encode()
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(lines)
    elif path.endswith(".zst"):
        import zstandard

        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(lines))
    else:
        with open(path, "wb") as f:
            f.write(lines)
    return path


def write_parquet(path: str, texts=TEXTS, key: str = "text", row_group_size: int = 16) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": np.arange(len(texts)), key: pa.array(list(texts), pa.string())})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_txt_folder(folder: str, texts=TEXTS) -> str:
    """One file per text, in nested folders; sorted path order is the texts' order."""
    for i, text in enumerate(texts):
        sub = os.path.join(folder, f"part{i // 25}")
        os.makedirs(sub, exist_ok=True)
        with open(os.path.join(sub, f"doc{i:04d}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
    return folder
