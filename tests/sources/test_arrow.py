"""The Parquet / Arrow / Feather converter: types mapped sensibly, values and order preserved."""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch
from source_data import no_dataset_at

import chute
from chute.errors import ChuteError
from chute.sources import from_arrow_files

N = 50


def _table(offset: int = 0, n: int = N) -> pa.Table:
    rng = np.random.default_rng(offset)
    ids = np.arange(offset, offset + n)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "u8": pa.array(ids % 256, pa.uint8()),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "flag": pa.array(ids % 2 == 0),
        "text": pa.array([f"row {i} é" for i in ids], pa.large_string()),
        "blob": pa.array([bytes([i % 256]) * (i % 5) for i in ids], pa.binary()),
        "fixed": pa.array(list(rng.standard_normal((n, 3))), pa.list_(pa.float64(), 3)),
        "const": pa.array([[[int(i)] * 2] * 3 for i in ids], pa.list_(pa.list_(pa.int32()))),
        "tokens": pa.array([list(range(i % 7)) for i in ids], pa.list_(pa.int64())),
        "grid": pa.array([[[0.5] * (i % 3 + 1)] * 2 for i in ids], pa.large_list(pa.list_(pa.float32()))),
        "jagged": pa.array([[[1], [1, 2]]] * n, pa.list_(pa.list_(pa.int64()))),
        "meta": pa.array([{"x": int(i), "tags": ["a"] * (i % 2)} for i in ids]),
        "words": pa.array([["w"] * (i % 3) for i in ids]),
        "kv": pa.array([[("k", int(i)), (f"k{i}", 1)] for i in ids], pa.map_(pa.string(), pa.int32())),
        "color": pa.array(["red", "blue"] * (n // 2)).dictionary_encode(),
        "when": pa.array([datetime.date(2024, 1, 1) + datetime.timedelta(days=int(i)) for i in ids]),
        "image": pa.array([{"bytes": b"\x89PNG" + bytes([i % 256]), "path": None} for i in ids],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    })


def _expected_row(table: pa.Table, i: int) -> dict:
    return {name: table.column(name)[i].as_py() for name in table.column_names}


def _as_py(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def test_parquet_types_and_values(tmp_path, no_fd_leak):
    table = _table()
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)  # several row groups
    ds = from_arrow_files(tmp_path / "t.parquet", tmp_path / "out", progress=False)
    ds.verify()
    s = ds.schema
    assert s["id"] == chute.Scalar("int64") and s["u8"] == chute.Scalar("uint8")
    assert s["f32"] == chute.Scalar("float32") and s["flag"] == chute.Scalar("bool")
    assert s["text"] == chute.String() and s["blob"] == chute.Bytes() and s["image"] == chute.Bytes()
    assert s["fixed"] == chute.Tensor("float64", (3,))
    assert s["const"] == chute.Tensor("int32", (3, 2))  # variable-size lists, one shape in every row
    assert s["tokens"] == chute.Ragged("int64", 1)
    assert s["grid"] == chute.Ragged("float32", 2)
    assert s["jagged"] == chute.Json()  # rows that are not rectangular arrays
    assert s["meta"] == chute.Json() and s["words"] == chute.Json() and s["when"] == chute.Json()
    assert s["kv"] == chute.Map("int64")
    assert s["color"] == chute.String()
    assert len(ds) == N
    for i in range(N):
        row = ds[i]
        want = _expected_row(table, i)
        want["kv"] = dict(want["kv"])
        want["when"] = want["when"].isoformat()
        want["image"] = want["image"]["bytes"]
        got = {k: _as_py(v) for k, v in row.items()}
        assert got["f32"] == pytest.approx(want.pop("f32"), rel=1e-7)
        got.pop("f32")
        assert got == want


def test_files_in_a_directory_keep_file_then_row_order(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(_table(0, 20), src / "b.parquet")
    pq.write_table(_table(20, 20), src / "c.parquet")
    pq.write_table(_table(40, 10).select(["id", "text"]), tmp_path / "other.parquet")
    ds = from_arrow_files(src, tmp_path / "out", columns=["id", "text"], progress=False)
    assert ds.schema.names == ["id", "text"]
    assert ds.get_batch(list(range(40)))["id"].tolist() == list(range(40))
    ds = from_arrow_files([src / "c.parquet", tmp_path / "other.parquet"], tmp_path / "list", columns=["id"], progress=False)
    assert ds.get_batch(list(range(30)))["id"].tolist() == list(range(20, 50))


def test_arrow_ipc_file_stream_and_feather(tmp_path, no_fd_leak):
    table = _table().select(["id", "text", "tokens", "fixed"])
    with pa.OSFile(str(tmp_path / "f.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=7):
            w.write_batch(batch)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=9)
    feather.write_feather(table, tmp_path / "t.feather", compression="zstd")
    for name in ["f.arrow", "s.arrow", "t.feather"]:
        ds = from_arrow_files(tmp_path / name, tmp_path / f"out-{name}", progress=False)
        ds.verify()
        assert ds.get_batch(list(range(N)))["id"].tolist() == list(range(N)), name
        assert [ds[i]["tokens"].tolist() for i in range(N)] == table.column("tokens").to_pylist()
        np.testing.assert_array_equal(ds.get_batch(list(range(N)))["fixed"].numpy(), np.array(table.column("fixed").to_pylist()))


def test_nulls_are_an_error_naming_file_row_and_column(tmp_path):
    table = pa.table({"a": pa.array(list(range(30)) + [None] + [1] * 9, pa.int64()), "b": list(range(40))})
    pq.write_table(table, tmp_path / "n.parquet")
    with pytest.raises(ChuteError) as info:
        from_arrow_files(tmp_path / "n.parquet", tmp_path / "out", progress=False)
    message = str(info.value)
    assert "n.parquet" in message and "row 30" in message and "'a'" in message
    assert no_dataset_at(tmp_path / "out")
    assert "leave the column out (columns=" in message  # the fix it proposes
    ds = from_arrow_files(tmp_path / "n.parquet", tmp_path / "out", columns=["b"], progress=False)
    assert ds.get_batch(list(range(40)))["b"].tolist() == list(range(40))


def test_nulls_inside_a_json_column_are_kept(tmp_path):
    table = pa.table({"m": pa.array([[{"x": 1}], None, [{"x": None}]])})  # a list of structs: JSON
    pq.write_table(table, tmp_path / "j.parquet")
    ds = from_arrow_files(tmp_path / "j.parquet", tmp_path / "out", progress=False)
    assert [ds[i]["m"] for i in range(3)] == [[{"x": 1}], None, [{"x": None}]]


def test_struct_fields_become_dotted_nullable_columns(tmp_path):
    table = pa.table({"id": [1, 2, 3], "meta": pa.array([{"w": 1, "src": {"cam": "a"}}, None, {"w": 3, "src": {"cam": None}}])})
    pq.write_table(table, tmp_path / "s.parquet")
    ds = from_arrow_files(tmp_path / "s.parquet", tmp_path / "out", progress=False)
    assert ds.schema.names == ["id", "meta.w", "meta.src.cam"]
    assert ds.schema["meta.w"] == chute.Nullable(chute.Scalar("int64"))
    batch = ds.get_batch([0, 1, 2])
    assert batch["meta.src.cam"] == ["a", None, None]
    assert batch["meta.w"][1] is None and int(batch["meta.w"][2]) == 3
    assert ds.get_batch([0, 2])["meta.w"].tolist() == [1, 3]  # no None in the batch: one tensor


def test_files_with_different_schemas_are_refused(tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"a": ["x", "y"]}), tmp_path / "2.parquet")
    with pytest.raises(ChuteError, match=r"2\.parquet.*same schema.*'a'"):
        from_arrow_files(tmp_path, tmp_path / "out", progress=False)


def test_not_an_arrow_file_and_missing_file(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"garbage that is not parquet")
    with pytest.raises(ChuteError, match="x.parquet"):
        from_arrow_files(tmp_path / "x.parquet", tmp_path / "out", progress=False)
    with pytest.raises(ChuteError, match="does not exist"):
        from_arrow_files(tmp_path / "missing.parquet", tmp_path / "out", progress=False)


def test_empty_file_gives_an_empty_dataset(tmp_path):
    pq.write_table(pa.table({"a": pa.array([], pa.int32())}), tmp_path / "e.parquet")
    ds = from_arrow_files(tmp_path / "e.parquet", tmp_path / "out", progress=False)
    assert len(ds) == 0 and ds.schema["a"] == chute.Scalar("int32")
