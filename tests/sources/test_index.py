"""The index converter: the write-up's CSV + per-sample .pkl.gz files, and friends."""

from __future__ import annotations

import gzip
import json
import os
import random

import numpy as np
import pytest
from source_data import image_bytes, no_dataset_at, ten_key_dict, write_pickle_index

import chute
from chute.errors import ChuteError, PickleRefusedError, SchemaError
from chute.sources import from_index


def _read_all(ds) -> list[dict]:
    return [ds[i] for i in range(len(ds))]


def test_pickled_dicts_come_back_equal_with_every_key(tmp_path, pickle_index):
    index, dicts = pickle_index
    ds = from_index(index, tmp_path / "out", allow_pickle=True, workers=0, progress=False)
    ds.verify()
    assert len(ds) == len(dicts)
    assert ds.schema["data"] == chute.Map("string")
    rows = _read_all(ds)
    assert [r["data"] for r in rows] == dicts  # order, every key of every (different) dict
    assert len({frozenset(r["data"]) for r in rows}) == len(dicts)  # keys really differ per sample
    assert [r["path"] for r in rows] == [f"pickles/{i}.pkl.gz" for i in range(len(dicts))]


def test_extra_columns_are_typed_int_float_str(tmp_path, pickle_index):
    index, dicts = pickle_index
    ds = from_index(index, tmp_path / "out", allow_pickle=True, workers=0, progress=False)
    assert ds.schema.names == ["path", "label", "weight", "name", "data"]
    assert ds.schema["label"] == chute.Scalar("int64")
    assert ds.schema["weight"] == chute.Scalar("float64")
    assert ds.schema["name"] == chute.String()
    batch = ds.get_batch(list(range(len(ds))))
    assert batch["label"].tolist() == [i % 3 for i in range(len(dicts))]
    assert batch["weight"].tolist() == [i / 4 for i in range(len(dicts))]
    assert batch["name"] == [f"item-{i}" for i in range(len(dicts))]


def test_workers_give_the_same_dataset_as_in_process(tmp_path):
    index, _ = write_pickle_index(tmp_path / "src", 150)
    a = from_index(index, tmp_path / "a", allow_pickle=True, workers=0, progress=False)
    b = from_index(index, tmp_path / "b", allow_pickle=True, workers=2, progress=False)
    b.verify()
    assert _read_all(a) == _read_all(b)


def test_pickles_are_refused_without_opt_in_and_nothing_is_written(tmp_path, pickle_index):
    index, _ = pickle_index
    dst = tmp_path / "out"
    with pytest.raises(PickleRefusedError) as info:
        from_index(index, dst, workers=0, progress=False)
    message = str(info.value)
    assert "pickles/0.pkl.gz" in message
    assert "allow-pickle" in message and "allow_pickle=True" in message
    assert "arbitrary code" in message
    assert "40" not in message or "39 more" in message  # counts the other pickle files
    assert not dst.exists()
    assert len(from_index(index, dst, allow_pickle=True, workers=0, progress=False)) == 40  # the fix it proposes


def test_a_pickle_late_in_the_index_is_refused_before_any_file_is_read(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    names = [f"{i}.json" for i in range(5)] + ["late.pickle"]
    for name in names[:-1]:
        (src / name).write_text("{}")
    # late.pickle does not even exist: the refusal must come before any read
    (src / "list.txt").write_text("\n".join(names) + "\n")
    with pytest.raises(PickleRefusedError, match="late.pickle"):
        from_index(src / "list.txt", tmp_path / "out", workers=0, progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_file_names_the_row_and_path_and_leaves_no_dataset(tmp_path, pickle_index):
    index, _ = pickle_index
    os.remove(os.path.join(os.path.dirname(index), "pickles/17.pkl.gz"))
    dst = tmp_path / "out"
    with pytest.raises(ChuteError) as info:
        from_index(index, dst, allow_pickle=True, workers=0, progress=False)
    assert "pickles/17.pkl.gz" in str(info.value)
    assert "row 18" in str(info.value)  # 1-based data row
    assert no_dataset_at(dst)


def test_failure_in_a_worker_mid_way_leaves_no_dataset(tmp_path):
    index, _ = write_pickle_index(tmp_path / "src", 200)
    with open(os.path.join(tmp_path / "src", "pickles/150.pkl.gz"), "wb") as f:
        f.write(b"this is not gzip")
    dst = tmp_path / "out"
    with pytest.raises(ChuteError, match=r"pickles/150\.pkl\.gz"):
        from_index(index, dst, allow_pickle=True, workers=2, shard_size=2000, progress=False)
    assert no_dataset_at(dst)
    assert not dst.exists()  # shards written before the error are gone, and the folder the writer made


def test_failure_keeps_the_previous_dataset_intact(tmp_path, pickle_index):
    index, dicts = pickle_index
    dst = tmp_path / "out"
    from_index(index, dst, allow_pickle=True, workers=0, progress=False)
    os.remove(os.path.join(os.path.dirname(index), "pickles/5.pkl.gz"))
    with pytest.raises(ChuteError):
        from_index(index, dst, allow_pickle=True, workers=0, overwrite=True, progress=False)
    ds = chute.open(dst)
    ds.verify()
    assert [r["data"] for r in _read_all(ds)] == dicts


def test_text_index_of_json_npy_images_and_raw_files(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    values = [{"a": 1, "b": 2}, {"c": 3}, {}]
    for i, value in enumerate(values):
        (src / f"sub/{i}.json").write_text(json.dumps(value))
    with gzip.open(src / "sub/3.json.gz", "wt") as f:
        json.dump({"z": 26}, f)
    (src / "list.txt").write_text("sub/0.json\n\nsub/1.json\n  \nsub/2.json\nsub/3.json.gz\n")
    ds = from_index(src / "list.txt", tmp_path / "json", workers=0, progress=False)
    ds.verify()
    assert ds.schema.names == ["path", "data"]
    assert [ds[i]["data"] for i in range(len(ds))] == values + [{"z": 26}]  # differing keys all kept

    arrays = [np.arange(i, i + 6, dtype=np.float32).reshape(2, 3) for i in range(4)]
    for i, a in enumerate(arrays):
        np.save(src / f"a{i}.npy", a)
    (src / "arrays.txt").write_text("".join(f"{src}/a{i}.npy\n" for i in range(4)))  # absolute paths
    ds = from_index(src / "arrays.txt", tmp_path / "npy", workers=0, progress=False)
    assert ds.schema["data"] == chute.Tensor("float32", (2, 3))
    np.testing.assert_array_equal(ds.get_batch([0, 1, 2, 3])["data"].numpy(), np.stack(arrays))

    blobs = [image_bytes("JPEG", 1), image_bytes("PNG", 2), b"\x00raw\xff bytes"]
    for name, blob in zip(["x.jpg", "y.png", "z.bin"], blobs):
        (src / name).write_bytes(blob)
    (src / "files.csv").write_text("file,caption\nx.jpg,a cat\ny.png,a dog\nz.bin,noise\n")
    ds = from_index(src / "files.csv", tmp_path / "bytes", workers=0, progress=False)
    assert ds.schema.names == ["path", "caption", "data"]  # no "path" column: the first one is the path
    assert [ds[i]["data"] for i in range(3)] == blobs  # encoded bytes, not decoded
    assert [ds[i]["path"] for i in range(3)] == ["x.jpg", "y.png", "z.bin"]


def test_shapes_that_vary_late_make_a_ragged_column(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    arrays = [np.ones((2, 2), np.int16)] * 70 + [np.ones((3, 1), np.int16)]
    for i, a in enumerate(arrays):
        np.save(src / f"{i}.npy", a)
    (src / "list.txt").write_text("".join(f"{i}.npy\n" for i in range(len(arrays))))
    ds = from_index(src / "list.txt", tmp_path / "inferred", workers=0, progress=False)  # every file is looked at
    assert ds.schema["data"] == chute.Ragged("int16", 2) and tuple(ds[70]["data"].shape) == (3, 1)
    ds = from_index(src / "list.txt", tmp_path / "declared", data_type=chute.Ragged("int16", 2), workers=0, progress=False)
    assert tuple(ds[70]["data"].shape) == (3, 1)


def test_path_column_option_and_clashing_columns(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.json").write_text("[1, 2]")
    (src / "i.csv").write_text("id,file\n7,a.json\n")
    ds = from_index(src / "i.csv", tmp_path / "out", path_column="file", workers=0, progress=False)
    assert ds[0]["path"] == "a.json" and ds[0]["id"] == 7
    (src / "bad.csv").write_text("path,data\na.json,x\n")
    with pytest.raises(ChuteError, match="'data'"):
        from_index(src / "bad.csv", tmp_path / "bad", workers=0, progress=False)


def test_rows_with_a_wrong_field_count_are_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "i.csv").write_text("path,label\na.json,1\nb.json\n")
    with pytest.raises(ChuteError, match="i.csv row 2, line 3 has 1 fields"):
        from_index(src / "i.csv", tmp_path / "out", workers=0, progress=False)


def test_an_empty_index_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ChuteError, match="no files"):
        from_index(tmp_path / "empty.txt", tmp_path / "out", workers=0, progress=False)


def test_map_values_that_differ_in_kind_become_json(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(0)
    values = [ten_key_dict(rng), {"n": 1, "s": "x", "l": [1, 2]}]
    for i, v in enumerate(values):
        (src / f"{i}.json").write_text(json.dumps(v))
    (src / "l.txt").write_text("0.json\n1.json\n")
    ds = from_index(src / "l.txt", tmp_path / "out", workers=0, progress=False)
    assert ds.schema["data"] == chute.Map("json")
    assert [ds[i]["data"] for i in range(2)] == values


def test_a_csv_written_by_pandas_to_csv_with_its_index_column(tmp_path, pickle_index):
    pandas = pytest.importorskip("pandas")  # installed with the test extra (datasets needs it)
    index, dicts = pickle_index
    frame = pandas.read_csv(index)
    frame = frame[frame["label"] != 1]  # a filtered frame: its row index is no longer 0..n-1
    frame.to_csv(tmp_path / "src" / "pandas.csv")  # the default: the row index first, under an empty name
    assert open(tmp_path / "src" / "pandas.csv").readline().startswith(",path,")
    expected = [d for i, d in enumerate(dicts) if i % 3 != 1]

    ds = from_index(tmp_path / "src" / "pandas.csv", tmp_path / "out", allow_pickle=True, workers=0, progress=False)
    assert ds.schema.names == ["path", "label", "weight", "name", "data"]  # the unnamed index column is skipped
    assert [r["data"] for r in _read_all(ds)] == expected

    frame[["label", "path"]].to_csv(tmp_path / "src" / "named.csv")
    ds = from_index(tmp_path / "src" / "named.csv", tmp_path / "named", path_column="path", allow_pickle=True, workers=0, progress=False)
    assert ds.schema.names == ["path", "label", "data"]
    assert [r["data"] for r in _read_all(ds)] == expected


def test_an_unnamed_column_that_is_not_first_is_still_refused(tmp_path):
    (tmp_path / "i.csv").write_text("path,,label\na.json,1,2\n")
    with pytest.raises(ChuteError, match=r"has an empty column name; name every column"):
        from_index(tmp_path / "i.csv", tmp_path / "out", workers=0, progress=False)


def test_a_missing_path_column_says_how_to_name_it(tmp_path):
    (tmp_path / "i.csv").write_text("file,label\na.json,1\n")
    with pytest.raises(ChuteError) as info:
        from_index(tmp_path / "i.csv", tmp_path / "out", path_column="filename", workers=0, progress=False)
    assert str(info.value) == (
        f"index {tmp_path / 'i.csv'} has no column 'filename'; its columns are ['file', 'label']: "
        "pass the one that holds the file paths as path_column= (chute convert --path-column)"
    )


def test_bare_file_names_resolved_under_root(tmp_path, pickle_index):
    """The write-up's CSV lists bare names (``12.pkl.gz``) that its Dataset prefixes with a folder."""
    index, dicts = pickle_index
    lines = ["path,label"] + [f"{i}.pkl.gz,{i % 3}" for i in range(len(dicts))]
    (tmp_path / "bare.csv").write_text("\n".join(lines) + "\n")

    with pytest.raises(ChuteError) as info:
        from_index(tmp_path / "bare.csv", tmp_path / "out", allow_pickle=True, workers=0, progress=False)
    assert str(info.value) == (
        f"bare.csv row 1, line 2: file 0.pkl.gz does not exist (looked for {tmp_path / '0.pkl.gz'}); relative paths "
        f"start from {tmp_path}: if the index's paths are relative to another folder, pass root= "
        "(chute convert --root FOLDER)"
    )
    assert not (tmp_path / "out").exists()

    root = os.path.join(os.path.dirname(index), "pickles")
    ds = from_index(tmp_path / "bare.csv", tmp_path / "out", root=root, allow_pickle=True, workers=0, progress=False)
    assert [r["data"] for r in _read_all(ds)] == dicts
    assert ds[3]["path"] == "3.pkl.gz"
    assert ds.metadata["source"] == {"kind": "index", "index": "bare.csv", "root": "src/pickles"}  # no path of this machine

    with pytest.raises(ChuteError, match=r"root='nowhere': .*nowhere is not a folder"):
        from_index(tmp_path / "bare.csv", tmp_path / "out2", root="nowhere", allow_pickle=True, workers=0, progress=False)


def test_windows_separators_in_an_index(tmp_path, pickle_index):
    index, dicts = pickle_index
    with open(index) as f:
        text = f.read()
    (tmp_path / "src" / "windows.csv").write_text(text.replace("pickles/", "pickles\\"))
    (tmp_path / "src" / "windows.txt").write_text("".join(f"pickles\\{i}.pkl.gz\r\n" for i in range(len(dicts))))
    for name in ("windows.csv", "windows.txt"):
        ds = from_index(tmp_path / "src" / name, tmp_path / name, allow_pickle=True, workers=0, progress=False)
        assert [r["data"] for r in _read_all(ds)] == dicts
        assert ds[0]["path"] == "pickles/0.pkl.gz"


def test_a_type_error_late_in_the_index_names_the_option_to_declare_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(70):
        (src / f"{i}.json").write_text(json.dumps({"k": i}))
    (src / "70.json").write_text(json.dumps({"k": [1, 2]}))
    (src / "list.txt").write_text("".join(f"{i}.json\n" for i in range(71)))
    with pytest.raises(SchemaError) as info:
        from_index(src / "list.txt", tmp_path / "out", workers=0, progress=False)
    message = str(info.value)
    assert "70.json" in message and "line 1 (0.json)" in message
    assert message.endswith("pass column_types={'k': chute.Json()} to from_index() / convert()")
    ds = from_index(src / "list.txt", tmp_path / "out", column_types={"k": chute.Json()}, workers=0, progress=False)
    assert ds[70]["k"] == [1, 2] and ds[3]["k"] == 3


def test_an_index_that_is_a_folder(tmp_path):
    with pytest.raises(ChuteError, match=r"is a folder; an index source is a \.csv/\.tsv file or a text file of paths"):
        from_index(tmp_path, tmp_path / "out", workers=0, progress=False)
