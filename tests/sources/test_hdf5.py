"""HDF5 (and NetCDF4) files: converted with no option, and read in place with the Loader's order, resume and ranks."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import chute
from chute.cli import main
from chute.sources import convert, from_hdf5, open_hdf5

h5py = pytest.importorskip("h5py")

N = 300


def write_sim(path, *, compressed: bool, n: int = N, step: str = ">i4") -> dict[str, np.ndarray]:
    """A simulation file as people keep them: fields in nested groups, attributes, strings, variable-length arrays,
    big-endian ints, a coordinate of another length and a scalar. Returns the column values expected."""
    rng = np.random.default_rng(0)
    values = {
        "field": rng.standard_normal((n, 3, 5)).astype(np.float32),
        "label": np.arange(n, dtype=np.int64) % 7,
        "sim.step": np.arange(n, dtype=step),
        "sim.state.energy": rng.standard_normal(n),
        "sim.ok": rng.integers(0, 2, n).astype(bool),
    }
    chunked = {"chunks": True, "compression": "gzip", "shuffle": True} if compressed else {}
    with h5py.File(path, "w") as f:
        f.attrs["title"] = "run 12"
        f.attrs["dt"] = 0.25
        f.create_dataset("field", data=values["field"], **({"chunks": (16, 3, 5), "compression": "gzip"} if compressed else {}))
        f.create_dataset("label", data=values["label"], **chunked)
        sim = f.create_group("sim")
        sim.attrs["solver"] = b"rk4"
        sim.create_dataset("step", data=values["sim.step"], **chunked)
        sim.create_dataset("ok", data=values["sim.ok"])
        state = sim.create_group("state")
        state.create_dataset("energy", data=values["sim.state.energy"], **chunked).attrs["units"] = "J"
        f.create_dataset("lat", data=np.linspace(-90, 90, 7))
        f.create_dataset("nsteps", data=n)
    return values


def _every_row(ds, batch_size: int = 32) -> dict[str, list]:
    out: dict[str, list] = {}
    for batch in chute.Loader(ds, batch_size=batch_size, shuffle=False):
        for name, value in batch.items():
            out.setdefault(name, []).extend(value if isinstance(value, list) else list(value))
    return out


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "chunked-gzip"])
def test_an_hdf5_file_converts_with_no_option_and_the_loader_delivers_every_value(tmp_path, capsys, compressed):
    values = write_sim(tmp_path / "sim.h5", compressed=compressed)
    code = main(["convert", str(tmp_path / "sim.h5"), str(tmp_path / "ds"), "--workers", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    ds = chute.open(tmp_path / "ds")
    assert dict(ds.schema) == {
        "field": chute.Tensor("float32", (3, 5)), "label": chute.Scalar("int64"), "sim.ok": chute.Scalar("bool"),
        "sim.state.energy": chute.Scalar("float64"), "sim.step": chute.Scalar("int32"),
    }
    rows = _every_row(ds)
    for name, expected in values.items():
        got = torch.stack(rows[name]).numpy()
        assert got.dtype == expected.dtype.newbyteorder("=") and np.array_equal(got, expected), name
    assert ds.metadata["hdf5"]["attributes"] == {
        "/": {"title": "run 12", "dt": 0.25}, "/sim": {"solver": "rk4"}, "/sim/state/energy": {"units": "J"},
    }
    assert ds.metadata["source"] == {
        "kind": "hdf5", "file": "sim.h5",
        "skipped": {"lat": f"a first axis of 7, not the {N} rows of the other arrays",
                    "nsteps": "a 0-dimensional array (no first axis to index samples)"},
    }


def test_strings_bytes_and_variable_length_arrays(tmp_path):
    names = [f"sample-{i}-é" for i in range(50)]
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f.create_dataset("name", data=names, dtype=h5py.string_dtype())
        f.create_dataset("code", data=np.array([f"c{i}".encode() for i in range(50)], dtype="S4"))
        f.create_dataset("blob", data=np.array([bytes([i]) * 3 for i in range(50)], dtype=np.void(3)))
        tokens = f.create_dataset("tokens", (50,), dtype=h5py.vlen_dtype(np.int32), chunks=(8,), compression="gzip")
        for i in range(50):
            tokens[i] = np.arange(i % 6, dtype=np.int32)
    ds = from_hdf5(tmp_path / "s.h5", tmp_path / "ds", workers=0, progress=False)
    assert dict(ds.schema) == {"blob": chute.Bytes(), "code": chute.String(), "name": chute.String(),
                               "tokens": chute.Ragged("int32", 1)}
    rows = _every_row(ds, batch_size=7)
    assert rows["name"] == names and rows["code"] == [f"c{i}" for i in range(50)]
    assert rows["blob"] == [bytes([i]) * 3 for i in range(50)]
    assert [t.tolist() for t in rows["tokens"]] == [list(range(i % 6)) for i in range(50)]


def test_a_netcdf4_file_goes_through_the_same_path(tmp_path):
    """NetCDF4's layout as netCDF-C writes it: dimension scales, a dimension without values, coordinate variables."""
    n = 40
    temp = np.random.default_rng(1).standard_normal((n, 4, 6)).astype(np.float32)
    with h5py.File(tmp_path / "era.nc", "w") as f:
        f.attrs["Conventions"] = "CF-1.8"
        time = f.create_dataset("time", data=np.arange(n, dtype=np.float64))
        time.make_scale("time")
        lat = f.create_dataset("lat", data=np.linspace(-60, 60, 4))
        lat.make_scale("lat")
        phony = f.create_dataset("lon", (6,), dtype="f4")
        phony.make_scale("This is a netCDF dimension but not a netCDF variable.         6")
        t = f.create_dataset("t2m", data=temp)
        t.attrs["units"] = "K"
        for axis, scale in enumerate((time, lat, phony)):
            t.dims[axis].attach_scale(scale)
    ds = convert(tmp_path / "era.nc", tmp_path / "ds", progress=False)
    assert ds.schema.names == ["t2m", "time"]
    assert np.array_equal(ds.get_batch(np.arange(n))["t2m"].numpy(), temp)
    assert ds.metadata["hdf5"]["attributes"]["/t2m"] == {"units": "K"}  # its DIMENSION_LIST (references) is left out
    assert ds.metadata["source"]["skipped"] == {"lat": f"a first axis of 4, not the {n} rows of the other arrays"}


def test_files_that_are_not_hdf5_are_named(tmp_path):
    (tmp_path / "old.nc").write_bytes(b"CDF\x01" + bytes(60))
    with pytest.raises(chute.ChuteError, match=r"old.nc is a NetCDF classic \(version 3\) file, not NetCDF4/HDF5; convert it"):
        convert(tmp_path / "old.nc", tmp_path / "ds", progress=False)
    (tmp_path / "x.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(chute.ChuteError, match=r"x.h5 is not an HDF5 file"):
        convert(tmp_path / "x.h5", tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()


# --------------------------------------------------------------------------- read in place


def test_chute_open_of_an_hdf5_file_says_to_read_it_in_place_or_convert_it(tmp_path):
    """chute.open returns a chute.Dataset (manifest, checksums, verify), which the in-place view is not: opening an
    HDF5 file (by path or through the Loader) names the view and the converter, and imports no h5py."""
    write_sim(tmp_path / "sim.h5", compressed=False, n=20, step="<i4")
    os.rename(tmp_path / "sim.h5", tmp_path / "sim.data")  # found by its signature, whatever its name
    expected = (r"sim.data is an HDF5 file, not a chute dataset .*chute.sources.open_hdf5\('.*sim.data'\) .*"
                r"or convert it: chute convert .*sim.data DST")
    with pytest.raises(chute.ManifestError, match=expected):
        chute.open(tmp_path / "sim.data")
    with pytest.raises(chute.ManifestError, match=expected):
        chute.Loader(str(tmp_path / "sim.data"), batch_size=4)
    view = open_hdf5(tmp_path / "sim.data")  # what the message says works
    assert sorted(next(iter(chute.Loader(view, batch_size=20)))["label"].tolist()) == sorted(np.arange(20) % 7)
    code = (f"import sys, chute\ntry:\n    chute.open({str(tmp_path / 'sim.data')!r})\nexcept chute.ManifestError:\n"
            "    pass\nprint('h5py' in sys.modules)")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr


@pytest.fixture
def plain(tmp_path):
    values = write_sim(tmp_path / "sim.h5", compressed=False, n=1000, step="<i4")  # big-endian is not read in place
    return tmp_path / "sim.h5", values


def test_the_in_place_view_gives_the_batches_of_the_converted_dataset(tmp_path, plain):
    path, values = plain
    view = open_hdf5(path, shard_size="4KB")
    converted = from_hdf5(path, tmp_path / "ds", shard_size="4KB", progress=False, workers=0)
    assert view.schema == converted.schema and [s.rows for s in view.shards] == [s.rows for s in converted.shards]
    assert len(view.shards) > 4  # the shuffle permutes shards and windows: several of them
    ours = chute.Loader(view, batch_size=48, shuffle=True, seed=3)
    theirs = chute.Loader(converted, batch_size=48, shuffle=True, seed=3)
    count = 0
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        count += 1
    assert count == -(-1000 // 48)
    assert np.array_equal(view.get_batch([5, 999, 0])["field"].numpy(), values["field"][[5, 999, 0]])
    assert view[7]["sim.step"] == 7 and view.metadata == converted.metadata


def test_the_in_place_view_under_threads_and_processes_resumes_exactly_on_another_world_size(plain):
    path, values = plain
    view = open_hdf5(path, shard_size="8KB")
    whole = list(range(len(view)))

    def loaders(world, workers):
        return [chute.Loader(view, 20, shuffle=True, seed=5, rank=r, world_size=world, workers=w) for r, w in zip(range(world), workers)]

    first = loaders(3, [chute.Workers("threads", count=2)] * 3)
    iterators = [iter(x) for x in first]
    delivered = []
    for _ in range(5):
        for it in iterators:
            batch = next(it)
            assert np.array_equal(batch["field"].numpy(), values["field"][batch["sim.step"].numpy()])
            delivered += batch["sim.step"].tolist()
    state = first[0].state_dict()
    del iterators
    second = loaders(2, [chute.Workers("processes", count=1), chute.Workers("threads", count=2)])
    try:
        for x in second:
            x.load_state_dict(state)
        for x in second:
            for batch in x:
                steps = batch["sim.step"].numpy()
                assert np.array_equal(batch["field"].numpy(), values["field"][steps])  # every row read right
                delivered += steps.tolist()
    finally:
        for x in second:
            x.close()
    assert set(delivered) == set(whole)
    assert len(delivered) - len(whole) < 2 * 20  # the last step's padding only


def test_the_in_place_view_pickles_as_its_description(plain):
    path, values = plain
    view = open_hdf5(path, columns=["/field", "label"])
    again = pickle.loads(pickle.dumps(view))
    assert again.schema.names == ["field", "label"]
    assert np.array_equal(again.get_batch([1, 2])["field"].numpy(), values["field"][[1, 2]])
    assert len(pickle.dumps(view)) < 4096  # offsets and types, no data


def test_chunked_or_compressed_datasets_are_refused_in_place_with_what_to_do(tmp_path):
    write_sim(tmp_path / "sim.h5", compressed=True)
    with pytest.raises(chute.ChuteError) as info:
        open_hdf5(tmp_path / "sim.h5")
    assert str(info.value) == (
        f"{tmp_path / 'sim.h5'}: dataset /field cannot be read in place: it is chunked and compressed; convert the file "
        "(chute convert sim.h5 OUT), or leave the dataset out with columns="
    )
    view = open_hdf5(tmp_path / "sim.h5", columns=["sim.ok"])  # a contiguous one of the same file
    assert len(view) == N


def test_a_file_rewritten_after_the_view_was_opened_is_an_error_not_a_wrong_read(tmp_path, plain):
    path, _ = plain
    view = open_hdf5(path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(chute.ShardError, match="changed since it was opened in place; open it again"):
        view.get_batch([0])
