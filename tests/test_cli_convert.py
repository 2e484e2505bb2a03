"""``chute convert``'s per-kind flags, end to end: the flags the converters' error messages ask for exist and work."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.cli import main


def _convert(capsys, *argv: str) -> tuple[int, str]:
    code = main(["convert", *argv, "--quiet"])
    out = capsys.readouterr()
    return code, out.err.strip()


def test_path_column_and_root_for_bare_file_names(tmp_path, capsys):
    """The write-up's CSV lists bare names (12.pkl.gz) that its Dataset prefixes with a folder."""
    (tmp_path / "pickles").mkdir()
    dicts = [{f"k{i}": f"v{i}", "shared": "x"} for i in range(12)]
    for i, d in enumerate(dicts):
        with gzip.open(tmp_path / "pickles" / f"{i}.pkl.gz", "wb") as f:
            pickle.dump(d, f)
    (tmp_path / "index.csv").write_text("id,file\n" + "".join(f"{i},{i}.pkl.gz\n" for i in range(12)))
    dst = str(tmp_path / "ds")

    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--allow-pickle", "--workers", "0", "--path-column", "name")
    assert code == 1 and err.endswith("pass the one that holds the file paths as path_column= (chute convert --path-column)")
    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--allow-pickle", "--workers", "0", "--path-column", "file")
    assert code == 1 and err.endswith("if the index's paths are relative to another folder, pass root= (chute convert --root FOLDER)")
    assert not os.path.exists(dst)

    code, err = _convert(
        capsys, str(tmp_path / "index.csv"), dst, "--allow-pickle", "--workers", "0", "--path-column", "file", "--root", str(tmp_path / "pickles")
    )
    assert code == 0, err
    ds = chute.open(dst)
    assert ds.schema.names == ["path", "id", "data"]
    assert [ds[i]["data"] for i in range(12)] == dicts


def test_data_type_when_the_inferred_one_does_not_hold(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    values = [{"k": i} for i in range(70)] + [{"k": "seventy"}]
    for i, v in enumerate(values):
        (tmp_path / "src" / f"{i}.json").write_text(json.dumps(v))
    (tmp_path / "src" / "list.txt").write_text("".join(f"{i}.json\n" for i in range(71)))
    index, dst = str(tmp_path / "src" / "list.txt"), str(tmp_path / "ds")
    code, err = _convert(capsys, index, dst, "--workers", "0")
    assert code == 1 and "70.json" in err and err.endswith("; add --column-type k=json")
    code, err = _convert(capsys, index, dst, "--workers", "0", "--column-type", "k=json")
    assert code == 0, err
    assert chute.open(dst)[70]["k"] == "seventy"


def test_split_and_columns_for_a_hugging_face_dataset_dict(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")  # in the test extra
    rows = {"text": [f"t{i}" for i in range(6)], "label": list(range(6))}
    saved = str(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows).select(range(2))}).save_to_disk(saved)
    dst = str(tmp_path / "ds")
    code, err = _convert(capsys, saved, dst)
    assert code == 1 and err.endswith("choose one with split= (chute convert --split NAME)")
    code, err = _convert(capsys, saved, dst, "--split", "test", "--columns", "text")
    assert code == 0, err
    ds = chute.open(dst)
    assert ds.schema.names == ["text"] and [ds[i]["text"] for i in range(len(ds))] == ["t0", "t1"]


def test_columns_leaves_out_a_column_with_missing_values(tmp_path, capsys):
    pq.write_table(pa.table({"a": list(range(5)), "b": pa.array([1, None, 3, 4, 5], pa.int64())}), tmp_path / "t.parquet")
    dst = str(tmp_path / "ds")
    code, err = _convert(capsys, str(tmp_path / "t.parquet"), dst)
    assert code == 1 and "column 'b' is null" in err and "chute convert --columns" in err
    code, err = _convert(capsys, str(tmp_path / "t.parquet"), dst, "--columns", "a")
    assert code == 0, err
    assert chute.open(dst).get_batch(range(5))["a"].tolist() == list(range(5))


def _proposed(err: str) -> list[str]:
    import shlex

    assert "; add " in err, err
    return shlex.split(err.rsplit("; add ", 1)[1])


def test_a_label_that_is_not_a_number_names_its_row_and_the_fix(tmp_path, capsys):
    (tmp_path / "f").mkdir()
    for i in range(5):
        (tmp_path / "f" / f"{i}.json").write_text(json.dumps([i]))
    labels = ["3", "1", "4", "n/a", "5"]
    (tmp_path / "index.csv").write_text("path,label\n" + "".join(f"f/{i}.json,{labels[i]}\n" for i in range(5)))
    dst = str(tmp_path / "ds")
    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--workers", "0")
    assert code == 1 and "row 4, line 5" in err and "'n/a'" in err  # never a silent change to strings
    fix = _proposed(err)
    assert fix == ["--column-type", "label=string"]
    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--workers", "0", *fix)
    assert code == 0, err
    assert [chute.open(dst)[i]["label"] for i in range(5)] == labels


def test_path_column_not_first_is_proposed(tmp_path, capsys):
    (tmp_path / "f").mkdir()
    for i in range(3):
        (tmp_path / "f" / f"{i}.json").write_text(json.dumps({"v": i}))
    (tmp_path / "index.csv").write_text("id,file\n" + "".join(f"{i},f/{i}.json\n" for i in range(3)))
    dst = str(tmp_path / "ds")
    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--workers", "0")
    assert code == 1 and "column 'file' holds existing files" in err
    fix = _proposed(err)
    assert fix == ["--path-column", "file"]
    code, err = _convert(capsys, str(tmp_path / "index.csv"), dst, "--workers", "0", *fix)
    assert code == 0, err
    assert [chute.open(dst)[i]["v"] for i in range(3)] == [0, 1, 2]


def test_a_file_that_is_not_a_dataset_is_called_so(tmp_path, capsys):
    (tmp_path / "index.csv").write_text("path\na.json\n")
    assert main(["inspect", str(tmp_path / "index.csv")]) == 1
    err = capsys.readouterr().err
    assert "index.csv is a file, not a chute dataset" in err and "does not exist" not in err


def test_ctrl_c_while_the_arguments_are_parsed_prints_no_traceback(monkeypatch, capsys):
    import chute.sources._column_type as column_type

    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(column_type, "parse_column_type", interrupted)
    assert main(["convert", "a.csv", "out", "--data-type", "json"]) == 130
    err = capsys.readouterr().err
    assert err == "chute: interrupted\n"
