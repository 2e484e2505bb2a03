"""chute._native.GatherRing: gathers on native threads, fuzzed against numpy fancy indexing, and its life
(checks before anything is queued, places, drop, close: no thread, export or job left behind)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import given, strategies as st

from chute import _native

from ._reference import SETTINGS, batches, layouts, offsets_of, shard_of
from .test_gather import SENTINEL, make_shards, sentinel_out


def _tasks() -> int:
    """Threads of this process (native ones too: Python's threading does not see them)."""
    return len(os.listdir("/proc/self/task"))


def _ring(layout, columns, slots=4, threads=2):
    return _native.GatherRing(offsets_of(layout), [shards for shards, _ in columns], [w for _, w in columns], slots, threads)


@SETTINGS
@given(layouts, st.lists(st.sampled_from([1, 2, 3, 8, 16, 24, 3072, 65539]), min_size=1, max_size=3), st.data(),
       st.integers(1, 4), st.integers(0, 2**32))
def test_batches_equal_numpy_fancy_indexing(layout, widths, data, threads, seed):
    """Several steps in flight, on 1-4 threads, each column of each step as numpy gathers it."""
    if max(widths) > 4096:
        layout = [min(r, 3) for r in layout]
    columns = [(make_shards(layout, w, seed + k), w) for k, w in enumerate(widths)]
    wholes = [np.concatenate(shards) for shards, _ in columns]
    ring = _ring(layout, columns, slots=4, threads=threads)
    try:
        steps = [data.draw(batches(layout, max_size=40 if max(widths) <= 4096 else 5)) for _ in range(9)]
        outs = [[sentinel_out(len(idx), w) for _, w in columns] for idx in steps]
        for step, idx in enumerate(steps):
            if step >= 4:  # the place of step - 4 is free once it was waited for
                start, end, idle = ring.wait(step - 4, -1)
                assert 0 < start <= end and idle >= 0
            ring.submit(step, idx, outs[step])
        for step in range(5, 9):
            assert ring.wait(step, -1) is not None
        for idx, out in zip(steps, outs):
            for whole, got in zip(wholes, out):
                assert np.array_equal(got, whole[idx])
    finally:
        ring.close()


@SETTINGS
@given(layouts.filter(lambda layout: sum(layout) > 0), st.data())
def test_a_bad_step_is_refused_before_anything_is_queued(layout, data):
    """An index out of range, an unmapped shard, a short shard, a wrong out: the submit raises, nothing is
    written, and the same place takes the step again once the cause is gone."""
    indices = data.draw(batches(layout).filter(len))
    offsets = offsets_of(layout)
    shards = make_shards(layout, 5, 1)
    needed = sorted({shard_of(offsets, int(x))[0] for x in indices})
    sources = list(shards)
    sources[needed[0]] = None
    ring = _native.GatherRing(offsets, [sources], [5], 2, 1)
    try:
        out = sentinel_out(len(indices), 5)
        with pytest.raises(_native.Unmapped) as raised:
            ring.submit(0, indices, [out])
        assert raised.value.shard == needed[0]
        bad = indices.copy()
        bad[data.draw(st.integers(0, len(bad) - 1))] = data.draw(st.sampled_from([-1, int(offsets[-1]), 2**62]))
        with pytest.raises(IndexError, match="out of range"):
            ring.submit(0, bad, [out])
        sources[needed[0]] = shards[needed[0]].tobytes()[:-1]  # mapped, but short
        with pytest.raises(_native.CorruptShard) as corrupt:
            ring.submit(0, indices, [out])
        assert (corrupt.value.shard, corrupt.value.row) == (needed[0], -1)
        assert (out == SENTINEL).all()
        with pytest.raises(ValueError, match="is not submitted"):
            ring.wait(0, 0.0)
        sources[needed[0]] = shards[needed[0]]
        with pytest.raises(ValueError, match="needs"):
            ring.submit(0, indices, [sentinel_out(len(indices) + 1, 5)])
        with pytest.raises(ValueError, match="one buffer per column"):
            ring.submit(0, indices, [out, out])
        ring.submit(0, indices, [out])
        assert ring.wait(0, -1) is not None
        assert np.array_equal(out, np.concatenate(shards)[indices])
    finally:
        ring.close()


def test_a_place_holds_one_step_until_it_is_waited_for_or_dropped():
    shards = make_shards([10, 10], 4, 0)
    ring = _native.GatherRing(offsets_of([10, 10]), [shards], [4], 2, 1)
    try:
        ring.resize(0)  # no thread takes jobs: they stay queued
        outs = [sentinel_out(3, 4) for _ in range(3)]
        ring.submit(0, np.array([1, 2, 3]), [outs[0]])
        ring.submit(1, np.array([4, 5, 6]), [outs[1]])
        with pytest.raises(ValueError, match="step 2 was submitted to place 0, which still holds step 0"):
            ring.submit(2, np.array([7, 8, 9]), [outs[2]])
        with pytest.raises(TimeoutError):
            ring.wait(0, 0.01)
        assert ring.count_done(0, 2) == 0
        ring.resize(1)
        assert ring.wait(0, -1) is not None and ring.wait(1, -1) is not None
        ring.submit(2, np.array([7, 8, 9]), [outs[2]])
        assert ring.wait(2, -1) is not None
        whole = np.concatenate(shards)
        assert all(np.array_equal(out, whole[idx]) for out, idx in zip(outs, ([1, 2, 3], [4, 5, 6], [7, 8, 9])))
    finally:
        ring.close()


def test_drop_ends_a_pass_and_lets_go_of_every_buffer():
    """Queued steps are dropped unwritten, done ones let go of: each out buffer can be resized again (a
    buffer still exported cannot), the places take new steps, and the threads stay for the next pass."""
    shards = make_shards([8, 8], 2, 0)
    ring = _native.GatherRing(offsets_of([8, 8]), [shards], [2], 4, 2)
    try:
        outs = [bytearray(b"\xff" * 8) for _ in range(4)]
        ring.submit(0, np.array([0, 1, 2, 3]), [outs[0]])
        assert ring.wait(0, -1) is not None
        ring.submit(1, np.array([4, 5, 6, 7]), [outs[1]])
        deadline = time.monotonic() + 30  # (the worker copies 8 bytes; the bound only ends a broken ring's test)
        while ring.count_done(1, 1) != 1:
            assert time.monotonic() < deadline, "step 1 was never copied"
        ring.resize(0)
        ring.submit(2, np.array([8, 9, 10, 11]), [outs[2]])  # queued, never started
        with pytest.raises(BufferError):
            outs[2].append(0)  # exported while the step is in flight
        ring.drop()
        for out in outs:
            out.append(0)  # no export left
        assert outs[2][:8] == b"\xff" * 8  # dropped before it was copied
        with pytest.raises(ValueError, match="is not submitted"):
            ring.wait(2, -1)
        ring.resize(2)
        out = sentinel_out(2, 2)
        ring.submit(2, np.array([15, 0]), [out])
        assert ring.wait(2, -1) is not None and np.array_equal(out, np.concatenate(shards)[[15, 0]])
        assert ring.threads == 2
    finally:
        ring.close()


def test_close_joins_every_thread_and_refuses_new_steps():
    before = _tasks()
    shards = make_shards([5], 3, 0)
    ring = _native.GatherRing(offsets_of([5]), [shards], [3], 8, 4)
    assert _tasks() == before + 4 and ring.threads == 4
    ring.resize(1)  # parked, not ended
    assert _tasks() == before + 4 and ring.threads == 1
    ring.resize(0)
    out = bytearray(3)
    ring.submit(0, np.array([2]), [out])  # queued when the ring closes
    ring.close()
    assert _tasks() == before and ring.threads == 0
    out.append(0)  # its export was let go of
    with pytest.raises(RuntimeError, match="closed"):
        ring.submit(1, np.array([1]), [bytearray(3)])
    ring.close()  # again: nothing


@pytest.mark.parametrize("args, message", [
    ((np.array([0, 5]), [[b"x" * 5]], [1], 0, 1), "slots must be in"),
    ((np.array([0, 5]), [[b"x" * 5]], [1], 4, 0), "threads in"),
    ((np.array([0, 5]), [[b"x" * 5]], [1], 4, 1, 7), "policy must be"),
    ((np.array([1, 5]), [[b"x" * 5]], [1], 4, 1), "offsets\\[0\\] must be 0"),
    ((np.array([0, 5]), [[b"x" * 5, b""]], [1], 4, 1), "has 2 items for 1 shards"),
    ((np.array([0, 5]), [[b"x" * 5]], [1, 2], 4, 1), "one width per column"),
    ((np.array([0, 5]), [[b"x" * 5]], [0], 4, 1), "row_bytes"),
])
def test_bad_arguments_are_value_errors(args, message):
    before = _tasks()
    with pytest.raises(ValueError, match=message):
        _native.GatherRing(*args)
    assert _tasks() == before
