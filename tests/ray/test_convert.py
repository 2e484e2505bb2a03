"""chute convert --ray: every converter's source read and written by Ray tasks gives the same dataset."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.ray import convert_on_ray
from chute.sources import convert
from tests.sources.source_data import image_bytes, no_dataset_at, write_pickle_index


def _rows(ds) -> list[dict]:
    batch = ds.get_batch(np.arange(len(ds)))
    out = []
    for i in range(len(ds)):
        row = {}
        for name in ds.schema.names:
            value = batch[name][i]
            row[name] = value.tolist() if hasattr(value, "tolist") else value
        out.append(row)
    return out


def _assert_same(plain, on_ray) -> None:
    assert on_ray.schema == plain.schema
    assert on_ray.metadata == plain.metadata
    assert _rows(on_ray) == _rows(plain)
    # parts are coalesced into write tasks of about a shard's worth (shard_size=2000 below): no shard per part
    assert len(on_ray.shards) <= max(1, 2 * on_ray.nbytes // 2000 + 2)
    plain.close()
    on_ray.close()


def _both(src, tmp_path, **options):
    readers = {"workers": 0} if options["kind"] in ("index", "images") else {}  # read in this process
    plain = convert(src, tmp_path / "plain", progress=False, **readers, **options)
    on_ray = convert_on_ray(src, tmp_path / "ray", address="local", shard_size=2000, rows_per_part=7, **options)
    return plain, on_ray


def test_index_of_pickles(local_ray, tmp_path):
    index, _ = write_pickle_index(tmp_path / "src", 40)
    _assert_same(*_both(index, tmp_path, kind="index", allow_pickle=True))


def test_pickles_are_refused_before_any_task_runs(local_ray, tmp_path):
    index, _ = write_pickle_index(tmp_path / "src", 5)
    with pytest.raises(chute.PickleRefusedError):
        convert_on_ray(index, tmp_path / "ray", address="local")
    assert no_dataset_at(tmp_path / "ray")


def test_image_folder(local_ray, tmp_path):
    for label in ("cat", "dog"):
        os.makedirs(tmp_path / "img" / label)
        for i in range(12):
            (tmp_path / "img" / label / f"{i:02d}.png").write_bytes(image_bytes("PNG", i + (label == "dog") * 100))
    _assert_same(*_both(tmp_path / "img", tmp_path, kind="images"))


def test_parquet_files_with_a_tensor_column(local_ray, tmp_path):
    os.makedirs(tmp_path / "pq")
    for f in range(3):
        ids = list(range(f * 20, f * 20 + 20))
        table = pa.table({"id": ids, "v": [[float(i), float(i) + 1] for i in ids], "s": [f"x{i}" for i in ids]})
        pq.write_table(table, tmp_path / "pq" / f"part-{f}.parquet")
    plain, on_ray = _both(tmp_path / "pq", tmp_path, kind="arrow")
    assert plain.schema["v"] == chute.Tensor("float64", (2,))
    _assert_same(plain, on_ray)


def test_webdataset_tars(local_ray, tmp_path):
    os.makedirs(tmp_path / "wds")
    for t in range(3):
        with tarfile.open(tmp_path / "wds" / f"shard-{t}.tar", "w") as tar:
            for i in range(t * 10, t * 10 + 10):
                for field, data in (("cls", str(i % 4).encode()), ("json", json.dumps({"i": i}).encode())):
                    info = tarfile.TarInfo(f"{i:05d}.{field}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    _assert_same(*_both(tmp_path / "wds", tmp_path, kind="webdataset"))


def test_npy_rows(local_ray, tmp_path):
    np.save(tmp_path / "a.npy", np.arange(60 * 6, dtype=np.int16).reshape(60, 2, 3))
    _assert_same(*_both(tmp_path / "a.npy", tmp_path, kind="numpy"))


def test_hugging_face_dataset(local_ray, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(50)], "label": list(range(50))})
    ds.save_to_disk(str(tmp_path / "hf"))
    _assert_same(*_both(str(tmp_path / "hf"), tmp_path, kind="hf"))


def test_a_bad_file_fails_the_job_and_leaves_nothing(local_ray, tmp_path):
    index, _ = write_pickle_index(tmp_path / "src", 30)
    os.remove(tmp_path / "src" / "pickles" / "17.pkl.gz")
    with pytest.raises(Exception, match=r"index.csv row 18.*pickles/17.pkl.gz does not exist"):
        convert_on_ray(index, tmp_path / "ray", address="local", allow_pickle=True, shard_size=500, rows_per_part=5)
    assert not os.path.exists(tmp_path / "ray"), os.listdir(tmp_path / "ray")  # nothing left: shards, lock file and the folder the writer made


def test_cli_convert_with_ray(local_ray, tmp_path, capsys):
    from chute.cli import main

    np.save(tmp_path / "a.npy", np.arange(100, dtype=np.float32))
    assert main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "out"), "--ray", "local", "--quiet"]) == 0
    assert "wrote 100 rows" in capsys.readouterr().out
    ds = chute.open(tmp_path / "out")
    assert ds.get_batch(np.arange(100))["data"].tolist() == list(range(100))
    ds.close()


def test_sources_convert_with_ray_still_works_with_a_warning(local_ray, tmp_path):
    """The deprecated path (CHANGELOG.md): the same dataset, a FutureWarning naming the replacement."""
    np.save(tmp_path / "a.npy", np.arange(30, dtype=np.int32))
    with pytest.warns(FutureWarning, match=r"ray= is deprecated .* removed in chute 0.2; use chute.ray.convert_on_ray"):
        ds = convert(tmp_path / "a.npy", tmp_path / "out", ray="local")
    assert ds.get_batch(np.arange(30))["data"].tolist() == list(range(30))
    ds.close()


def test_hdf5_zarr_lmdb_and_tfrecord_sources(local_ray, tmp_path):
    """The new sources through Ray tasks give the dataset the converter writes (uniform values: --ray takes the
    LMDB and TFRecord columns from the first part)."""
    h5py = pytest.importorskip("h5py")
    zarr = pytest.importorskip("zarr")
    lmdb = pytest.importorskip("lmdb")
    from chute.sources._example_pb import Example
    from chute.sources.tfrecord import frame

    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(80 * 3, dtype=np.float32).reshape(80, 3), chunks=(16, 3), compression="gzip")
        f.create_dataset("name", data=[f"n{i}" for i in range(80)], dtype=h5py.string_dtype())
    group = zarr.open_group(str(tmp_path / "a.zarr"), mode="w")
    group.create_array("y", shape=(50, 2), chunks=(8, 2), dtype="i4")[:] = np.arange(100, dtype=np.int32).reshape(50, 2)
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(40):
            txn.put(f"{i:04d}".encode(), pickle.dumps({"v": np.full(2, i, np.int64), "label": i % 3}))
    env.close()
    records = []
    for i in range(60):
        ex = Example()
        ex.features.feature["label"].int64_list.value.append(i)
        ex.features.feature["emb"].float_list.value.extend([i / 2, i / 4])
        records.append(frame(ex.SerializeToString()))
    (tmp_path / "a.tfrecord").write_bytes(b"".join(records))
    _assert_same(*_both(tmp_path / "a.h5", tmp_path / "h5", kind="hdf5"))
    _assert_same(*_both(tmp_path / "a.zarr", tmp_path / "zarr", kind="zarr"))
    _assert_same(*_both(tmp_path / "db", tmp_path / "lmdb", kind="lmdb", allow_pickle=True))
    _assert_same(*_both(tmp_path / "a.tfrecord", tmp_path / "tf", kind="tfrecord"))
