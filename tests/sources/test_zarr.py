"""Zarr groups (v2 and v3): local with no option, and through fsspec URLs served by moto's S3 and an HTTP server."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import chute
from chute.cli import main
from chute.sources import convert

zarr = pytest.importorskip("zarr")

N = 250


def write_group(store, fmt: int, *, consolidated: bool = False) -> dict[str, object]:
    """A group with a compressed tensor (chunks of 32 rows), a nested group, strings and attributes."""
    rng = np.random.default_rng(fmt)
    values = {
        "x": rng.standard_normal((N, 4, 3)).astype(np.float32),
        "obs.t": np.arange(N, dtype=np.int64),
        "obs.flag": rng.integers(0, 2, N).astype(np.uint8),
        "name": [f"s{i}" for i in range(N)],
    }
    root = zarr.open_group(store, mode="w", zarr_format=fmt)
    root.attrs["title"] = "survey"
    root.create_array("x", shape=(N, 4, 3), chunks=(32, 4, 3), dtype="f4")[:] = values["x"]
    obs = root.create_group("obs")
    obs.attrs["units"] = "s"
    obs.create_array("t", shape=(N,), chunks=(100,), dtype="i8")[:] = values["obs.t"]
    obs.create_array("flag", shape=(N,), chunks=(64,), dtype="u1")[:] = values["obs.flag"]
    root.create_array("name", shape=(N,), chunks=(50,), dtype=str)[:] = np.array(values["name"])
    root.create_array("grid", shape=(9,), chunks=(9,), dtype="f8")[:] = np.linspace(0, 1, 9)
    if consolidated:
        zarr.consolidate_metadata(store)
    return values


def check(ds, values) -> None:
    assert dict(ds.schema) == {"name": chute.String(), "obs.flag": chute.Scalar("uint8"), "obs.t": chute.Scalar("int64"),
                               "x": chute.Tensor("float32", (4, 3))}
    rows: dict[str, list] = {}
    for batch in chute.Loader(ds, batch_size=40, shuffle=False):
        for name, value in batch.items():
            rows.setdefault(name, []).extend(value if isinstance(value, list) else list(value))
    assert np.array_equal(torch.stack(rows["x"]).numpy(), values["x"])
    assert torch.stack(rows["obs.t"]).tolist() == values["obs.t"].tolist()
    assert torch.stack(rows["obs.flag"]).tolist() == values["obs.flag"].tolist()
    assert rows["name"] == values["name"]
    assert ds.metadata["zarr"]["attributes"] == {"/": {"title": "survey"}, "/obs": {"units": "s"}}
    assert ds.metadata["source"]["skipped"] == {"grid": f"a first axis of 9, not the {N} rows of the other arrays"}


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_zarr_group_converts_with_no_option(tmp_path, capsys, fmt):
    values = write_group(str(tmp_path / "survey.zarr"), fmt)
    code = main(["convert", str(tmp_path / "survey.zarr"), str(tmp_path / "ds"), "--workers", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    check(chute.open(tmp_path / "ds"), values)


def test_a_directory_that_is_a_zarr_group_is_detected_by_its_metadata(tmp_path):
    values = write_group(str(tmp_path / "plain-dir"), 3)
    check(convert(tmp_path / "plain-dir", tmp_path / "ds", workers=0, progress=False), values)
    ds = convert(tmp_path / "plain-dir", tmp_path / "two", columns=["x", "obs/t"], workers=0, progress=False)
    assert ds.schema.names == ["x", "obs.t"]


def test_a_zarr_group_in_s3(moto_s3, s3_bucket, tmp_path):
    values = write_group(str(tmp_path / "local.zarr"), 3)
    bucket = s3_bucket.removeprefix("s3://")
    for folder, _, files in os.walk(tmp_path / "local.zarr"):
        for name in files:
            key = os.path.relpath(os.path.join(folder, name), tmp_path / "local.zarr").replace(os.sep, "/")
            with open(os.path.join(folder, name), "rb") as f:
                moto_s3.client().put_object(Bucket=bucket, Key=f"survey.zarr/{key}", Body=f.read())
    ds = convert(f"{s3_bucket}/survey.zarr", tmp_path / "ds", storage_options=moto_s3.storage_options, workers=2, progress=False)
    check(ds, values)
    assert ds.metadata["source"]["store"] == f"{s3_bucket}/survey.zarr"


@pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part")  # zarr's note on v3 consolidation
@pytest.mark.parametrize("fmt", [2, 3])
def test_a_zarr_group_over_http_with_consolidated_metadata(http_server, tmp_path, capsys, fmt):
    values = write_group(str(http_server.root / "survey.zarr"), fmt, consolidated=True)
    url = http_server.url.rstrip("/") + "/survey.zarr"
    code = main(["convert", url, str(tmp_path / "ds"), "--workers", "0", "--quiet"])
    assert code == 0, capsys.readouterr().err
    check(chute.open(tmp_path / "ds"), values)


def test_a_missing_store_is_named(tmp_path):
    with pytest.raises(chute.ChuteError, match="does not exist"):
        convert(tmp_path / "nowhere.zarr", tmp_path / "ds", progress=False)
    os.makedirs(tmp_path / "empty.zarr")
    with pytest.raises(chute.ChuteError, match="empty.zarr"):
        convert(tmp_path / "empty.zarr", tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
