"""Dataset.get_batch: any form of indices a user passes gives numpy's rows or the error that names the bad one.

get_batch hands a 1-D int64 array straight to the reader's native call, which
checks every index; anything else (another integer dtype, a list, a tensor, a
strided view, a bad row) goes through the Python checks. Both paths must agree
with numpy fancy indexing of the written data, and with the messages below.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import chute

ROWS = 37
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

_rng = np.random.default_rng(3)
IMAGES = _rng.integers(0, 256, (ROWS, 2, 3), dtype=np.uint8)
WEIGHTS = torch.randn(ROWS, 2).to(torch.bfloat16)
FLAGS = _rng.random(ROWS) < 0.5


def _samples(with_name: bool):
    for i in range(ROWS):
        sample = {"x": IMAGES[i], "label": i * 7 - 100, "w": WEIGHTS[i], "flag": bool(FLAGS[i])}
        if with_name:
            sample["name"] = f"row-{i}"
        yield sample


@pytest.fixture(scope="module", params=["fixed", "with-strings"])
def ds(request, tmp_path_factory):
    """Fixed-size columns only (the tensors come in schema order), or with a string column."""
    root = tmp_path_factory.mktemp("get_batch") / request.param
    dataset = chute.write(_samples(request.param == "with-strings"), root, shard_size=100)
    assert len(dataset.shards) >= 3
    return dataset


def _check(ds, batch, rows):
    rows = np.asarray(rows, dtype=np.int64)
    assert list(batch) == ds.schema.names
    assert batch["x"].dtype == torch.uint8 and np.array_equal(batch["x"].numpy(), IMAGES[rows])
    assert batch["label"].dtype == torch.int64 and batch["label"].tolist() == (rows * 7 - 100).tolist()
    assert batch["w"].dtype == torch.bfloat16 and torch.equal(batch["w"], WEIGHTS[torch.from_numpy(rows)])
    assert batch["flag"].dtype == torch.bool and batch["flag"].tolist() == FLAGS[rows].tolist()
    if "name" in batch:
        assert batch["name"] == [f"row-{i}" for i in rows.tolist()]


FORMS = ["list", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "tensor", "tensor32", "strided"]


def _form(values: list[int], form: str):
    if form == "list":
        return list(values)
    if form == "tensor":
        return torch.tensor(values, dtype=torch.int64)
    if form == "tensor32":
        return torch.tensor(values, dtype=torch.int32)
    if form == "strided":  # every other item of a longer array: not contiguous
        return np.repeat(np.asarray(values, dtype=np.int64), 2)[::2]
    return np.asarray(values, dtype=form)


def _fits(values: list[int], form: str) -> bool:
    if not values or form in ("list", "int64", "tensor", "strided"):
        return True
    dtype = np.dtype("int32" if form == "tensor32" else form)
    info = np.iinfo(dtype)
    return info.min <= min(values) and max(values) <= info.max


@SETTINGS
@given(st.lists(st.integers(-(ROWS + 3), ROWS + 3), max_size=60), st.sampled_from(FORMS))
def test_any_form_of_indices_gives_numpys_rows_or_names_the_bad_row(ds, values, form):
    if not _fits(values, form):
        return
    indices = _form(values, form)
    if values and (min(values) < 0 or max(values) >= ROWS):
        bad = min(values) if min(values) < 0 else max(values)
        with pytest.raises(IndexError, match=rf"^row {bad} is out of range for dataset {ds.root} of {ROWS} rows$"):
            ds.get_batch(indices)
        return
    _check(ds, ds.get_batch(indices), values)


@SETTINGS
@given(st.lists(st.integers(0, ROWS - 1), max_size=40), st.sampled_from(["x", "label", "w", "flag"]))
def test_out_is_filled_in_place_and_the_other_columns_are_new(ds, values, name):
    rows = np.asarray(values, dtype=np.int64)
    spec = {n: (shape, dtype) for n, shape, _, dtype in ds.fixed_columns}
    shape, dtype = spec[name]
    out = {name: torch.zeros((len(rows), *shape), dtype=dtype)}
    batch = ds.get_batch(rows, out=out)
    assert batch[name] is out[name]
    _check(ds, batch, rows)


def test_the_returned_tensors_are_the_callers_own(ds):
    first = ds.get_batch(np.array([0, 1]))
    first["x"].fill_(0)
    first["label"] += 1
    _check(ds, ds.get_batch(np.array([0, 1])), [0, 1])
    a, b = ds.get_batch(np.array([2])), ds.get_batch(np.array([2]))
    assert a["x"].data_ptr() != b["x"].data_ptr()


@pytest.mark.parametrize("indices", [
    np.array([0.0, 1.0]), np.array([[0, 1], [2, 3]]), np.array(3), np.array([True, False]), ["a"], torch.tensor([0.5]),
])
def test_indices_that_are_not_integers_are_refused(ds, indices):
    with pytest.raises(TypeError, match="indices must be a 1-D sequence of integers"):
        ds.get_batch(indices)


def test_an_empty_batch_of_any_form(ds):
    for indices in ([], np.array([], dtype=np.float64), np.zeros(0, np.int32), torch.zeros(0, dtype=torch.int64)):
        batch = ds.get_batch(indices)
        assert batch["x"].shape == (0, 2, 3) and batch["label"].shape == (0,)


def test_a_wrong_out_is_refused_naming_it(ds):
    with pytest.raises(ValueError, match=r"out\['x'\] must be a contiguous CPU tensor of shape \(2, 2, 3\) and dtype torch.uint8"):
        ds.get_batch(np.array([0, 1]), out={"x": torch.zeros((3, 2, 3), dtype=torch.uint8)})
