"""Values written come back exactly: every column kind and dtype, in any batch order."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
import torch

import chute
from chute.format.reader import torch_dtype

NUMPY_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16", "float32", "float64"]


def _random_array(rng: np.random.Generator, dtype: str, shape) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _assert_tensor_equal(got: torch.Tensor, want) -> None:
    want_t = want if isinstance(want, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(want))
    assert got.dtype == want_t.dtype
    assert tuple(got.shape) == tuple(want_t.shape)
    # compare bytes: exact, NaN-safe, and works for dtypes without comparison kernels
    if got.numel():
        assert got.contiguous().view(torch.uint8).numpy().tobytes() == want_t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_tensor_columns_round_trip_every_dtype(tmp_path, dtype):
    rng = np.random.default_rng(1)
    arrays = [_random_array(rng, dtype, (2, 3, 5)) for _ in range(50)]
    ds = chute.write(({"x": a} for a in arrays), tmp_path / "ds", shard_size=400)
    assert len(ds.shards) > 3  # several shards, so batches cross shard boundaries
    assert ds.schema["x"] == chute.Tensor(dtype, (2, 3, 5))
    order = list(range(50))
    random.Random(0).shuffle(order)
    batch = ds.get_batch(order)
    _assert_tensor_equal(batch["x"], np.stack([arrays[i] for i in order]))
    _assert_tensor_equal(ds[17]["x"], arrays[17])


def test_bfloat16_torch_tensors_round_trip(tmp_path):
    values = [torch.randn(4, 2).to(torch.bfloat16) for _ in range(10)]
    ds = chute.write(({"w": v} for v in values), tmp_path / "ds")
    assert ds.schema["w"] == chute.Tensor("bfloat16", (4, 2))
    _assert_tensor_equal(ds.get_batch(range(10))["w"], torch.stack(values))


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_scalar_columns_round_trip_every_dtype(tmp_path, dtype):
    rng = np.random.default_rng(2)
    values = list(_random_array(rng, dtype, (40,)))  # numpy scalars keep their dtype
    ds = chute.write(({"s": v} for v in values), tmp_path / "ds", shard_size=50)
    assert ds.schema["s"] == chute.Scalar(dtype)
    batch = ds.get_batch([39, 0, 20, 20])
    _assert_tensor_equal(batch["s"], np.array([values[i] for i in (39, 0, 20, 20)]))
    assert ds[5]["s"] == values[5].item()


def test_python_scalars_strings_bytes(tmp_path):
    samples = [
        {"i": i * 10**12, "f": i / 3, "b": i % 3 == 0, "s": f"échantillon {i} ✓", "raw": bytes(range(i % 256)) * 3}
        for i in range(300)
    ]
    ds = chute.write(samples, tmp_path / "ds", shard_size=2000)
    assert [ds.schema[c] for c in "ifbs"] == [chute.Scalar("int64"), chute.Scalar("float64"), chute.Scalar("bool"), chute.String()]
    for i in (0, 1, 150, 299):
        assert ds[i] == samples[i]
    batch = ds.get_batch([299, 0, 150])
    assert batch["i"].tolist() == [299 * 10**12, 0, 150 * 10**12]
    assert batch["b"].dtype == torch.bool and batch["b"].tolist() == [False, True, True]
    assert batch["s"] == [samples[i]["s"] for i in (299, 0, 150)]
    assert batch["raw"] == [samples[i]["raw"] for i in (299, 0, 150)]


def test_ragged_one_and_many_dimensions(tmp_path):
    rng = np.random.default_rng(3)
    tokens = [rng.integers(0, 50_000, rng.integers(0, 40), dtype=np.int32) for _ in range(100)]
    boxes = [rng.standard_normal((rng.integers(0, 5), 4)).astype(np.float32) for _ in range(100)]
    ds = chute.write(({"tokens": t, "boxes": b} for t, b in zip(tokens, boxes)), tmp_path / "ds", shard_size=1000)
    assert ds.schema["tokens"] == chute.Ragged("int32", 1)
    assert ds.schema["boxes"] == chute.Ragged("float32", 2)
    order = [99, 3, 50, 3, 0]
    batch = ds.get_batch(order)
    for got, i in zip(batch["tokens"], order):
        _assert_tensor_equal(got, tokens[i])
    for got, i in zip(batch["boxes"], order):
        _assert_tensor_equal(got, boxes[i])


def test_declared_ragged_schema_accepts_equal_shapes_in_window(tmp_path):
    # Inference cannot know a shape will vary if the first samples agree: declare it.
    arrays = [np.zeros(4, np.int64)] * 5 + [np.zeros(7, np.int64)]
    with pytest.raises(chute.SchemaError, match="sample 5") as error:
        chute.write(({"t": a} for a in arrays), tmp_path / "a", lookahead=5)
    assert "chute.Ragged('int64', ndim=1)" in str(error.value)
    ds = chute.write(({"t": a} for a in arrays), tmp_path / "b", schema={"t": chute.Ragged("int64")})
    assert [len(x) for x in ds.get_batch(range(6))["t"]] == [4] * 5 + [7]
    # ... or let the look-ahead window see the variation
    ds = chute.write(({"t": a} for a in arrays), tmp_path / "c")
    assert ds.schema["t"] == chute.Ragged("int64", 1)


def test_dicts_with_varying_keys_keep_every_key(tmp_path):
    # W1: each sample is a dict of ten random 5-digit keys.
    rng = random.Random(4)
    dicts = [{f"{rng.randrange(10**5):05d}": f"{rng.randrange(10**5):05d}" for _ in range(10)} for _ in range(500)]
    ds = chute.write(({"data": d} for d in dicts), tmp_path / "ds", shard_size=20_000)
    assert ds.schema.names == ["data"]  # one map column, no column per key
    assert ds.schema["data"] == chute.Map("string")
    assert ds.get_batch(range(500))["data"] == dicts
    assert ds[123]["data"] == dicts[123]


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([{"a": b"x", "b": b""}, {"c": b"\x00\xff"}], "bytes"),
        ([{"a": 1}, {"b": -(2**40)}], "int64"),
        ([{"a": 1}, {"b": 2.5}], "float64"),
        ([{"a": [1, "x"]}, {"b": None, "c": {"d": 1.5}}], "json"),
        ([{}, {"a": "x"}], "string"),
    ],
)
def test_map_value_kinds(tmp_path, values, kind):
    ds = chute.write(({"m": v} for v in values), tmp_path / "ds")
    assert ds.schema["m"] == chute.Map(kind)
    got = ds.get_batch([0, 1])["m"]
    assert got == values
    if kind == "float64":
        assert all(isinstance(x, float) for d in got for x in d.values())


def test_json_column(tmp_path):
    values = [["a", {"b": [1, 2, None]}], ["c"], [], ["ünï"]]
    ds = chute.write(({"j": v} for v in values), tmp_path / "ds")
    assert ds.schema["j"] == chute.Json()
    assert ds.get_batch([3, 2, 1, 0])["j"] == values[::-1]


def test_get_batch_fills_out_buffers_and_returns_writable_copies(tmp_path):
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (64, 3, 4, 4), dtype=np.uint8)
    ds = chute.write(({"image": im, "label": i} for i, im in enumerate(images)), tmp_path / "ds", shard_size=1024)
    out = {"image": torch.empty(8, 3, 4, 4, dtype=torch.uint8), "label": torch.empty(8, dtype=torch.int64)}
    order = [63, 1, 40, 2, 2, 17, 0, 62]
    batch = ds.get_batch(order, out=out)
    assert batch["image"] is out["image"] and batch["label"] is out["label"]
    _assert_tensor_equal(out["image"], images[order])
    assert out["label"].tolist() == order
    out["image"].fill_(0)  # the caller owns the buffer: writing it does not touch the dataset
    _assert_tensor_equal(ds.get_batch(order)["image"], images[order])
    with pytest.raises(ValueError, match="out\\['image'\\]"):
        ds.get_batch(order, out={"image": torch.empty(7, 3, 4, 4, dtype=torch.uint8)})


def test_batch_orders_grouped_sorted_and_shuffled_agree(tmp_path):
    n = 1000
    values = np.arange(n * 6, dtype=np.int16).reshape(n, 6)
    ds = chute.write(({"v": v, "i": i} for i, v in enumerate(values)), tmp_path / "ds", shard_size=1500)
    rng = np.random.default_rng(6)
    for order in (
        np.arange(n),  # sorted, all shards
        np.concatenate([rng.permutation(np.arange(a, a + 100)) for a in range(0, n, 100)]),  # grouped by shard
        rng.permutation(n),  # shuffled across shards
        rng.integers(0, n, 300),  # with repeats
        np.array([], dtype=np.int64),
    ):
        batch = ds.get_batch(order)
        assert batch["i"].tolist() == order.tolist()
        _assert_tensor_equal(batch["v"], values[order])


def test_index_errors(tmp_path):
    ds = chute.write(({"x": i} for i in range(10)), tmp_path / "ds")
    assert ds[-1]["x"] == 9
    with pytest.raises(IndexError, match="row 10 is out of range"):
        ds[10]
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch([0, 3, 11])
    with pytest.raises(IndexError, match="row -1"):
        ds.get_batch([-1])
    with pytest.raises(TypeError):
        ds["x"]


def test_dataset_pickles_and_reads_the_same(tmp_path):
    ds = chute.write(({"x": np.full(3, i, np.float32)} for i in range(20)), tmp_path / "ds", shard_size=40)
    ds.get_batch([1, 19])  # map some shards first: the pickle must not carry them
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == 20 and clone.schema == ds.schema
    _assert_tensor_equal(clone.get_batch([19, 1])["x"], ds.get_batch([19, 1])["x"])


def test_shards_are_plain_arrow_ipc_files(tmp_path):
    """Any Arrow reader can open a chute shard: one record batch, fixed_shape_tensor columns."""
    images = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    ds = chute.write(({"im": im, "name": str(i)} for i, im in enumerate(images)), tmp_path / "ds")
    with pa.memory_map(ds.shard_path(0)) as source:
        reader = pa.ipc.open_file(source)
        assert reader.num_record_batches == 1
        table = reader.read_all()
    assert table.column("name").to_pylist() == [str(i) for i in range(5)]
    np.testing.assert_array_equal(table.column("im").combine_chunks().to_numpy_ndarray(), images)


def test_torch_dtypes_cover_every_chute_dtype():
    for dtype in chute.format.schema.DTYPES:
        assert torch_dtype(dtype).itemsize == (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)


def test_big_rows_in_random_order_across_shards(tmp_path):
    # rows over 32 KiB take the row-by-row path; smaller ones the gather-then-reorder path
    records = np.random.default_rng(7).standard_normal((24, 9000)).astype(np.float32)
    ds = chute.write(({"r": r} for r in records), tmp_path / "ds", shard_size=100_000)
    assert len(ds.shards) >= 8
    order = [23, 0, 11, 5, 5, 17, 2, 23]
    _assert_tensor_equal(ds.get_batch(order)["r"], records[order])
