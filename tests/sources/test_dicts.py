"""Dict samples become one column per key: the layout most users bring (issue 20's "done when")."""

from __future__ import annotations

import gzip
import json
import pickle
import shlex

import numpy as np
import pytest
import torch
from source_data import write_dict_index

import chute
from chute.cli import main


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(["convert", *argv, "--quiet"])
    return code, capsys.readouterr().err.strip()


def _fix(err: str) -> list[str]:
    """The flags a ``chute convert`` error proposes (``...; add --column-type 'x=json'``)."""
    assert "; add " in err, err
    return shlex.split(err.rsplit("; add ", 1)[1])


def _rows(ds) -> list[dict]:
    """Every row through chute.Loader, in order, one dict per sample."""
    rows = []
    for batch in chute.Loader(ds, batch_size=16, shuffle=False):
        n = len(batch["path"])
        for j in range(n):
            rows.append({k: v[j] for k, v in batch.items()})
    return rows


def test_pickled_dicts_of_arrays_convert_with_no_option(tmp_path, capsys):
    """x float32[3,8,8] turning 6x6 in the last tenth, a label, an id, a nested dict, a key some files lack."""
    index, samples = write_dict_index(tmp_path / "src", 200)
    dst = str(tmp_path / "ds")
    code, err = _cli(capsys, index, dst, "--allow-pickle", "--workers", "2")
    assert code == 0, err
    ds = chute.open(dst)
    assert ds.schema.names == ["path", "x", "label", "id", "meta.width", "meta.source.camera", "meta.note"]
    assert ds.schema["x"] == chute.Ragged("float32", ndim=3)
    assert ds.schema["meta.note"] == chute.Nullable(chute.String())
    rows = _rows(ds)
    assert len(rows) == 200
    for i, (row, sample) in enumerate(zip(rows, samples)):
        assert row["path"] == f"files/{i}.pkl.gz"
        assert row["x"].dtype == torch.float32 and np.array_equal(row["x"].numpy(), sample["x"])
        assert row["x"].numpy().tobytes() == sample["x"].tobytes()  # bit-equal
        assert int(row["label"]) == sample["label"] and row["label"].dtype == torch.int64
        assert row["id"] == sample["id"]
        assert int(row["meta.width"]) == sample["meta"]["width"]
        assert row["meta.source.camera"] == sample["meta"]["source"]["camera"]
        assert row["meta.note"] == sample["meta"].get("note")


def test_batch_of_a_nullable_tensor_column(tmp_path):
    """A key some samples lack: a stacked tensor when the batch has none missing, else a list with None."""
    samples = [{"x": np.full(3, i, np.int32)} if i % 4 else {} for i in range(8)]
    root = tmp_path / "src"
    root.mkdir()
    for i, s in enumerate(samples):
        with gzip.open(root / f"{i}.pkl.gz", "wb") as f:
            pickle.dump({"y": i, **s}, f)
    (root / "list.txt").write_text("".join(f"{i}.pkl.gz\n" for i in range(8)))
    ds = chute.sources.convert(str(root / "list.txt"), tmp_path / "ds", allow_pickle=True, workers=0, progress=False)
    assert ds.schema["x"] == chute.Nullable(chute.Tensor("int32", (3,)))
    full = ds.get_batch([1, 2, 3])["x"]
    assert isinstance(full, torch.Tensor) and full.tolist() == [[1] * 3, [2] * 3, [3] * 3]
    some = ds.get_batch([3, 4, 5])["x"]
    assert some[1] is None and some[0].tolist() == [3] * 3 and some[2].tolist() == [5] * 3


def test_mixed_value_kinds_propose_a_type_that_works(tmp_path, capsys):
    """A key holding ints, then a str in file 70: the error names the file and a --column-type that stores both."""
    root = tmp_path / "src"
    root.mkdir()
    values = [{"k": i} for i in range(70)] + [{"k": "seventy"}]
    for i, v in enumerate(values):
        (root / f"{i}.json").write_text(json.dumps(v))
    (root / "list.txt").write_text("".join(f"{i}.json\n" for i in range(71)))
    dst = str(tmp_path / "ds")
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0")
    assert code == 1 and "70.json" in err and "column 'k'" in err
    fix = _fix(err)
    assert fix == ["--column-type", "k=json"]
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", *fix)
    assert code == 0, err
    ds = chute.open(dst)
    assert [ds[i]["k"] for i in range(71)] == [v["k"] for v in values]


def test_mixed_array_dtypes_propose_the_promoted_type(tmp_path, capsys):
    """int64 and float32 .npy files: --data-type float64 holds both exactly (a declared type casts when exact)."""
    root = tmp_path / "src"
    root.mkdir()
    arrays = [np.arange(6, dtype=np.int64).reshape(2, 3) + i if i % 2 else np.full((2, 3), i / 4, np.float32) for i in range(10)]
    for i, a in enumerate(arrays):
        np.save(root / f"{i}.npy", a)
    (root / "list.txt").write_text("".join(f"{i}.npy\n" for i in range(10)))
    dst = str(tmp_path / "ds")
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0")
    assert code == 1 and "1.npy" in err
    fix = _fix(err)
    assert fix == ["--data-type", "tensor(float64, (2, 3))"]
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", *fix)
    assert code == 0, err
    ds = chute.open(dst)
    assert all(np.array_equal(ds[i]["data"].numpy(), arrays[i]) for i in range(10))


def test_api_hint_is_in_python(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.json").write_text(json.dumps({"k": [1, "a"] if i == 2 else i}))
    (root / "list.txt").write_text("".join(f"{i}.json\n" for i in range(3)))
    with pytest.raises(chute.SchemaError) as error:
        chute.sources.convert(str(root / "list.txt"), tmp_path / "ds", workers=0, progress=False)
    assert str(error.value).endswith("pass column_types={'k': chute.Json()} to from_index() / convert()")
    ds = chute.sources.convert(str(root / "list.txt"), tmp_path / "ds", workers=0, progress=False, column_types={"k": chute.Json()})
    assert [ds[i]["k"] for i in range(3)] == [0, 1, [1, "a"]]


def test_declared_narrower_types_cast_when_exact_and_refuse_otherwise(tmp_path, capsys):
    """int64 labels into int32 (they fit); float64 arrays into float32 only with --cast, as the error says."""
    root = tmp_path / "src"
    root.mkdir()
    samples = [{"x": np.full(2, i / 3, np.float64), "label": i} for i in range(6)]
    for i, s in enumerate(samples):
        with gzip.open(root / f"{i}.pkl.gz", "wb") as f:
            pickle.dump(s, f)
    (root / "list.txt").write_text("".join(f"{i}.pkl.gz\n" for i in range(6)))
    dst = str(tmp_path / "ds")
    base = [str(root / "list.txt"), dst, "--allow-pickle", "--workers", "0", "--column-type", "label=scalar(int32)"]
    code, err = _cli(capsys, *base, "--column-type", "x=tensor(float32, (2,))")
    assert code == 1 and "1.pkl.gz" in err and "not all exactly float32" in err
    fix = _fix(err)
    assert fix[-1] == "--cast"
    code, err = _cli(capsys, *base, "--column-type", "x=tensor(float32, (2,))", *fix)
    assert code == 0, err
    ds = chute.open(dst)
    assert ds.schema["label"] == chute.Scalar("int32")
    batch = ds.get_batch(list(range(6)))
    assert batch["label"].tolist() == list(range(6))
    assert np.array_equal(batch["x"].numpy(), np.stack([s["x"] for s in samples]).astype(np.float32))


def test_a_value_that_does_not_fit_a_declared_int_is_refused(tmp_path, capsys):
    root = tmp_path / "src"
    root.mkdir()
    for i, v in enumerate([1, 2, 300]):
        (root / f"{i}.json").write_text(json.dumps({"v": np.arange(2).tolist(), "n": v}))
    (root / "list.txt").write_text("".join(f"{i}.json\n" for i in range(3)))
    dst = str(tmp_path / "ds")
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", "--column-type", "v=tensor(int8, (2,))",
                     "--column-type", "n=scalar(int8)")
    assert code == 1 and "2.json" in err and "column 'n'" in err
    fix = _fix(err)
    assert fix == ["--column-type", "v=tensor(int8, (2,))", "--column-type", "n=scalar(int64)"]
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", *fix)
    assert code == 0, err
    assert [chute.open(dst)[i]["n"] for i in range(3)] == [1, 2, 300]


def test_a_declared_tensor_whose_shape_varies_proposes_ragged(tmp_path, capsys):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(4):
        np.save(root / f"{i}.npy", np.zeros((2, 2 + i // 3), np.float32))
    (root / "list.txt").write_text("".join(f"{i}.npy\n" for i in range(4)))
    dst = str(tmp_path / "ds")
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", "--data-type", "tensor(float32, (2, 2))")
    assert code == 1 and "3.npy" in err and "shape varies" in err
    fix = _fix(err)
    assert fix == ["--data-type", "ragged(float32, 2)"]
    code, err = _cli(capsys, str(root / "list.txt"), dst, "--workers", "0", *fix)
    assert code == 0, err
    assert tuple(chute.open(dst)[3]["data"].shape) == (2, 3)
