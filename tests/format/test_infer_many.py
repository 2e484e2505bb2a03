"""Summary.add_many (a converter's reader summarising a block of samples at once) ends in exactly the summary that
adding each sample gives, whatever the samples: alike records are counted at once, anything else one by one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from chute.format.infer import MAX_RECORD_KEYS, Summary, plan


def _record(i: int, **changes):
    sample = {"data": {"x": np.full((2, 3), i, np.float32), "label": i, "w": i / 2, "name": f"n{i}", "raw": b"r",
                       "ok": bool(i % 2), "meta": {"step": i, "tag": "a"}}}
    sample["data"].update(changes)
    return sample


CASES = {
    "alike records": [_record(i) for i in range(50)],
    "a late shape change": [_record(i) for i in range(30)] + [_record(30, x=np.zeros((2, 4), np.float32))],
    "a late dtype change": [_record(i) for i in range(10)] + [_record(10, x=np.zeros((2, 3), np.float64))],
    "a missing key": [_record(i) for i in range(10)] + [{"data": {"label": 3}}],
    "a None": [_record(i) for i in range(10)] + [_record(10, label=None)],
    "an int then a float": [_record(i) for i in range(10)] + [_record(10, label=1.5)],
    "a bool among ints": [_record(i) for i in range(10)] + [_record(10, label=True)],
    "numpy scalars": [_record(i, label=np.int64(i)) for i in range(10)],
    "lists": [_record(i, tags=["a", "b"][: i % 3]) for i in range(10)],
    "simple dicts (maps)": [{"data": {"a": i, "b": "s", "c": float(i)}} for i in range(20)],
    "a NaN in a map": [{"data": {"a": 1.0, "b": 2}}, {"data": {"a": math.nan, "b": 2}}, {"data": {"a": 3.0, "b": 2}}],
    "varying map keys": [{"data": {f"k{i}": i, f"j{i % 3}": "v"}} for i in range(40)],
    "non-str keys": [{"data": {1: "a"}}, {"data": {1: "b"}}],
    "too many keys": [{"data": {f"k{i}-{j}": j for j in range(MAX_RECORD_KEYS // 4)}} for i in range(6)],
    "raw values": [{"data": b"\x00" * (i + 1)} for i in range(10)],
    "0-d arrays": [{"data": {"v": np.float32(i) * np.ones(())}} for i in range(10)],
    "a subclass of ndarray": [{"data": {"v": np.ma.masked_array(np.zeros(3))}} for _ in range(3)],
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("block", [1, 7, 1000])
def test_add_many_is_add_of_each(name, block):
    samples = CASES[name]
    one = Summary()
    for i, sample in enumerate(samples):
        one.add(sample, i)
    many = Summary()
    for start in range(0, len(samples), block):
        many.add_many(samples[start : start + block], start)
    assert many.samples == one.samples and many.root == one.root
    try:
        expected = plan(one, hoist="data")
    except Exception as exc:  # the same error from both
        with pytest.raises(type(exc), match=str(exc)[:40].replace("(", r"\(").replace("[", r"\[")):
            plan(many, hoist="data")
    else:
        assert plan(many, hoist="data") == expected


def test_alike_records_are_counted_at_once(monkeypatch):
    from chute.format import infer

    calls = []
    real = infer.Node.add
    monkeypatch.setattr(infer.Node, "add", lambda self, value, position: calls.append(position) or real(self, value, position))
    Summary().add_many(CASES["alike records"], 0)
    assert set(calls) == {0}  # the first sample, value by value; the other 49 counted at once
    calls.clear()
    Summary().add_many(CASES["a late shape change"], 0)
    assert 30 in calls  # not alike: one by one
