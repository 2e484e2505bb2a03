"""chute.tokens.convert: every source layout gives each document's tokenizer.encode(text), in order."""

from __future__ import annotations

import multiprocessing
import os

import pytest

import chute
from chute.errors import ChuteError
from chute.tokens.text import convert, convert_counted
from tests.tokens.text_corpus import (
    TEXTS,
    documents,
    expected,
    train_tokenizer,
    write_jsonl,
    write_parquet,
    write_txt_folder,
)

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return train_tokenizer(str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"))


@pytest.fixture(scope="module")
def eos(tokenizer_json):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_json).token_to_id("<|endoftext|>")


def _hf_saved(folder: str) -> str:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": TEXTS, "id": list(range(len(TEXTS)))}).save_to_disk(folder)
    return folder


def _hf_parquet_layout(folder: str) -> str:
    """A Hugging Face repository's layout: data/{split}-0000N-of-00002.parquet, README beside it."""
    os.makedirs(os.path.join(folder, "data"))
    half = len(TEXTS) // 2
    write_parquet(os.path.join(folder, "data", "train-00000-of-00002.parquet"), TEXTS[:half])
    write_parquet(os.path.join(folder, "data", "train-00001-of-00002.parquet"), TEXTS[half:])
    write_parquet(os.path.join(folder, "data", "test-00000-of-00001.parquet"), ["not", "in", "train"])
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write("# a dataset card\n")
    with open(os.path.join(folder, "dataset_infos.json"), "w") as f:
        f.write("{}")
    return folder


SOURCES = {
    "jsonl": lambda tmp: write_jsonl(str(tmp / "corpus.jsonl")),
    "jsonl.gz": lambda tmp: write_jsonl(str(tmp / "corpus.jsonl.gz")),
    "jsonl.zst": lambda tmp: write_jsonl(str(tmp / "corpus.jsonl.zst")),
    "parquet": lambda tmp: write_parquet(str(tmp / "corpus.parquet")),
    "txt folder": lambda tmp: write_txt_folder(str(tmp / "texts")),
    "hf save_to_disk": lambda tmp: _hf_saved(str(tmp / "saved")),
}


@pytest.mark.parametrize("layout", list(SOURCES))
def test_each_source_holds_each_documents_tokens_in_order(tmp_path, tokenizer_json, eos, layout):
    if layout == "jsonl.zst":
        pytest.importorskip("zstandard")
    src = SOURCES[layout](tmp_path)
    ds = convert(src, tmp_path / "out", tokenizer=tokenizer_json, eos=True, workers=0, progress=False, chunk_bytes=64)
    assert documents(ds) == expected(tokenizer_json, eos=eos)
    assert ds.metadata["tokens"]["dtype"] == "uint16"
    assert ds.metadata["tokens"]["eos_id"] == eos
    assert ds.metadata["tokens"]["tokens"] == sum(len(d) for d in expected(tokenizer_json, eos=eos))


def test_hf_parquet_layout_with_a_split(tmp_path, tokenizer_json):
    src = _hf_parquet_layout(str(tmp_path / "repo"))
    ds = convert(src, tmp_path / "train", tokenizer=tokenizer_json, split="train", workers=0, progress=False)
    assert documents(ds) == expected(tokenizer_json)
    ds = convert(src, tmp_path / "test", tokenizer=tokenizer_json, split="test", workers=0, progress=False)
    assert documents(ds) == expected(tokenizer_json, ["not", "in", "train"])


def test_one_and_three_workers_write_the_same_bytes(tmp_path, tokenizer_json):
    """Chunks finish out of order in the workers; the dataset must not show it."""
    texts = [f"{i} " + TEXTS[i % len(TEXTS)] * (1 + i % 5) for i in range(3000)]
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), texts)
    shards = {}
    for workers in (1, 3):
        ds = convert(src, tmp_path / f"w{workers}", tokenizer=tokenizer_json, eos=True, workers=workers, progress=False,
                     chunk_bytes=2000, shard_size="20KB")
        shards[workers] = [open(os.path.join(ds.root, s.file), "rb").read() for s in ds.shards]
        assert len(shards[workers]) > 3
    assert shards[1] == shards[3]
    assert documents(chute.open(tmp_path / "w3")) == expected(tokenizer_json, texts, eos=ds.metadata["tokens"]["eos_id"])
    assert multiprocessing.active_children() == []


def test_worker_processes_under_spawn(tmp_path, tokenizer_json):
    """Nothing the workers need is inherited from this process (spawn, as on macOS and Windows)."""
    src = write_parquet(str(tmp_path / "corpus.parquet"))
    ds = convert(src, tmp_path / "out", tokenizer=tokenizer_json, workers=2, start_method="spawn", progress=False,
                 chunk_bytes=100)
    assert documents(ds) == expected(tokenizer_json)


def test_empty_documents_are_counted_and_skipped_or_kept(tmp_path, tokenizer_json, eos, capsys):
    src = write_jsonl(str(tmp_path / "corpus.jsonl"))
    ds, counts = convert_counted(src, tmp_path / "skip", tokenizer=tokenizer_json, workers=0)
    assert (counts.documents, counts.empty, counts.written) == (len(TEXTS), 2, len(TEXTS) - 2)
    assert len(ds) == len(TEXTS) - 2
    assert "2 of 66 documents were empty (no tokens): skipped (keep them with --keep-empty" in capsys.readouterr().err
    ds = convert(src, tmp_path / "keep", tokenizer=tokenizer_json, eos_id=eos, keep_empty=True, workers=0, progress=False)
    assert documents(ds) == expected(tokenizer_json, eos=eos, keep_empty=True)
    assert documents(ds)[1] == [eos]


def _double_codepoints(text: str) -> list[int]:
    """A tokenizer function: two ids per character (importable, so it works in worker processes)."""
    return [v for c in text for v in (ord(c), 70_000)]


def test_a_function_as_tokenizer_in_workers_and_uint32_from_its_vocab_size(tmp_path):
    src = write_jsonl(str(tmp_path / "corpus.jsonl"))
    ds = convert(src, tmp_path / "out", tokenizer=_double_codepoints, vocab_size=200_000, eos_id=199_999, workers=2,
                 progress=False, chunk_bytes=100)
    want = [_double_codepoints(t) + [199_999] for t in TEXTS if t]
    assert documents(ds) == want
    assert ds.metadata["tokens"]["dtype"] == "uint32"


def test_a_lambda_runs_in_this_process_but_is_refused_for_workers(tmp_path):
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), ["ab", "c"])
    ds = convert(src, tmp_path / "out", tokenizer=lambda t: [ord(c) for c in t], workers=0, progress=False)
    assert documents(ds) == [[97, 98], [99]]
    with pytest.raises(ChuteError, match="cannot be sent to worker processes .*top level of a module.*workers=0"):
        convert(src, tmp_path / "out2", tokenizer=lambda t: [1], workers=2, progress=False)
    assert not (tmp_path / "out2").exists()


def test_a_tiktoken_encoding(tmp_path):
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([i]): i for i in range(256)}
    for i, pair in enumerate([b"th", b"he", b"the", b" the", b"ll", b"o "]):
        ranks[pair] = 256 + i
    encoding = tiktoken.Encoding(
        "tiny", pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 262},
    )
    texts = ["the hello <|endoftext|> the", "", "naïve 🚀"]
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), texts)
    ds = convert(src, tmp_path / "out", tokenizer=encoding, eos=True, workers=2, progress=False, chunk_bytes=10)
    # special tokens written in the text stay text (encode_ordinary); the end token is the encoding's eot
    assert documents(ds) == [encoding.encode_ordinary(t) + [262] for t in texts if t]


def test_a_tiktoken_name_without_its_file_says_how_to_provide_it(tmp_path, monkeypatch):
    pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with _closed_port() as port:  # any download attempt fails at once, on this machine
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        src = write_jsonl(str(tmp_path / "corpus.jsonl"), ["x"])
        with pytest.raises(ChuteError, match=r"cannot load tiktoken encoding cl100k_base: .*TIKTOKEN_CACHE_DIR"):
            convert(src, tmp_path / "out", tokenizer="cl100k_base", workers=0, progress=False)
    with pytest.raises(ChuteError, match="not a tiktoken encoding .*cl100k_base"):
        convert(src, tmp_path / "out", tokenizer="cl100k_bas", workers=0, progress=False)


class _closed_port:
    """A local port nothing listens on (bound, never listening, for the block's duration)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def test_vocabulary_from_the_tokenizer_picks_uint16_and_eos_must_be_a_token(tmp_path, tokenizer_json):
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), ["the dog"])
    with pytest.raises(ChuteError, match="eos_id 5000 is not a token of the tokenizer .*tokenizer.json"):
        convert(src, tmp_path / "out", tokenizer=tokenizer_json, eos_id=5000, workers=0, progress=False)
    ds = convert(src, tmp_path / "out", tokenizer=tokenizer_json, vocab_size=100_000, workers=0, progress=False)
    assert ds.metadata["tokens"]["dtype"] == "uint32"
    assert ds.metadata["tokens"]["vocab_size"] == 100_000

