"""Loader and TorchIterable take the common arguments through one spec, so they cannot drift."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import chute
from chute.pipeline.spec import COMMON, LoaderSpec


@pytest.mark.parametrize("cls", [chute.Loader, chute.TorchIterable])
def test_both_constructors_take_the_common_arguments_with_the_same_defaults(cls):
    params = inspect.signature(cls.__init__).parameters
    assert list(params)[1:3] == ["dataset", "batch_size"]
    for name, default in COMMON.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name
    spec = inspect.signature(LoaderSpec.of).parameters
    assert {n: p.default for n, p in spec.items() if n in COMMON} == COMMON


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return chute.write(({"x": np.full(2, i, np.int64)} for i in range(10)), tmp_path_factory.mktemp("spec") / "ds")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be at least 1"),
        ({"shuffle": "yes"}, TypeError, "shuffle must be True, False or chute.Shuffle"),
        ({"seed": -1}, ValueError, r"seed must be an integer in \[0, 2\*\*63\)"),
        ({"drop_last": 1}, TypeError, "drop_last must be True or False"),
        ({"on_error": "ignore"}, ValueError, "on_error"),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must be in \[0, world_size\)"),
    ],
)
@pytest.mark.parametrize("cls", [chute.Loader, chute.TorchIterable])
def test_both_refuse_the_same_values_with_the_same_message(ds, cls, kwargs, error, message):
    kwargs = {"batch_size": 4, **kwargs}
    with pytest.raises(error, match=message):
        cls(ds, **kwargs)


def test_both_see_the_same_order(ds):
    loader = chute.Loader(ds, 4, shuffle=True, seed=3, drop_last=True)
    iterable = chute.TorchIterable(ds, 4, shuffle=True, seed=3, drop_last=True)
    assert loader.spec.order.state(0, 0) == iterable.spec.order.state(0, 0)
    assert [b["x"][:, 0].tolist() for b in loader] == [b["x"][:, 0].tolist() for b in iterable]
