"""The NumPy converter: .npy (memory-mapped) and .npz (streamed), first axis = samples."""

from __future__ import annotations

import numpy as np
import pytest
from source_data import no_dataset_at

import chute
from chute.errors import ChuteError
from chute.sources import from_numpy, npy


def test_npy_tensor_rows(tmp_path, no_fd_leak):
    array = np.random.default_rng(0).standard_normal((37, 4, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", array)
    ds = from_numpy(tmp_path / "x.npy", tmp_path / "out", progress=False)
    ds.verify()
    assert ds.schema.names == ["data"] and ds.schema["data"] == chute.Tensor("float32", (4, 5))
    np.testing.assert_array_equal(ds.get_batch(list(range(37)))["data"].numpy(), array)


def test_npy_1d_gives_scalars_and_column_name(tmp_path):
    array = np.arange(10, dtype=np.uint16) * 7
    np.save(tmp_path / "y.npy", array)
    ds = from_numpy(tmp_path / "y.npy", tmp_path / "out", column="label", progress=False)
    assert ds.schema["label"] == chute.Scalar("uint16")
    assert ds.get_batch(list(range(10)))["label"].numpy().tolist() == array.tolist()


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_one_column_per_array_across_blocks(tmp_path, monkeypatch, compressed, no_fd_leak):
    monkeypatch.setattr(npy, "BLOCK_BYTES", 100)  # several blocks, lined up across arrays
    rng = np.random.default_rng(1)
    arrays = {
        "image": rng.integers(0, 256, (23, 3, 4), dtype=np.uint8),
        "label": np.arange(23, dtype=np.int64),
        "weight": np.asfortranarray(rng.standard_normal((23, 2))),  # Fortran order: read whole
        "flag": np.arange(23) % 3 == 0,
        "name": np.array([f"n{i}" for i in range(23)]),
    }
    (np.savez_compressed if compressed else np.savez)(tmp_path / "d.npz", **arrays)
    ds = from_numpy(tmp_path / "d.npz", tmp_path / "out", progress=False)
    ds.verify()
    assert ds.schema.names == list(arrays)
    assert ds.schema["image"] == chute.Tensor("uint8", (3, 4)) and ds.schema["name"] == chute.String()
    batch = ds.get_batch(list(range(23)))
    for name in ["image", "label", "weight", "flag"]:
        np.testing.assert_array_equal(batch[name].numpy(), arrays[name], err_msg=name)
    assert batch["name"] == arrays["name"].tolist()


def test_npz_arrays_of_different_lengths_are_named(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((5, 2)), y=np.zeros(6))
    with pytest.raises(ChuteError) as info:
        from_numpy(tmp_path / "bad.npz", tmp_path / "out", progress=False)
    assert "x: 5" in str(info.value) and "y: 6" in str(info.value)
    assert no_dataset_at(tmp_path / "out")


def test_unsupported_arrays_are_refused(tmp_path):
    np.save(tmp_path / "c.npy", np.zeros(3, dtype=np.complex64))
    with pytest.raises(ChuteError, match="complex64"):
        from_numpy(tmp_path / "c.npy", tmp_path / "out", progress=False)
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ChuteError, match="unpickling"):
        from_numpy(tmp_path / "o.npy", tmp_path / "out", progress=False)
    np.save(tmp_path / "z.npy", np.float32(3))
    with pytest.raises(ChuteError, match="0-dimensional"):
        from_numpy(tmp_path / "z.npy", tmp_path / "out", progress=False)
