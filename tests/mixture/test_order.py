"""The order of a weighted mixture (chute/mix/order.py): shares, no repeats, resume, weight changes.

Expected values come from the spec (docs/mix.md), not from calling the code a
second way: an epoch of ``N`` rows gives source ``k`` its largest-remainder
quota ``q_k`` of ``N * w_k / sum(w)``; a global batch of ``G`` rows gives it
``floor`` or ``ceil`` of ``G * q_k / N``; a source's rows are drawn in passes, so
at every step boundary no row of a source has been drawn twice more than another.
"""

from __future__ import annotations

import math
import pickle
import threading
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from chute.mixture.order import MixOrder

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_layout = st.lists(st.integers(1, 60), min_size=1, max_size=4)
weights_st = st.one_of(st.integers(1, 10), st.floats(0.01, 10.0, allow_nan=False, allow_infinity=False))


@st.composite
def mix_orders(draw, drop_last=st.booleans()) -> MixOrder:
    k = draw(st.integers(1, 4))
    return MixOrder(
        tuple(f"s{i}" for i in range(k)),
        tuple(tuple(draw(_layout)) for _ in range(k)),
        tuple(draw(weights_st) for _ in range(k)),
        batch_size=draw(st.integers(1, 24)),
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**63 - 1)),
        window=draw(st.integers(1, 4)),
        drop_last=draw(drop_last),
        epoch_rows=draw(st.one_of(st.none(), st.integers(1, 400))),
    )


world_sizes = st.integers(1, 8)


# ---------------------------------------------------------------------------- spec helpers


def quotas(order: MixOrder, epoch: int = 0) -> list[int]:
    """Largest remainders of the cumulative split, epoch by epoch (ties to the first source); a count that would
    fall stays, and the source furthest above its exact share gives the row instead (ties to the last source)."""
    w = [Fraction(x) for x in order.weights]

    def split(total: int) -> list[int]:
        exact = [total * x / sum(w) for x in w]
        floors = [math.floor(x) for x in exact]
        for k in sorted(range(len(w)), key=lambda k: (floors[k] - exact[k], k))[: total - sum(floors)]:
            floors[k] += 1
        return floors

    counts = [[0] * len(w)]
    for e in range(epoch + 1):
        total = (e + 1) * order.num_rows
        now = [max(p, c) for p, c in zip(counts[-1], split(total))]
        while sum(now) > total:
            k = max((k for k in range(len(w)) if now[k] > counts[-1][k]), key=lambda k: (now[k] - total * w[k] / sum(w), k))
            now[k] -= 1
        counts.append(now)
    return [b - a for a, b in zip(counts[-2], counts[-1])]


def source_of(order: MixOrder, rows: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.asarray(order.base[1:] + (sum(order.sizes),)), rows, side="right")


def step_rows(order: MixOrder, epoch: int, step: int, world_size: int, consumed: int = 0) -> list[np.ndarray]:
    return [order.batch(epoch, step, r, world_size, consumed) for r in range(world_size)]


# ---------------------------------------------------------------------------- shares


@SETTINGS
@given(mix_orders(drop_last=st.just(False)), world_sizes)
def test_every_global_batch_holds_each_share_to_within_one(order: MixOrder, world_size: int) -> None:
    q, n = quotas(order), order.num_rows
    size = order.batch_size * world_size
    totals = Counter()
    for step in range(order.num_batches(world_size)):
        batches = step_rows(order, 0, step, world_size)
        rows = order.global_batch(0, step, world_size)
        rest = min(size, n - step * size)
        assert len(rows) == rest and all(len(b) == -(-rest // world_size) for b in batches)
        padding = Counter(np.concatenate(batches).tolist()) - Counter(rows.tolist())
        assert sum(padding.values()) == -rest % world_size  # at most one padding row per rank
        counts = np.bincount(source_of(order, rows), minlength=len(q))
        for k in range(len(q)):
            share_k = Fraction(rest * q[k], n)
            assert math.floor(share_k) <= counts[k] <= math.ceil(share_k), (step, k, counts, share_k)
            # and so within one sample (plus the epoch's own rounding, under rest/n) of the weight's share
            assert abs(counts[k] - rest * Fraction(order.weights[k]) / sum(map(Fraction, order.weights))) < 1 + Fraction(rest, n)
        totals.update(dict(enumerate(counts.tolist())))
    assert [totals[k] for k in range(len(q))] == q  # the epoch ends exactly on each quota


@SETTINGS
@given(mix_orders(drop_last=st.just(False)), st.integers(2, 8))
def test_every_rank_batch_is_mixed_too(order: MixOrder, world_size: int) -> None:
    size = order.batch_size * world_size
    steps = order.num_batches(world_size)
    for step in range(steps if (order.num_rows % size == 0) else steps - 1):  # full steps
        batches = step_rows(order, 0, step, world_size)
        total = np.bincount(source_of(order, np.concatenate(batches)), minlength=len(order.names))
        for batch in batches:
            counts = np.bincount(source_of(order, batch), minlength=len(order.names))
            assert np.all(total // world_size <= counts) and np.all(counts <= -(-total // world_size)), (counts, total)


def test_weights_three_to_one_example() -> None:
    order = MixOrder(("a", "b"), ((200,), (600,)), (0.75, 0.25), batch_size=40, shuffle=True, seed=5)
    for step in range(order.num_batches(2)):
        batches = step_rows(order, 0, step, 2)
        counts = np.bincount(source_of(order, np.concatenate(batches)), minlength=2)
        assert counts.tolist() == [60, 20]  # 80 rows: exactly 3/4 and 1/4
        for batch in batches:
            assert np.bincount(source_of(order, batch), minlength=2).tolist() == [30, 10]


# ---------------------------------------------------------------------------- no repeats, cycling


@SETTINGS
@given(mix_orders(drop_last=st.just(False)), world_sizes, st.integers(1, 3))  # drop_last skips the rows it drops
def test_no_row_of_a_source_repeats_before_all_of_it_was_seen(order: MixOrder, world_size: int, epochs: int) -> None:
    seen = [Counter() for _ in order.names]
    for epoch in range(epochs):
        for step in range(order.num_batches(world_size)):
            rows = order.global_batch(epoch, step, world_size)
            for row, k in zip(rows.tolist(), source_of(order, rows).tolist()):
                seen[k][row - order.base[k]] += 1
            for k, counts in enumerate(seen):
                if counts:
                    low = min(counts[r] for r in range(order.sizes[k]))
                    assert max(counts.values()) - low <= 1, (epoch, step, k)


def test_a_small_source_cycles_and_a_large_one_is_read_without_replacement() -> None:
    order = MixOrder(("small", "large"), ((10,), (1000,)), (1, 1), batch_size=20, shuffle=True, seed=1)
    rows = order.global_order(0)
    k = source_of(order, rows)
    small, large = rows[k == 0], rows[k == 1] - 10
    assert len(small) == len(large) == 505
    assert Counter(Counter(small.tolist()).values()) == {51: 5, 50: 5}  # every row 50 or 51 times
    assert len(set(large.tolist())) == 505  # no repeat
    nxt = order.global_order(1)
    later = nxt[source_of(order, nxt) == 1] - 10
    assert len(set(later.tolist()) | set(large.tolist())) == 1000  # the next epoch goes on with unseen rows


# ---------------------------------------------------------------------------- resume


def _run(order: MixOrder, epoch: int, world_size: int, consumed: int, steps: int | None = None) -> list[list[np.ndarray]]:
    n = order.num_batches(world_size, consumed)
    return [step_rows(order, epoch, s, world_size, consumed) for s in range(n if steps is None else min(steps, n))]


def _fresh(order: MixOrder) -> MixOrder:
    return pickle.loads(pickle.dumps(order))  # as in a restarted process


@SETTINGS
@given(mix_orders(), world_sizes, st.integers(0, 3), st.data())
def test_resume_on_the_same_world_size_continues_at_the_exact_next_batch(order, world_size, epoch, data) -> None:
    full = _run(_fresh(order), epoch, world_size, 0)
    done = data.draw(st.integers(0, len(full)))
    first = _fresh(order)
    _run(first, epoch, world_size, 0, done)
    state = first.state(epoch, first.consumed_after(done, world_size))
    resumed = _fresh(order)
    assert resumed.check_state(state) == (epoch, state["consumed"])
    rest = _run(resumed, epoch, world_size, state["consumed"])
    assert len(rest) == len(full) - done
    for a, b in zip(rest, full[done:]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@SETTINGS
@given(mix_orders(drop_last=st.just(False)), world_sizes, world_sizes, st.integers(0, 3), st.data())
def test_resume_on_another_world_size_draws_the_same_rows_and_keeps_shares(order, w1, w2, epoch, data) -> None:
    def epoch_rows(batches_by_step, world_size, consumed, o):
        return [o.global_batch(epoch, step, world_size, consumed) for step in range(len(batches_by_step))]

    reference = np.concatenate(epoch_rows(_run(_fresh(order), epoch, w1, 0), w1, 0, order) or [np.zeros(0, np.int64)])
    first = _fresh(order)
    done = data.draw(st.integers(0, first.num_batches(w1)))
    before = epoch_rows(_run(first, epoch, w1, 0, done), w1, 0, first)
    state = first.state(epoch, first.consumed_after(done, w1))
    resumed = _fresh(order)
    resumed.check_state(state)
    after = epoch_rows(_run(resumed, epoch, w2, state["consumed"]), w2, state["consumed"], resumed)
    rows = np.concatenate(before + after) if before + after else np.zeros(0, np.int64)
    assert sorted(rows.tolist()) == sorted(reference.tolist())  # the same rows of each source, once each
    q = quotas(order, epoch)
    size = order.batch_size * w2
    for step, part in enumerate(after):
        rest = len(part)
        counts = np.bincount(source_of(order, part), minlength=len(q))
        for k in range(len(q)):
            share = Fraction(rest * q[k], order.num_rows)
            assert math.floor(share) - 1 <= counts[k] <= math.ceil(share) + 1
    # the next epoch is the same as if nothing had happened
    for a, b in zip(_run(resumed, epoch + 1, w2, 0), _run(_fresh(order), epoch + 1, w2, 0)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_state_is_a_few_numbers() -> None:
    order = MixOrder(("web", "books"), ((100, 100), (50,)), (3, 1), batch_size=8, shuffle=True, seed=2)
    consumed = order.consumed_after(4, 2)
    list(_run(order, 0, 2, 0, 4))
    state = order.state(0, consumed)
    assert state["consumed"] == 64 and state["counters"] == {"web": 48, "books": 16}
    assert state["weights"] == [{"epoch": 0, "position": 0, "weights": {"web": [3, 1], "books": [1, 1]}, "counters": {"web": 0, "books": 0}}]


def test_check_state_refuses_other_sources_and_settings() -> None:
    order = MixOrder(("a", "b"), ((10,), (20,)), (1, 1), batch_size=4, shuffle=True, seed=0)
    state = order.state(0, 0)
    other = MixOrder(("a", "b"), ((10,), (21,)), (1, 1), batch_size=4, shuffle=True, seed=0)
    with pytest.raises(ValueError, match="num_rows"):
        other.check_state(state)
    renamed = MixOrder(("a", "c"), ((10,), (20,)), (1, 1), batch_size=4, shuffle=True, seed=0)
    with pytest.raises(ValueError, match="layout"):
        renamed.check_state(state)
    with pytest.raises(ValueError, match="seed"):
        MixOrder(("a", "b"), ((10,), (20,)), (1, 1), batch_size=4, shuffle=True, seed=1).check_state(state)
    with pytest.raises(ValueError, match="no per-source counters"):
        order.check_state({k: v for k, v in state.items() if k != "counters"})


# ---------------------------------------------------------------------------- weight changes


@SETTINGS
@given(mix_orders(drop_last=st.just(False)), world_sizes, st.data())
def test_a_weight_change_is_part_of_the_state_and_resumes_exactly(order, world_size, data) -> None:
    steps = order.num_batches(world_size)
    at = data.draw(st.integers(0, steps))
    new = {n: data.draw(weights_st) for n in order.names}
    later = data.draw(st.integers(at, steps))

    live = _fresh(order)
    _run(live, 0, world_size, 0, at)
    position = live.consumed_after(at, world_size)
    live.set_weights(0, position, new)
    _run(live, 0, world_size, position, later - at)
    state = live.state(0, live.consumed_after(later - at, world_size, position))
    expected = _run(live, 0, world_size, state["consumed"]) + _run(live, 1, world_size, 0)

    resumed = _fresh(order)
    resumed.check_state(state)
    assert resumed.current_weights(1) == pytest.approx({n: float(w) for n, w in new.items()})
    got = _run(resumed, 0, world_size, state["consumed"]) + _run(resumed, 1, world_size, 0)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_shares_follow_the_new_weights_after_a_change() -> None:
    order = MixOrder(("a", "b"), ((1000,), (1000,)), (1, 1), batch_size=10, shuffle=True, seed=3)
    _run(order, 0, 1, 0, 50)
    order.set_weights(0, 500, {"a": 9, "b": 1})
    assert np.bincount(source_of(order, order.batch(0, 0, 0, 1, 500)), minlength=2).tolist() == [9, 1]
    assert np.bincount(source_of(order, order.batch(0, 149, 0, 1, 500)), minlength=2).tolist() == [9, 1]
    assert np.bincount(source_of(order, order.batch(1, 0)), minlength=2).tolist() == [9, 1]
    with pytest.raises(ValueError, match="one weight per source"):
        order.set_weights(0, 500, {"a": 1})
    with pytest.raises(ValueError, match="positive finite"):
        order.set_weights(0, 500, {"a": 1, "b": 0})


# ---------------------------------------------------------------------------- layout, golden, misc


def test_a_source_of_under_a_row_an_epoch_never_gives_a_row_back() -> None:
    """s3's share is 0.18 of a row an epoch. Largest remainders of the cumulative split alone gave it its first row
    after epoch 1 and took it back after epoch 2: a quota of -1, on which a chunk of steps failed (found by
    test_steps_of_a_chunk_are_each_steps_batch)."""
    order = MixOrder(("s0", "s1", "s2", "s3"), ((1,), (1, 1, 1, 1), (1, 1, 1, 1), (26, 60, 60, 60)),
                     (2.65625, 6.65625, 9.34375, 0.015625), batch_size=13, epoch_rows=215)
    w = [Fraction(x) for x in order.weights]
    totals = [0] * 4
    for epoch in range(8):
        q = quotas(order, epoch)
        assert min(q) >= 0 and sum(q) == 215
        chunk = order.steps(epoch, 0, order.full_steps())
        rows = [order.batch(epoch, step) for step in range(order.num_batches())]
        for step in range(order.full_steps()):
            np.testing.assert_array_equal(chunk[step], rows[step])
        counts = np.bincount(source_of(order, np.concatenate(rows)), minlength=4).tolist()
        assert counts == q
        totals = [t + c for t, c in zip(totals, counts)]
        assert all(abs(totals[k] - (epoch + 1) * 215 * w[k] / sum(w)) < 1 for k in range(4))
    assert quotas(order, 2) == [30, 77, 108, 0]  # (largest remainders alone: [31, 77, 108, -1])


@SETTINGS
@given(mix_orders(), world_sizes, st.data())
def test_steps_of_a_chunk_are_each_steps_batch(order: MixOrder, world_size: int, data) -> None:
    epoch = data.draw(st.integers(0, 2))
    consumed = 0
    if epoch == 0 and data.draw(st.booleans()):  # a weight change inside the pass, which reached it first
        before = data.draw(st.integers(0, order.num_batches(world_size)))
        _run(order, 0, world_size, 0, before)
        order.set_weights(0, order.consumed_after(before, world_size), {n: data.draw(weights_st) for n in order.names})
    elif epoch == 0:  # a pass resumed mid-epoch
        consumed = order.consumed_after(data.draw(st.integers(0, order.num_batches(world_size))), world_size)
    full = order.full_steps(world_size, consumed)
    first = data.draw(st.integers(0, full))
    count = data.draw(st.integers(0, full - first))
    rank = data.draw(st.integers(0, world_size - 1))
    chunk = order.steps(epoch, first, count, rank, world_size, consumed)
    assert chunk.shape == (count, order.batch_size) and chunk.dtype == np.int64
    for i, step in enumerate(range(first, first + count)):
        np.testing.assert_array_equal(chunk[i], order.batch(epoch, step, rank, world_size, consumed))
    if full:
        with pytest.raises(IndexError):
            order.steps(epoch, first, full - first + 1, rank, world_size, consumed)


@SETTINGS
@given(mix_orders(), world_sizes)
def test_batches_are_grouped_by_source_and_shard(order: MixOrder, world_size: int) -> None:
    for step in range(min(3, order.num_batches(world_size))):
        for batch in step_rows(order, 0, step, world_size):
            shard = np.searchsorted(order.offsets, batch, side="right")
            assert np.all(np.diff(shard) >= 0)


@SETTINGS
@given(mix_orders(), world_sizes, st.data())
def test_shard_uses_cover_every_shard_each_step_reads(order: MixOrder, world_size: int, data) -> None:
    n = order.num_batches(world_size)
    consumed = order.consumed_after(data.draw(st.integers(0, n)), world_size)
    uses = order.shard_uses(0, world_size, consumed)
    for step in range(order.num_batches(world_size, consumed)):
        for batch in step_rows(order, 0, step, world_size, consumed):
            for shard in set((np.searchsorted(order.offsets, batch, side="right") - 1).tolist()):
                assert any(a <= step <= b and s == shard for a, b, s in uses), (step, shard)


def test_golden_batches() -> None:
    order = MixOrder(("a", "b", "c"), ((5, 7), (4,), (9,)), (0.5, 0.3, 0.2), batch_size=6, shuffle=True, seed=11)
    assert order.batch(0, 0).tolist() == GOLDEN[0]
    assert order.batch(0, 1, 1, 2).tolist() == GOLDEN[1]
    assert order.batch(3, 0).tolist() == GOLDEN[2]


GOLDEN = [[2, 6, 11, 15, 12, 22], [1, 3, 10, 13, 15, 17], [4, 2, 11, 14, 15, 18]]  # chute 0.1.0


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="positive finite"):
        MixOrder(("a",), ((3,),), (-1,), batch_size=2)
    with pytest.raises(ValueError, match="no rows"):
        MixOrder(("a", "b"), ((3,), (0,)), (1, 1), batch_size=2)
    with pytest.raises(ValueError, match="distinct"):
        MixOrder(("a", "a"), ((3,), (3,)), (1, 1), batch_size=2)
    order = MixOrder(("a",), ((3,),), (1,), batch_size=2)
    with pytest.raises(IndexError, match="outside the 2 batches"):
        order.batch(0, 2)
    with pytest.raises(ValueError, match="not a step boundary"):
        order.state(0, 1)


def test_the_order_is_safe_to_share_between_threads() -> None:
    order = MixOrder(("a", "b"), ((300, 300), (200,)), (2, 1), batch_size=16, shuffle=True, seed=4)
    expected = [MixOrder(("a", "b"), ((300, 300), (200,)), (2, 1), batch_size=16, shuffle=True, seed=4).batch(0, s, 1, 3) for s in range(order.num_batches(3))]
    results: dict[int, list[np.ndarray]] = {}

    def work(t: int) -> None:
        results[t] = [order.batch(0, s, 1, 3) for s in range(order.num_batches(3))]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 4
    for got in results.values():
        for x, y in zip(got, expected):
            np.testing.assert_array_equal(x, y)
