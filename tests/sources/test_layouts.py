"""Layouts a new user brings that crashed the converter (issue 33): lists of strings, numpy scalars in nested
dicts, a late shape change, a non-UTF-8 line, and metadata that named paths of the converting machine."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

import chute
from chute.cli import main
from chute.sources import convert


def _samples(n: int = 40) -> list[dict]:
    """Pickled dicts as reductions and tagging scripts leave them: str lists (some empty), numpy scalars two levels
    down, and an array whose shape changes in the last sample."""
    out = []
    for i in range(n):
        x = np.arange(6 if i == n - 1 else 4, dtype=np.float32) + i
        out.append({
            "x": x,
            "tags": [f"t{i}", "common"] if i % 3 else [],
            "meta": {"w": np.int64(20 + i), "mean": x.mean(), "ok": np.bool_(i % 2), "lens": {"n": np.int32(i)}},
        })
    return out


def _write_pickles(folder, samples) -> str:
    folder.mkdir()
    for i, sample in enumerate(samples):
        (folder / f"{i}.pkl").write_bytes(pickle.dumps(sample))
    (folder / "list.txt").write_text("".join(f"{i}.pkl\n" for i in range(len(samples))))
    return str(folder / "list.txt")


def _rows(ds) -> list[dict]:
    rows = []
    for batch in chute.Loader(ds, batch_size=7, shuffle=False):
        for j in range(len(batch["path"])):
            rows.append({k: v[j] for k, v in batch.items()})
    return rows


def test_pickled_dicts_with_str_lists_numpy_scalars_and_a_late_shape_change_convert_with_no_option(tmp_path, capsys):
    samples = _samples()
    index = _write_pickles(tmp_path / "src", samples)
    code = main(["convert", index, str(tmp_path / "ds"), "--allow-pickle", "--workers", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    ds = chute.open(tmp_path / "ds")
    assert dict(ds.schema) == {
        "path": chute.String(), "x": chute.Ragged("float32", 1), "tags": chute.Json(), "meta.w": chute.Scalar("int64"),
        "meta.mean": chute.Scalar("float32"), "meta.ok": chute.Scalar("bool"), "meta.lens.n": chute.Scalar("int32"),
    }
    rows = _rows(ds)
    assert len(rows) == len(samples)
    for row, sample in zip(rows, samples):
        assert row["x"].numpy().tobytes() == sample["x"].tobytes()
        assert row["tags"] == sample["tags"]
        assert int(row["meta.w"]) == sample["meta"]["w"] and row["meta.w"].dtype == torch.int64
        assert row["meta.mean"].item() == sample["meta"]["mean"]
        assert bool(row["meta.ok"]) == bool(sample["meta"]["ok"])
        assert int(row["meta.lens.n"]) == sample["meta"]["lens"]["n"]


def test_a_json_line_holding_a_list_of_strings_or_an_empty_list_converts(tmp_path):
    lines = [{"tags": ["a", "b"], "n": 0}, {"tags": [], "n": 1}, {"tags": ["c"], "n": 2}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    ds = convert(tmp_path / "a.jsonl", tmp_path / "ds", progress=False)
    assert ds.schema["tags"] == chute.Json()
    assert [ds[i]["tags"] for i in range(3)] == [["a", "b"], [], ["c"]]


def test_a_list_that_is_sometimes_empty_among_number_lists_is_a_ragged_column(tmp_path):
    lines = [{"v": [1.5, 2.0]}, {"v": []}, {"v": [3.0, 4.0]}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    ds = convert(tmp_path / "a.jsonl", tmp_path / "ds", progress=False)
    assert ds.schema["v"] == chute.Ragged("float64", 1)
    assert [ds[i]["v"].tolist() for i in range(3)] == [[1.5, 2.0], [], [3.0, 4.0]]


def test_chute_write_stores_numpy_scalars_in_nested_dicts_and_lists(tmp_path):
    samples = [{"meta": {"w": np.int64(20), "h": np.int64(7)}, "stats": {"m": np.float32(0.5), "s": "x"}, "tags": ["a"]},
               {"meta": {"w": 3, "h": np.int64(9)}, "stats": {"m": 1.0, "s": "y"}, "tags": []}]
    chute.write(samples, tmp_path / "ds")
    ds = chute.open(tmp_path / "ds")
    assert ds.schema["meta"] == chute.Map("int64") and ds.schema["stats"] == chute.Map("json")
    assert ds[0] == {"meta": {"w": 20, "h": 7}, "stats": {"m": 0.5, "s": "x"}, "tags": ["a"]}
    assert ds[1] == {"meta": {"w": 3, "h": 9}, "stats": {"m": 1.0, "s": "y"}, "tags": []}


def test_a_line_that_is_not_utf8_is_named_with_what_to_do(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_bytes(b'{"t": "ok"}\n{"t": "caf\xe9"}\n')
    code = main(["convert", str(tmp_path / "a.jsonl"), str(tmp_path / "ds"), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "a.jsonl line 2: not UTF-8 text (byte 0xe9 at column 11); JSON lines are UTF-8: convert the file "
        "(e.g. iconv -f LATIN1 -t UTF-8 a.jsonl) or fix the line"
    ), err
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("kind", ["index", "jsonl"])
def test_metadata_names_no_path_of_the_converting_machine(tmp_path, kind):
    if kind == "index":
        src = _write_pickles(tmp_path / "src", _samples(4))
        ds = convert(src, tmp_path / "ds", allow_pickle=True, workers=0, progress=False)
        assert ds.metadata["source"] == {"kind": "index", "index": "list.txt", "root": "."}
    else:
        (tmp_path / "a.jsonl").write_text('{"n": 1}\n')
        ds = convert(tmp_path / "a.jsonl", tmp_path / "ds", progress=False)
        assert ds.metadata["source"] == {"kind": "jsonl", "files": ["a.jsonl"]}
    assert str(tmp_path) not in json.dumps(ds.metadata)
