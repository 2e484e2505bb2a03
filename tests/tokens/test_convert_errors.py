"""chute convert --tokenizer: errors name the file, line or row and what to do; nothing is left behind."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

import chute
from chute.cli import main
from chute.errors import ChuteError
from chute.tokens.text import convert, convert_counted
from tests.tokens.text_corpus import documents, expected, train_tokenizer, write_jsonl, write_parquet

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    return train_tokenizer(str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"))


def _lines(path, records) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


GOOD = [{"text": f"the dog {i}"} for i in range(40)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "bad, message",
    [
        ({"body": "x", "id": 3}, r"corpus.jsonl line 41: no 'text' key \(its keys: 'body', 'id'\); name the text's key with --text-key"),
        ({"text": 12}, r"corpus.jsonl line 41: 'text' is a JSON number, not a string"),
        ({"text": None}, r"corpus.jsonl line 41: 'text' is a JSON null, not a string"),
        ({"text": ["a", "b"]}, r"corpus.jsonl line 41: 'text' is a JSON array, not a string"),
        ('{"text": "cut', r"corpus.jsonl line 41: not valid JSON .*each line must be one JSON object"),
        ('["text"]', r"corpus.jsonl line 41: a JSON array, not an object with a 'text' key"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, tokenizer_json, bad, message, workers):
    src = _lines(tmp_path / "corpus.jsonl", [*GOOD, bad, *GOOD])
    with pytest.raises(ChuteError, match=message):
        convert(src, tmp_path / "out", tokenizer=tokenizer_json, workers=workers, progress=False, chunk_bytes=64)
    assert not (tmp_path / "out").exists()
    _no_worker_left()


def _no_worker_left() -> None:
    """The worker processes have ended and been reaped by the time the error reaches the caller."""
    assert multiprocessing.active_children() == []


def test_blank_lines_hold_no_document_and_do_not_shift_line_numbers(tmp_path, tokenizer_json):
    src = _lines(tmp_path / "corpus.jsonl", [{"text": "the dog"}, "", "   ", {"text": "hello"}, "", {"body": 1}])
    with pytest.raises(ChuteError, match="line 6: no 'text' key"):
        convert(src, tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    src = _lines(tmp_path / "corpus.jsonl", [{"text": "the dog"}, "", {"text": "hello"}, ""])
    ds = convert(src, tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    assert documents(ds) == expected(tokenizer_json, ["the dog", "hello"])


def test_a_truncated_gzip_file(tmp_path, tokenizer_json):
    path = write_jsonl(str(tmp_path / "corpus.jsonl.gz"), ["the dog " * 50] * 200)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ChuteError, match=r"corpus.jsonl.gz: cannot read it .*is the file complete\?"):
        convert(path, tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_parquet_without_the_column_or_with_another_type_or_a_null(tmp_path, tokenizer_json):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_parquet(str(tmp_path / "corpus.parquet"), ["a", "b"], key="body")
    with pytest.raises(ChuteError, match=r"corpus.parquet has no column 'text' \(its columns: id, body\); name the text column with --text-key"):
        convert(src, tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    with pytest.raises(ChuteError, match=r"corpus.parquet: column 'id' holds int64, not text"):
        convert(src, tmp_path / "out", tokenizer=tokenizer_json, text_key="id", workers=0, progress=False)
    pq.write_table(pa.table({"text": ["the dog", None, "hello"]}), tmp_path / "nulls.parquet")
    with pytest.raises(ChuteError, match=r"nulls.parquet row 1: column 'text' is null, not a string"):
        convert(tmp_path / "nulls.parquet", tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_txt_file_that_is_not_utf8(tmp_path, tokenizer_json):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("the dog")
    (tmp_path / "texts" / "b.txt").write_bytes(b"caf\xe9")
    (tmp_path / "texts" / "c.txt").write_text("the fox")
    with pytest.raises(chute.TextError, match=r"b.txt: not UTF-8 text \(byte 3.*--encoding / encoding= \(e.g. latin-1\); "
                       r"--errors replace / errors='replace' replaces .*--errors skip / errors='skip' skips"):
        convert(tmp_path / "texts", tmp_path / "out", tokenizer=tokenizer_json, workers=0, progress=False)
    assert not (tmp_path / "out").exists()
    latin = convert(tmp_path / "texts", tmp_path / "latin", tokenizer=tokenizer_json, workers=0, progress=False,
                    encoding="latin-1")
    assert len(latin) == 3 and latin.metadata["source"]["encoding"] == "latin-1"
    skipped, counts = convert_counted(tmp_path / "texts", tmp_path / "skip", tokenizer=tokenizer_json, workers=0,
                                      progress=False, errors="skip")
    assert counts.undecodable == 1 and counts.documents == 3 and counts.written == 2
    assert [skipped[i]["source_file"] for i in range(2)] == ["a.txt", "c.txt"]
    assert skipped.metadata["source"]["skipped"] == {
        "count": 1, "by_why": {"not decodable": 1}, "first": [{"source_file": "b.txt", "source_line": 0, "why": "not decodable"}],
    }
    replaced = convert(tmp_path / "texts", tmp_path / "replace", tokenizer=tokenizer_json, workers=0, progress=False,
                       errors="replace")
    assert len(replaced) == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_json_lines_that_are_not_utf8_are_skipped_and_counted(tmp_path, tokenizer_json, workers, capsys):
    path = tmp_path / "c.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "the dog"}\n{"text": "caf\xe9"}\n\n{"text": "the fox"}\n')
    with pytest.raises(chute.TextError, match=r"c.jsonl line 2: not UTF-8 text \(byte 13"):
        convert(path, tmp_path / "out", tokenizer=tokenizer_json, workers=workers, progress=False)
    assert main(["convert", str(path), str(tmp_path / "out"), "--tokenizer", tokenizer_json, "--errors", "skip",
                 "--workers", str(workers)]) == 0
    assert "1 of 3 documents were not UTF-8 text: skipped (--errors skip)" in capsys.readouterr().out
    ds = chute.open(tmp_path / "out")
    assert [ds[i]["source_line"] for i in range(len(ds))] == [1, 4]
    assert ds.metadata["source"]["skipped"]["first"] == [{"source_file": "c.jsonl", "source_line": 2, "why": "not decodable"}]
    with pytest.raises(ChuteError, match="errors must be one of strict, replace, ignore, backslashreplace, skip"):
        convert(path, tmp_path / "out", tokenizer=tokenizer_json, errors="nope", progress=False)
    with pytest.raises(ChuteError, match="unknown text encoding 'klingon'"):
        convert(path, tmp_path / "out", tokenizer=tokenizer_json, encoding="klingon", progress=False)


def test_sources_and_tokenizers_that_are_not(tmp_path, tokenizer_json):
    with pytest.raises(ChuteError, match="nothing.jsonl does not exist"):
        convert(tmp_path / "nothing.jsonl", tmp_path / "out", tokenizer=tokenizer_json, progress=False)
    (tmp_path / "misc").mkdir()
    (tmp_path / "misc" / "a.csv").write_text("x\n")
    with pytest.raises(ChuteError, match="holds no text files chute reads"):
        convert(tmp_path / "misc", tmp_path / "out", tokenizer=tokenizer_json, progress=False)
    src = write_jsonl(str(tmp_path / "c.jsonl"), ["x"])
    with pytest.raises(ChuteError, match="tokenizer file .*missing.json does not exist"):
        convert(src, tmp_path / "out", tokenizer=str(tmp_path / "missing.json"), progress=False)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ChuteError, match="bad.json is not a Hugging Face tokenizer.json"):
        convert(src, tmp_path / "out", tokenizer=str(tmp_path / "bad.json"), progress=False)
    with pytest.raises(ChuteError, match="cannot use a int as a tokenizer"):
        convert(src, tmp_path / "out", tokenizer=3, progress=False)


def test_eos_without_a_known_end_token_asks_for_eos_id(tmp_path):
    src = write_jsonl(str(tmp_path / "c.jsonl"), ["ab"])
    with pytest.raises(ChuteError, match=r"has no end-of-document token .*--eos-id N \(eos_id=N\)"):
        convert(src, tmp_path / "out", tokenizer=_codepoints, eos=True, workers=0, progress=False)


def _codepoints(text: str) -> list[int]:
    return [ord(c) for c in text]


def _negative(text: str) -> list[int]:
    return [-1] if "bad" in text else [1]


def _not_ids(text: str) -> dict:
    return {"input_ids": [1, 2]}


def test_ids_a_function_returns_are_checked(tmp_path):
    src = write_jsonl(str(tmp_path / "c.jsonl"), ["fine", "bad one"])
    with pytest.raises(ChuteError, match=r"c.jsonl line 2: the tokenizer function .*_negative gave token id -1"):
        convert(src, tmp_path / "out", tokenizer=_negative, workers=0, progress=False)
    with pytest.raises(ChuteError, match=r"c.jsonl line 1 and on: the tokenizer function .*_not_ids returned a dict"):
        convert(src, tmp_path / "out", tokenizer=_not_ids, workers=0, progress=False)
    with pytest.raises(ChuteError, match=r"line 1: the tokenizer function .*_codepoints gave token id 102, outside its vocabulary of 100"):
        convert(src, tmp_path / "out", tokenizer=_codepoints, vocab_size=100, workers=0, progress=False)


# --------------------------------------------------------------------------- the command line


def test_cli_converts_and_reports(tmp_path, tokenizer_json, capsys):
    src = write_jsonl(str(tmp_path / "corpus.jsonl.gz"), ["the dog", "", "hello world"], key="body")
    out = str(tmp_path / "out")
    status = main(["convert", src, out, "--tokenizer", tokenizer_json, "--text-key", "body", "--eos", "--workers", "2", "--quiet"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith("wrote 2 documents, ")
    assert "(uint16) in 1 shard(s)" in captured.out
    assert "1 of 3 documents were empty (no tokens): skipped (keep them with --keep-empty" in captured.out
    import chute

    ds = chute.open(out)
    eos = ds.metadata["tokens"]["eos_id"]
    assert documents(ds) == expected(tokenizer_json, ["the dog", "hello world"], eos=eos)


def test_cli_errors_are_one_line(tmp_path, tokenizer_json, capsys):
    src = write_jsonl(str(tmp_path / "corpus.jsonl"), ["the dog"])
    assert main(["convert", src, str(tmp_path / "out"), "--tokenizer", tokenizer_json, "--text-key", "body", "--workers", "0"]) == 1
    assert capsys.readouterr().err.strip().endswith("corpus.jsonl line 1: no 'body' key (its keys: 'id', 'text'); name the text's key with --text-key")
    assert main(["convert", src, str(tmp_path / "out"), "--eos"]) == 1
    assert "--eos: only with --tokenizer TOKENIZER" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")
