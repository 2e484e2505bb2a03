"""A malformed loader state is a ChuteError naming what is wrong (chute/_state.py), never a bare KeyError."""

from __future__ import annotations

import pytest

import chute
from chute._state import check_state


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (None, "is a NoneType, not a dict"),
        ({}, "lacks 'epoch', 'consumed'"),
        ({"epoch": 0}, "lacks 'consumed' (it has ['epoch'])"),
        ({"epoch": "a", "consumed": 1}, "'epoch' is 'a', not a whole number"),
        ({"epoch": 0, "consumed": -1}, "'consumed' is -1, below 0"),
    ],
)
def test_malformed_states(state, expected):
    with pytest.raises(chute.ChuteError) as error:
        check_state(state)
    assert expected in str(error.value) and "Loader.state_dict()" in str(error.value)


def test_loader_refuses_a_malformed_state_and_takes_its_own(tmp_path):
    ds = chute.write([{"x": i} for i in range(10)], tmp_path / "ds")
    loader = chute.Loader(ds, batch_size=2, shuffle=False)
    with pytest.raises(chute.ChuteError, match="lacks 'consumed'"):
        loader.load_state_dict({"epoch": 0})
    loader.load_state_dict({**loader.state_dict(), "consumed": 4})
    assert [int(b["x"][0]) for b in loader] == [4, 6, 8]
