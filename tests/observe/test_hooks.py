"""Observers subscribe to a Loader's hooks: what a pass tells them, in order, and what a failing hook does."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import chute


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return chute.write(({"x": np.full(2, i, np.int64), "id": i} for i in range(40)), tmp_path_factory.mktemp("hooks") / "ds")


class Recorder(chute.observe.Hook):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.batches: list[tuple[int, int]] = []

    def pass_event(self, run, event, before, after):
        self.events.append((event, before, after))

    def batch(self, run, step, waited_ns, rows):
        assert waited_ns >= 0
        self.batches.append((step, rows))


def test_a_whole_pass_then_a_pass_left_early(ds):
    loader = chute.Loader(ds, 8)
    hook = Recorder()
    loader.hooks.add(hook)
    assert len(list(loader)) == 5
    assert hook.events == [("start", "new", "running"), ("last", "running", "finished"), ("end", "finished", "finished")]
    assert hook.batches == [(s, 8) for s in range(5)]
    hook.events.clear()
    it = iter(loader)
    next(it)
    it.close()
    assert hook.events == [
        ("start", "new", "running"),
        ("close", "finished", "finished"),  # the previous pass, whose stream had ended: nothing left to stop
        ("end", "running", "left"),
    ]
    assert loader.state_dict()["consumed"] == 8  # LEFT: what the loop received


def test_set_epoch_during_a_pass_moves_it_and_the_position_is_the_loaders(ds):
    loader = chute.Loader(ds, 8, shuffle=True)
    hook = Recorder()
    loader.hooks.add(hook)
    it = iter(loader)
    next(it)
    loader.set_epoch(3)
    assert hook.events[-1] == ("set_position", "running", "moved")
    assert len(loader) == 5 and loader.state_dict()["epoch"] == 3
    rest = list(it)  # the pass goes on to its end ...
    assert len(rest) == 4 and loader.state_dict()["epoch"] == 3  # ... and does not advance the epoch set since
    assert [e for e, _, _ in hook.events[-2:]] == ["last", "end"]


def test_a_newer_pass_closes_the_older_one(ds):
    loader = chute.Loader(ds, 8)
    hook = Recorder()
    loader.hooks.add(hook)
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    assert ("close", "running", "closed") in hook.events
    with pytest.raises(chute.ChuteError, match="ended by a newer pass over the same loader"):
        next(old)
    loader.close()
    with pytest.raises(chute.ChuteError, match=r"ended by Loader.close\(\)"):
        next(new)


def test_a_hook_that_raises_is_removed_and_the_pass_goes_on(ds, caplog):
    class Broken(chute.observe.Hook):
        def batch(self, run, step, waited_ns, rows):
            raise RuntimeError("hook bug")

    loader = chute.Loader(ds, 8)
    loader.hooks.add(Broken())
    with caplog.at_level(logging.ERROR, logger="chute"):
        assert len(list(loader)) == 5
    assert "raised; it is removed" in caplog.text
    assert loader.hooks.per_batch == []


def test_unsubscribing(ds):
    loader = chute.Loader(ds, 8)
    hook = Recorder()
    remove = loader.hooks.add(hook)
    remove()
    list(loader)
    assert hook.events == [] and hook.batches == []
