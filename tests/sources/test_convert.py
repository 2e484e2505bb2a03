"""``convert``: auto-detection of every kind, the dispatch of options, and the CLI."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from source_data import image_bytes, no_dataset_at, write_pickle_index

import chute
from chute.cli import main
from chute.errors import ChuteError, PickleRefusedError
from chute.sources import KINDS, convert, detect_kind


def _tar(path, n: int) -> None:
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for field, data in (("txt", f"t{i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:04d}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def sources(tmp_path):
    """One source of every kind (and a few variants), keyed by the kind detection should report."""
    out = {}
    out["index"], _ = write_pickle_index(tmp_path / "index", 12)
    (tmp_path / "index" / "list.txt").write_text("pickles/0.pkl.gz\n")
    (tmp_path / "index" / "list.tsv").write_text("path\tx\npickles/0.pkl.gz\t1\n")
    out["index-txt"] = tmp_path / "index" / "list.txt"
    out["index-tsv"] = tmp_path / "index" / "list.tsv"
    for c in ["a", "b"]:
        (tmp_path / "images" / c).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "images" / c / f"{i}.jpg").write_bytes(image_bytes("JPEG", i))
    out["images"] = tmp_path / "images"
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"a": list(range(5))}), tmp_path / "pq" / "0.parquet")
    out["arrow"] = tmp_path / "pq" / "0.parquet"
    out["arrow-dir"] = tmp_path / "pq"
    with pa.OSFile(str(tmp_path / "t.feather"), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("a", pa.int64())])) as w:
        w.write_table(pa.table({"a": list(range(5))}))
    out["arrow-feather"] = tmp_path / "t.feather"
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"a": list(range(5))}).save_to_disk(str(tmp_path / "hf"))
    out["hf"] = tmp_path / "hf"
    np.save(tmp_path / "x.npy", np.arange(5))
    np.savez(tmp_path / "x.npz", a=np.arange(5))
    out["numpy"] = tmp_path / "x.npy"
    out["numpy-npz"] = tmp_path / "x.npz"
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "s-0.tar", 3)
    _tar(tmp_path / "wds" / "s-1.tar", 2)
    out["webdataset"] = tmp_path / "wds" / "s-0.tar"
    out["webdataset-dir"] = tmp_path / "wds"
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    out["jsonl"] = tmp_path / "a.jsonl"
    import h5py
    import lmdb
    import zarr

    from chute.sources._example_pb import Example
    from chute.sources.tfrecord import frame

    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["a"] = np.arange(4)
    with h5py.File(tmp_path / "x.nc", "w") as f:
        f["a"] = np.arange(3)
    out["hdf5"], out["hdf5-nc"] = tmp_path / "x.h5", tmp_path / "x.nc"
    zarr.open_group(str(tmp_path / "z"), mode="w").create_array("a", shape=(6,), dtype="i4")[:] = np.arange(6)
    out["zarr"] = tmp_path / "z"
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"raw bytes")
    env.close()
    out["lmdb"] = tmp_path / "db"
    example = Example()
    example.features.feature["a"].int64_list.value.append(1)
    (tmp_path / "t.tfrecord").write_bytes(frame(example.SerializeToString()) * 2)
    out["tfrecord"] = tmp_path / "t.tfrecord"
    return out


def test_detection_picks_the_right_kind_for_each_source(sources):
    for name, src in sources.items():
        assert detect_kind(src) == name.split("-")[0], name
    assert detect_kind(str(sources["webdataset-dir"] / "s-*.tar")) == "webdataset"
    assert detect_kind([sources["arrow"], sources["arrow-feather"]]) == "arrow"


def test_convert_detects_and_converts_every_kind(sources, tmp_path):
    expected_rows = {"index": 12, "index-txt": 1, "index-tsv": 1, "images": 6, "arrow": 5, "arrow-dir": 5,
                     "arrow-feather": 5, "hf": 5, "numpy": 5, "numpy-npz": 5, "webdataset": 3, "webdataset-dir": 5,
                     "jsonl": 2, "hdf5": 4, "hdf5-nc": 3, "zarr": 6, "lmdb": 1, "tfrecord": 2}
    for name, src in sources.items():
        ds = convert(src, tmp_path / "out" / name, allow_pickle=True, workers=0, progress=False)
        ds.verify()
        assert len(ds) == expected_rows[name], name
    assert chute.open(tmp_path / "out" / "images").metadata["class_names"] == ["a", "b"]


def test_undetectable_source_lists_the_kinds(tmp_path):
    (tmp_path / "mystery").mkdir()
    (tmp_path / "mystery" / "notes.md").write_text("?")
    with pytest.raises(ChuteError) as info:
        convert(tmp_path / "mystery", tmp_path / "out", progress=False)
    for kind in KINDS:
        assert kind in str(info.value)
    assert "kind=" in str(info.value) and "--kind" in str(info.value)
    with pytest.raises(ChuteError, match="does not exist"):
        convert(tmp_path / "nothing-here", tmp_path / "out", progress=False)
    with pytest.raises(ChuteError, match="unknown source kind 'csv'"):
        convert(tmp_path / "mystery", tmp_path / "out", kind="csv", progress=False)


def test_a_chute_dataset_is_not_a_source(sources, tmp_path):
    convert(sources["numpy"], tmp_path / "ds", progress=False)
    with pytest.raises(ChuteError, match="already a chute dataset"):
        detect_kind(tmp_path / "ds")


def test_explicit_kind_and_kind_specific_options(sources, tmp_path):
    ds = convert(sources["numpy"], tmp_path / "out", kind="numpy", column="x", progress=False)
    assert ds.schema.names == ["x"]
    with pytest.raises(ChuteError, match=r"path_column= \(--path-column\) does not apply to numpy sources; from_numpy takes column"):
        convert(sources["numpy"], tmp_path / "out2", kind="numpy", path_column="p", progress=False)
    assert not (tmp_path / "out2").exists()


def test_overwrite(sources, tmp_path):
    convert(sources["numpy"], tmp_path / "out", progress=False)
    with pytest.raises(ChuteError, match="overwrite"):
        convert(sources["arrow"], tmp_path / "out", progress=False)
    ds = convert(sources["arrow"], tmp_path / "out", overwrite=True, progress=False)
    assert ds.schema.names == ["a"]


def test_cli_convert(sources, tmp_path, capsys):
    dst = tmp_path / "cli"
    assert main(["convert", str(sources["index"]), str(dst), "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert "--allow-pickle" in err and "pickles/0.pkl.gz" in err
    assert no_dataset_at(dst)
    assert main(["convert", str(sources["index"]), str(dst), "--allow-pickle", "--workers", "2", "--shard-size", "1KB"]) == 0
    captured = capsys.readouterr()
    assert "wrote 12 rows" in captured.out
    assert "chute convert (index): 12 files in" in captured.err  # the progress bar's final line
    ds = chute.open(dst)
    assert len(ds.shards) > 1
    assert main(["convert", str(sources["images"]), str(tmp_path / "q"), "--kind", "images", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_pickle_refusal_through_convert(sources, tmp_path):
    with pytest.raises(PickleRefusedError):
        convert(sources["index"], tmp_path / "out", progress=False)
    assert not os.path.exists(tmp_path / "out")
    json.dumps(convert(sources["index"], tmp_path / "out", allow_pickle=True, workers=0, progress=False).metadata)
