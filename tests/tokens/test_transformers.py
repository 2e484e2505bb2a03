"""transformers tokenizers are first-class: eos from eos_token_id, batches through the fast (Rust) path, the same ids
as the tokenizer's own call, in worker processes too; a save_pretrained folder's end token is the one it names."""

from __future__ import annotations

import pytest

import chute
from chute.cli import main
from chute.tokens.text import convert
from tests.tokens.text_corpus import TEXTS, documents, train_tokenizer, write_jsonl

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    from tokenizers import Tokenizer

    path = train_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(path), eos_token="[UNK]")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fast_tokenizer_object_with_eos(tmp_path, fast, workers):
    src = write_jsonl(str(tmp_path / "c.jsonl"))
    ds = convert(src, tmp_path / "out", tokenizer=fast, eos=True, workers=workers, progress=False)
    eos = fast.eos_token_id  # "[UNK]" here: not one of the names chute would guess, so it comes from the tokenizer
    want = [ids + [eos] for ids in fast(list(TEXTS))["input_ids"] if ids]
    assert documents(ds) == want
    assert ds.metadata["tokens"]["eos_id"] == eos and ds.metadata["tokens"]["vocab_size"] == len(fast)
    assert ds.metadata["source"]["tokenizer"].startswith("transformers ")


def test_a_save_pretrained_folder_names_its_end_token(tmp_path, fast, capsys):
    fast.save_pretrained(tmp_path / "tok")
    src = write_jsonl(str(tmp_path / "c.jsonl"))
    assert main(["convert", src, str(tmp_path / "out"), "--tokenizer", str(tmp_path / "tok"), "--eos",
                           "--workers", "0", "--quiet"]) == 0
    ds = chute.open(tmp_path / "out")
    assert ds.metadata["tokens"]["eos_id"] == fast.eos_token_id
    assert documents(ds) == [ids + [fast.eos_token_id] for ids in fast(list(TEXTS))["input_ids"] if ids]


def test_a_tokenizer_without_an_end_token_says_to_name_one(tmp_path, fast):
    from tokenizers import Tokenizer

    bare = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(fast.backend_tokenizer.to_str()))
    src = write_jsonl(str(tmp_path / "c.jsonl"))
    ds = convert(src, tmp_path / "plain", tokenizer=bare, workers=0, progress=False)  # without eos: fine
    assert len(ds) == len([t for t in bare(list(TEXTS))["input_ids"] if t])
    with pytest.raises(chute.ChuteError, match="has no end-of-document token chute knows.*--eos-id N"):
        convert(src, tmp_path / "out", tokenizer=bare, eos=True, workers=0, progress=False)
