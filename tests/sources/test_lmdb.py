"""LMDB databases: a row per key, values as pickled dicts (behind --allow-pickle), .npy bytes or raw bytes."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

import chute
from chute.cli import main
from chute.sources import convert

lmdb = pytest.importorskip("lmdb")


def write_db(path, values: dict[bytes, bytes]) -> None:
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()


def _dicts(n: int) -> list[dict]:
    """What a "many small samples in LMDB" script pickles: an array, a label, tags, a nested numpy scalar;
    the last array is longer."""
    return [{"x": np.arange(8 if i == n - 1 else 5, dtype=np.float32) * i, "label": i % 10, "tags": ["a"] * (i % 3),
             "meta": {"w": np.int64(100 + i)}} for i in range(n)]


def _rows(ds) -> list[dict]:
    rows = []
    for batch in chute.Loader(ds, batch_size=64, shuffle=False):
        for j in range(len(batch["key"])):
            rows.append({k: v[j] for k, v in batch.items()})
    return rows


def test_an_lmdb_of_pickled_dicts_converts_with_allow_pickle_only(tmp_path, capsys):
    dicts = _dicts(700)
    write_db(tmp_path / "train.lmdb", {f"{i:08d}".encode(): pickle.dumps(d) for i, d in enumerate(dicts)})
    code = main(["convert", str(tmp_path / "train.lmdb"), str(tmp_path / "ds"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "holds pickled values (700 keys)" in err and "--allow-pickle" in err, err
    assert not (tmp_path / "ds").exists()
    code = main(["convert", str(tmp_path / "train.lmdb"), str(tmp_path / "ds"), "--allow-pickle", "--workers", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    ds = chute.open(tmp_path / "ds")
    assert dict(ds.schema) == {"key": chute.String(), "x": chute.Ragged("float32", 1), "label": chute.Scalar("int64"),
                               "tags": chute.Json(), "meta.w": chute.Scalar("int64")}
    rows = _rows(ds)
    assert len(rows) == 700
    for i, (row, d) in enumerate(zip(rows, dicts)):
        assert row["key"] == f"{i:08d}"
        assert row["x"].numpy().tobytes() == d["x"].tobytes()
        assert int(row["label"]) == d["label"] and row["tags"] == d["tags"] and int(row["meta.w"]) == d["meta"]["w"]
    assert ds.metadata["source"] == {"kind": "lmdb", "database": "train.lmdb", "values": "pickle"}


def test_npy_values_and_raw_bytes(tmp_path):
    arrays = {f"k{i:03d}".encode(): np.full((2, 3), i, dtype=np.int16) for i in range(40)}

    def npy(a):
        out = io.BytesIO()
        np.save(out, a)
        return out.getvalue()

    write_db(tmp_path / "arrays", {k: npy(a) for k, a in arrays.items()})
    ds = convert(tmp_path / "arrays", tmp_path / "a", workers=0, progress=False)
    assert ds.schema["data"] == chute.Tensor("int16", (2, 3))
    batch = ds.get_batch(np.arange(40))
    assert np.array_equal(batch["data"].numpy(), np.stack(list(arrays.values())))
    images = {bytes([0xFF, i]): b"\xff\xd8" + bytes([i]) * 30 for i in range(20)}  # binary keys, image bytes
    write_db(tmp_path / "images", images)
    ds = convert(tmp_path / "images", tmp_path / "b", workers=2, progress=False)
    assert dict(ds.schema) == {"key": chute.Bytes(), "data": chute.Bytes()}
    assert [ds[i]["key"] for i in range(20)] == sorted(images) and [ds[i]["data"] for i in range(20)] == [images[k] for k in sorted(images)]


def test_a_damaged_pickle_is_named_by_its_key(tmp_path):
    values = {f"{i:03d}".encode(): pickle.dumps({"v": i}) for i in range(10)}
    values[b"007"] = values[b"007"][:5]
    write_db(tmp_path / "db", values)
    with pytest.raises(chute.ChuteError, match=r"db key b'007': the value cannot be read as pickle"):
        convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=0, progress=False)
    assert not (tmp_path / "ds").exists()


@pytest.fixture
def small_ranges(monkeypatch):
    """Ranges of 16 keys (a chunk of 1): the readers' ranges and the first range's plan on a small database."""
    import chute.sources.lmdb as module

    monkeypatch.setattr(module, "chunk_size_for", lambda total, workers: 1)
    decoded = []
    real = module.unpickle
    monkeypatch.setattr(module, "unpickle", lambda value: decoded.append(1) or real(value))
    return decoded


def _same_rows(ds, dicts) -> None:
    rows = _rows(ds)
    assert len(rows) == len(dicts)
    for row, d in zip(rows, dicts):
        assert row["x"].numpy().tobytes() == d["x"].tobytes() and int(row["label"]) == d["label"]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_value_is_decoded_once_when_the_first_range_has_every_type(tmp_path, small_ranges, workers):
    dicts = [{"x": np.arange(5, dtype=np.float32) * i, "label": i % 10} for i in range(100)]
    write_db(tmp_path / "db", {f"{i:08d}".encode(): pickle.dumps(d) for i, d in enumerate(dicts)})
    ds = convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=workers, progress=False)
    assert dict(ds.schema) == {"key": chute.String(), "x": chute.Tensor("float32", (5,)), "label": chute.Scalar("int64")}
    assert len(ds.shards) >= 1 and len(ds) == 100
    _same_rows(ds, dicts)
    if workers == 0:  # (in reader processes the count is theirs)
        assert len(small_ranges) == 100


@pytest.mark.parametrize("workers", [0, 2])
def test_types_that_change_after_the_first_range_are_written_again_with_every_values_types(tmp_path, small_ranges, workers):
    dicts = _dicts(100)  # the last array is longer: a ragged column, which the first range does not show
    values = {f"{i:08d}".encode(): pickle.dumps(d) for i, d in enumerate(dicts)}
    values[b"\xff late"] = pickle.dumps({**dicts[0], "extra": 1.5})  # a key that is not UTF-8, a field seen late
    write_db(tmp_path / "db", values)
    ds = convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=workers, progress=False)
    assert dict(ds.schema) == {"key": chute.Bytes(), "x": chute.Ragged("float32", 1), "label": chute.Scalar("int64"),
                               "tags": chute.Json(), "meta.w": chute.Scalar("int64"),
                               "extra": chute.Nullable(chute.Scalar("float64"))}
    _same_rows(ds, dicts + [dicts[0]])
    assert ds[100]["key"] == b"\xff late" and ds[100]["extra"] == 1.5 and ds[99]["extra"] is None
    if workers == 0:  # once to find the types differ, once more to write
        assert len(small_ranges) == 2 * 101


def test_a_value_that_does_not_fit_any_type_is_named_as_before(tmp_path, small_ranges):
    dicts = [{"x": np.arange(3, dtype=np.float32), "label": i} for i in range(60)]
    dicts[50]["label"] = np.zeros(2, np.complex64)  # no chute type holds it
    values = {f"{i:08d}".encode(): pickle.dumps(d) for i, d in enumerate(dicts)}
    write_db(tmp_path / "db", values)
    with pytest.raises(chute.ChuteError) as info:
        convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=0, progress=False)
    assert "db key number 50" in str(info.value), str(info.value)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_value_the_writer_refuses_is_named_after_the_one_pass_gives_up(tmp_path, small_ranges, workers):
    dicts = [{"x": np.arange(3, dtype=np.float32), "label": i} for i in range(80)]
    write_db(tmp_path / "db", {f"{i:08d}".encode(): pickle.dumps(d) for i, d in enumerate(dicts)})
    with pytest.raises(chute.SchemaError, match=r"column 'label': expected str, found int"):
        convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=workers, progress=False,
                column_types={"label": chute.String()})
    assert not (tmp_path / "ds").exists()
    ds = convert(tmp_path / "db", tmp_path / "ds", allow_pickle=True, workers=workers, progress=False)
    assert len(ds) == 80  # (the readers are left as they were)
