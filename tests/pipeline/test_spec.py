"""Loader and TorchIterable take the common arguments through one spec, written once, so they cannot drift."""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pytest

import chute
from chute.pipeline.spec import DEFAULTS, Options


def test_the_common_arguments_are_written_once_with_their_defaults():
    assert list(typing.get_type_hints(Options, include_extras=True)) == list(DEFAULTS)


@pytest.mark.parametrize("cls", [chute.Loader, chute.TorchIterable])
def test_both_constructors_take_the_common_arguments_as_the_options(cls):
    params = inspect.signature(cls.__init__).parameters
    assert list(params)[1:3] == ["dataset", "batch_size"]
    options = params["options"]
    assert options.kind is inspect.Parameter.VAR_KEYWORD and "Unpack[Options]" in str(options.annotation)
    assert not set(params) & set(DEFAULTS)  # none of them written out a second time


@pytest.mark.parametrize("cls", [chute.Loader, chute.TorchIterable])
def test_both_refuse_an_argument_neither_takes_naming_what_chute_calls_it(ds, cls):
    with pytest.raises(TypeError, match=r"num_workers=: chute's Loader takes workers=chute.Workers"):
        cls(ds, 4, num_workers=2)
    with pytest.raises(TypeError, match=rf"{cls.__name__} got unexpected argument\(s\): shufle=: not an argument of chute.{cls.__name__}"):
        cls(ds, 4, shufle=True)


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
