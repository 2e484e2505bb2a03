"""The Loader's default collate: what default_collate gives, built into reused blocks, with errors that name the sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import chute
from chute._arena import Arena
from chute.pipeline.collate import STREAM_BYTES, Collate, CollateError


def _collate(samples, pool=None, n=None):
    sink = Collate(len(samples) if n is None else n, pool or Arena(), lambda j: f"sample {j}")
    for s in samples:
        sink.add(s)
    return sink.result()


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _dicts(n: int):
    return [
        {"image": torch.full((3, 4, 5), i, dtype=torch.uint8), "label": i, "name": f"s{i}", "w": i / 2,
         "pair": (i, torch.tensor([i, -i])), "arr": np.full(2, i, np.float32)}
        for i in range(n)
    ]


def test_dicts_of_tensors_numbers_strings_tuples_arrays_match_default_collate():
    samples = _dicts(7)
    _same(_collate(samples), default_collate(samples))


def test_plain_tensors_match_default_collate():
    samples = [torch.randn(2, 3) for _ in range(5)]
    _same(_collate(samples), default_collate(samples))


def test_other_sample_kinds_go_to_default_collate():
    samples = [(torch.tensor([i]), i) for i in range(4)]
    _same(_collate(samples), default_collate(samples))
    assert _collate([1, 2, 3]).tolist() == [1, 2, 3]


def test_a_sample_that_does_not_fit_gives_default_collates_result_or_error():
    grads = [torch.ones(2) for _ in range(3)] + [torch.ones(2, requires_grad=True)]
    _same(_collate(grads).detach(), default_collate(grads).detach())
    ragged = [{"x": torch.zeros(3)}, {"x": torch.zeros(3)}, {"x": torch.zeros(4)}]
    with pytest.raises(CollateError, match=r"cannot collate the values of key 'x': sample 2 gives Tensor of shape \(4,\) "
                       r"where sample 0 gives Tensor of shape \(3,\).*collate=list"):
        _collate(ragged)
    mixed = [torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int32)]
    _same(_collate(mixed), default_collate(mixed))


def test_dicts_with_different_keys_and_none_samples_name_the_sample():
    with pytest.raises(CollateError, match=r"dicts with different keys: sample 1 lacks \['y'\] compared with sample 0.*collate=list"):
        _collate([{"x": torch.zeros(3), "y": 1}, {"x": torch.zeros(3)}])
    with pytest.raises(CollateError, match=r"sample 1 has extra \['y'\]"):
        _collate([{"x": torch.zeros(3)}, {"x": torch.zeros(3), "y": 1}])
    with pytest.raises(CollateError, match=r"the transform returned None for sample 2.*return the sample"):
        _collate([{"x": 1}, {"x": 2}, None])
    with pytest.raises(CollateError, match=r"the transform returned None for sample 1"):
        _collate([torch.zeros(2), None])


@pytest.mark.parametrize("size", [4, STREAM_BYTES])  # stacked at the end, or copied in as the samples come
def test_fewer_samples_than_planned_gives_a_shorter_batch(size):
    batch = _collate([{"x": torch.full((size,), i, dtype=torch.uint8)} for i in range(3)], n=8)
    assert batch["x"].shape == (3, size) and batch["x"][:, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("size", [4, STREAM_BYTES])
def test_large_and_small_samples_match_default_collate(size):
    samples = [{"x": torch.full((size,), i, dtype=torch.uint8), "label": i, "name": f"s{i}"} for i in range(5)]
    _same(_collate(samples), default_collate(samples))
    odd = samples[:3] + [{"x": torch.zeros(size + 1, dtype=torch.uint8), "label": 3, "name": "s3"}]
    with pytest.raises(CollateError, match="sample 3 gives Tensor"):
        _collate(odd)


def test_buffers_are_reused_only_once_nobody_holds_the_batch():
    pool = Arena()
    first = _collate(_dicts(4), pool)
    second = _collate(_dicts(4), pool)
    assert first["image"].data_ptr() != second["image"].data_ptr()  # the first is still held
    view = second["image"][1]
    del first, second
    third = _collate([{**s, "image": s["image"] + 100} for s in _dicts(4)], pool)
    assert view.tolist() == torch.full((3, 4, 5), 1).tolist()  # the held view was not overwritten
    assert third["image"][0, 0, 0, 0].item() == 100


def _decode(sample):
    return {"image": torch.full((3, 16, 16), int(sample["label"]), dtype=torch.uint8), "label": sample["label"]}


def _sometimes_fails(sample):
    if int(sample["label"]) % 5 == 0:
        raise ValueError("bad sample")
    return _decode(sample)


@pytest.fixture
def ds(tmp_path):
    return chute.write(({"label": i} for i in range(100)), tmp_path / "ds")


def test_a_loader_epoch_is_right_and_kept_batches_are_never_rewritten(ds):
    loader = chute.Loader(ds, 8, shuffle=True, seed=3, transform=_decode, workers=chute.Workers(count=2, prefetch=4))
    kept = []
    for batch in loader:
        assert torch.equal(batch["image"][:, 0, 0, 0], batch["label"].to(torch.uint8))
        kept.append(batch)
    labels = torch.cat([b["label"] for b in kept]).tolist()
    assert sorted(labels) == list(range(100))
    for batch in kept:  # every batch still holds its own images
        assert torch.equal(batch["image"][:, 0, 0, 0], batch["label"].to(torch.uint8))
    assert loader._pool.allocated >= len(kept)  # all held: none could be reused


def test_a_loader_reuses_batch_buffers_the_loop_dropped(ds):
    loader = chute.Loader(ds, 8, transform=_decode, workers=chute.Workers(count=1, prefetch=2))
    for _ in range(3):
        for batch in loader:
            pass
    del batch
    assert loader._pool.allocated <= 12  # 39 batches, a handful of blocks


def test_skipped_samples_leave_a_shorter_batch(ds):
    loader = chute.Loader(ds, 10, transform=_sometimes_fails, on_error="skip", workers=1)
    batches = list(loader)
    assert [len(b["label"]) for b in batches] == [8] * 10
    assert torch.cat([b["label"] for b in batches]).tolist() == [i for i in range(100) if i % 5]
    assert sorted(loader.skipped) == list(range(0, 100, 5))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.bool, torch.complex64, torch.int8])
def test_every_dtype_is_copied_exactly(dtype):
    samples = [(torch.arange(6).reshape(2, 3) - i).to(dtype) for i in range(3)]
    samples.append(samples[0].t().contiguous().t())  # a non-contiguous one
    _same(_collate(samples), default_collate(samples))
