"""The global order (chute/order.py): what each rank delivers, batch by batch.

The properties are those docs/loader.md states for the global order. The
expected values are derived from the spec alone (positions of the epoch's global
order), never by calling the code under test a second way:

* every rank delivers the same number of batches; a full step gives rank ``r``
  positions ``[first + r*B, first + (r+1)*B)``; the last, partial step is the
  rest of the order followed by the padding positions ``0, 1, 2, ...`` (cyclic),
  cut into ``world_size`` equal slices of ``ceil(rest / world_size)`` rows;
* within a batch the rows of a shard are contiguous and keep their order;
* an epoch, also one resumed on another world size, delivers every sample
  exactly once plus the padding (with ``drop_last``: exactly the positions of the
  full steps, once).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from chute.order import Order, permutation

# ---------------------------------------------------------------------------- strategies

_shard = st.one_of(st.integers(1, 200), st.integers(1, 200), st.integers(1, 200), st.just(0))  # 1 in 4 empty
layouts = st.integers(0, 40).flatmap(lambda n: st.lists(_shard, min_size=n, max_size=n))
"""0..40 shards of 0..200 rows (empty shards and empty datasets included)."""
batch_sizes = st.integers(1, 64)
world_sizes = st.integers(1, 64)
seeds = st.integers(0, 2**63 - 1)
windows = st.integers(1, 8)
epochs = st.integers(0, 10**6)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def orders(draw, shuffle=st.booleans(), drop_last=st.booleans()) -> Order:
    return Order(
        tuple(draw(layouts)),
        batch_size=draw(batch_sizes),
        shuffle=draw(shuffle),
        seed=draw(seeds),
        window=draw(windows),
        drop_last=draw(drop_last),
    )


# ---------------------------------------------------------------------------- spec helpers


def _offsets(order: Order) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(order.shard_rows, dtype=np.int64))]).astype(np.int64)


def _shard_of(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.searchsorted(offsets, rows, side="right") - 1


def _padding(n: int, rest: int, world_size: int) -> int:
    """Rows missing from a last step of ``rest`` rows to give every rank ``ceil(rest/world_size)``."""
    return -(-rest // world_size) * world_size - rest


def _expected_rows(g: np.ndarray, order: Order, step: int, rank: int, world_size: int, consumed: int) -> np.ndarray:
    """The rows rank ``rank`` delivers in ``step`` (before grouping by shard), from the spec."""
    n, size = len(g), order.batch_size * world_size
    first = consumed + step * size
    if first + size <= n:
        return g[first + rank * order.batch_size : first + (rank + 1) * order.batch_size]
    rest = n - first
    share = -(-rest // world_size)
    padded = np.concatenate([g[first:], g[np.arange(_padding(n, rest, world_size)) % n]])
    return padded[rank * share : (rank + 1) * share]


def _assert_grouped_by_shard(batch: np.ndarray, expected: np.ndarray, offsets: np.ndarray) -> None:
    """``batch`` holds ``expected``'s rows, each shard's rows contiguous and in ``expected``'s order."""
    assert batch.dtype == np.int64
    assert np.array_equal(np.sort(batch), np.sort(expected)), (batch, expected)
    shards = _shard_of(offsets, batch)
    run_heads = shards[np.r_[True, shards[1:] != shards[:-1]]] if len(shards) else shards
    assert len(run_heads) == len(set(run_heads.tolist())), f"rows of a shard are split within the batch: {shards}"
    expected_shards = _shard_of(offsets, expected)
    for s in set(run_heads.tolist()):
        assert np.array_equal(batch[shards == s], expected[expected_shards == s]), f"shard {s} rows reordered"


def _check_pass(order: Order, epoch: int, world_size: int, consumed: int) -> list[np.ndarray]:
    """Every rank's batches from ``consumed`` to the end, checked against the spec; returns them."""
    g = order.global_order(epoch)
    offsets = _offsets(order)
    n_batches = order.num_batches(world_size, consumed)
    delivered = []
    for rank in range(world_size):
        batches = list(order.batches(epoch, rank, world_size, consumed))
        assert len(batches) == n_batches, f"rank {rank} delivers {len(batches)} batches, num_batches says {n_batches}"
        for step, batch in enumerate(batches):
            expected = _expected_rows(g, order, step, rank, world_size, consumed)
            if step < n_batches - 1 or order.drop_last:
                assert len(batch) == order.batch_size
            _assert_grouped_by_shard(batch, expected, offsets)
            assert np.array_equal(order.batch(epoch, step, rank, world_size, consumed), batch)
        delivered.extend(batches)
    return delivered


def _counts(rows, n: int) -> np.ndarray:
    rows = np.concatenate([np.asarray(r, dtype=np.int64).ravel() for r in rows]) if len(rows) else np.zeros(0, np.int64)
    return np.bincount(rows, minlength=n) if n else np.zeros(0, np.int64)


def _expected_counts(g: np.ndarray, covered: int, padding: int) -> np.ndarray:
    """Each row of positions ``[0, covered)`` once, plus padding positions ``0..padding-1`` (cyclic)."""
    n = len(g)
    counts = np.zeros(n, dtype=np.int64)
    np.add.at(counts, g[:covered], 1)
    if padding:
        np.add.at(counts, g[np.arange(padding) % n], 1)
    return counts


def _tail(order: Order, world_size: int, consumed: int) -> tuple[int, int]:
    """``(covered, padding)`` once a pass of ``world_size`` ranks from ``consumed`` has ended."""
    n, step = order.num_rows, order.batch_size * world_size
    rest = max(0, n - consumed)
    if order.drop_last:
        return consumed + rest // step * step, 0
    return n, _padding(n, rest % step, world_size)


# ---------------------------------------------------------------------------- the global order


@SETTINGS
@given(orders(), epochs)
def test_global_order_is_a_deterministic_permutation(order: Order, epoch: int) -> None:
    g = order.global_order(epoch)
    assert g.dtype == np.int64
    assert np.array_equal(np.sort(g), np.arange(order.num_rows))
    if not order.shuffle:
        assert np.array_equal(g, np.arange(order.num_rows))
    twin = Order(order.shard_rows, order.batch_size, order.shuffle, order.seed, order.window, order.drop_last)
    assert np.array_equal(twin.global_order(epoch), g)
    assert np.array_equal(order.global_order(epoch), g)  # and again, from the warm cache


@SETTINGS
@given(orders(), epochs, st.data())
def test_positions_are_slices_of_the_global_order(order: Order, epoch: int, data) -> None:
    n = order.num_rows
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    fresh = Order(order.shard_rows, order.batch_size, order.shuffle, order.seed, order.window)
    spans = list(zip([0, *cuts], [*cuts, n]))
    pieces = [(a, fresh.positions(epoch, a, b)) for a, b in reversed(spans)]  # later pieces first, cold cache
    pieces.sort(key=lambda p: p[0])
    assert np.array_equal(np.concatenate([p for _, p in pieces]), order.global_order(epoch))
    assert len(fresh.positions(epoch, n, n + 5)) == 0


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, seeds, windows, epochs)
def test_shuffle_windows_are_contiguous_and_local(shard_rows, seed, window, epoch) -> None:
    """All rows of a window precede the next window's: the global order is a sequence of
    contiguous blocks, each made of whole shards, none holding more than ``window`` shards."""
    order = Order(tuple(shard_rows), 1, shuffle=True, seed=seed, window=window)
    g = order.global_order(epoch)
    shards = _shard_of(_offsets(order), g)
    # first and last position of every shard; overlapping spans form the blocks
    first, last = {}, {}
    for pos, s in enumerate(shards.tolist()):
        first.setdefault(s, pos)
        last[s] = pos
    block_end, members, blocks = -1, [], []
    for s in sorted(first, key=first.get):
        if first[s] > block_end and members:
            blocks.append(members)
            members = []
        members.append(s)
        block_end = max(block_end, last[s])
    if members:
        blocks.append(members)
    for members in blocks:
        assert len(members) <= window, f"{len(members)} shards interleaved in one block, window is {window}"
    if window == 1:  # each shard is read start to end before the next
        for s in first:
            assert last[s] - first[s] + 1 == order.shard_rows[s]


def test_shuffle_mixes_shards_within_a_window() -> None:
    order = Order((50, 50, 50, 50), 1, shuffle=True, seed=3, window=2)
    shards = _shard_of(_offsets(order), order.global_order(0))
    first_half = set(shards[:100].tolist())
    assert len(first_half) == 2, "the first window holds two shards"
    assert len(set(shards[:20].tolist())) == 2, "rows of a window's shards are interleaved"
    assert not np.array_equal(order.global_order(0), order.global_order(1))


LAYOUTS_N_GE_10 = [(10,), (1,) * 10, (3, 3, 4), (0, 10, 0), (5, 0, 5), (100, 50, 80), (7,) * 30, (200,) * 40]


@pytest.mark.parametrize("shard_rows", LAYOUTS_N_GE_10, ids=str)
@pytest.mark.parametrize("window", [1, 2, 4, 8])
def test_epochs_and_seeds_give_different_orders(shard_rows, window) -> None:
    """Fixed cases (no randomness, so no flakes): five epochs differ, five seeds differ."""
    by_epoch = {tuple(Order(shard_rows, 4, True, 11, window).global_order(e).tolist()) for e in range(5)}
    assert len(by_epoch) == 5
    by_seed = {tuple(Order(shard_rows, 4, True, s, window).global_order(2).tolist()) for s in (0, 1, 2, 12345, 2**63 - 1)}
    assert len(by_seed) == 5


def test_golden_order() -> None:
    """The exact order is part of the checkpoint format: a change here breaks resuming old runs."""
    order = Order((100, 50, 80), batch_size=4, shuffle=True, seed=7, window=2)
    assert order.global_order(0)[:12].tolist() == [103, 154, 170, 119, 111, 155, 213, 132, 220, 151, 106, 120]
    assert permutation(20, 12345).tolist() == [8, 9, 6, 17, 1, 2, 18, 3, 13, 15, 19, 0, 14, 10, 4, 7, 11, 5, 16, 12]


# ---------------------------------------------------------------------------- permutation


def test_permutation_is_a_permutation_for_every_small_n() -> None:
    for n in range(5001):
        p = permutation(n, n * 7919 + 1)
        assert p.dtype == np.int64 and len(p) == n
        assert np.array_equal(np.sort(p), np.arange(n)), n


def test_permutation_across_chunks() -> None:
    n = (1 << 20) + 5  # the Feistel domain is walked in several chunks
    assert np.array_equal(np.sort(permutation(n, 3)), np.arange(n))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 5000), st.integers(0, 2**64 - 1))
def test_permutation_property(n: int, key: int) -> None:
    p = permutation(n, key)
    assert np.array_equal(np.sort(p), np.arange(n))
    assert np.array_equal(permutation(n, key), p)


@pytest.mark.parametrize("n", [10, 11, 16, 17, 100, 1000, 5000])
def test_permutation_keys_differ(n: int) -> None:
    perms = {tuple(permutation(n, key).tolist()) for key in (0, 1, 2, 3, 2**32, 2**63, 2**64 - 1)}
    assert len(perms) == 7


# ---------------------------------------------------------------------------- steps and ranks


@SETTINGS
@given(orders(), world_sizes, epochs)
@example(Order((200,) * 40, 1, shuffle=True, seed=9, window=8), 64, 0)  # the largest layout
@example(Order((200,) * 40, 64, shuffle=True, seed=9, window=3), 64, 1)
@example(Order((0, 0), 5, shuffle=True), 3, 0)  # a dataset of 0 rows
@example(Order((1,), 64), 64, 0)  # one row, padded 63 times
def test_an_epoch_delivers_every_sample_once_plus_padding(order: Order, world_size: int, epoch: int) -> None:
    delivered = _check_pass(order, epoch, world_size, consumed=0)
    covered, padding = _tail(order, world_size, 0)
    g = order.global_order(epoch)
    assert np.array_equal(_counts(delivered, order.num_rows), _expected_counts(g, covered, padding))
    if order.drop_last:  # exactly the positions of the full steps, at most once
        assert covered == order.num_rows // (order.batch_size * world_size) * order.batch_size * world_size
        assert _counts(delivered, order.num_rows).max(initial=0) <= 1
    else:
        assert padding < world_size


@SETTINGS
@given(orders(), world_sizes, epochs, st.data())
def test_a_pass_from_any_position_delivers_the_rest_once(order: Order, world_size: int, epoch: int, data) -> None:
    consumed = data.draw(st.integers(0, order.num_rows), label="consumed")
    delivered = _check_pass(order, epoch, world_size, consumed)
    covered, padding = _tail(order, world_size, consumed)
    g = order.global_order(epoch)
    expected = _expected_counts(g, covered, padding)
    np.subtract.at(expected, g[:consumed], 1)  # positions before ``consumed`` were delivered already
    assert np.array_equal(_counts(delivered, order.num_rows), expected)


@SETTINGS
@given(orders(), world_sizes, world_sizes, epochs, st.data())
def test_resume_on_another_world_size_covers_the_epoch_once(order: Order, w1: int, w2: int, epoch: int, data) -> None:
    """Stop after ``k`` steps on ``w1`` ranks, save ``consumed``, finish on ``w2`` ranks."""
    n1 = order.num_batches(w1)
    k = data.draw(st.integers(0, n1), label="k")
    consumed = order.consumed_after(k, w1)
    g = order.global_order(epoch)
    before = [order.batch(epoch, step, rank, w1) for step in range(k) for rank in range(w1)]
    if k < n1:
        assert consumed == k * order.batch_size * w1
        assert np.array_equal(_counts(before, order.num_rows), _counts([g[:consumed]], order.num_rows))
    else:
        assert consumed == order.num_rows
    epoch_, consumed_ = order.check_state(order.state(epoch, consumed))
    assert (epoch_, consumed_) == (epoch, consumed)

    after = _check_pass(order, epoch, w2, consumed_)
    if consumed < order.num_rows:
        covered, padding = _tail(order, w2, consumed)
    else:  # the first pass ran to the end: its last step held the tail
        covered, padding = _tail(order, w1, 0)
        assert after == []
    assert np.array_equal(_counts(before + after, order.num_rows), _expected_counts(g, covered, padding))


@SETTINGS
@given(orders(), world_sizes, st.data())
def test_num_batches_and_consumed_after(order: Order, world_size: int, data) -> None:
    n_rows = order.num_rows
    consumed = data.draw(st.integers(0, n_rows), label="consumed")
    step = order.batch_size * world_size
    full, tail = divmod(n_rows - consumed, step)
    n = order.num_batches(world_size, consumed)
    assert n == full + (1 if tail and not order.drop_last else 0)
    for rank in (0, world_size - 1):
        assert sum(1 for _ in order.batches(0, rank, world_size, consumed)) == n
    previous = consumed
    for k in range(min(n, 50) + 2):
        after = order.consumed_after(k, world_size, consumed)
        assert after >= previous
        previous = after
        if k < n:
            assert after == consumed + k * step
            assert order.num_batches(world_size, after) == n - k
        else:
            assert after == n_rows
            assert order.num_batches(world_size, after) == 0


def test_last_step_shares_and_padding_example() -> None:
    """10 rows, batch 4, 3 ranks: one full step of 12 is impossible, so the only step is
    partial: each rank gets ceil(10/3) = 4 rows, 2 of them padding (positions 0 and 1)."""
    order = Order((10,), batch_size=4)
    assert order.num_batches(3) == 1
    assert [order.batch(0, 0, r, 3).tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert Order((10,), batch_size=4, drop_last=True).num_batches(3) == 0
    # a dataset smaller than the padding: padding cycles through the order
    tiny = Order((1, 1), batch_size=1)
    assert [tiny.batch(0, 0, r, 5).tolist() for r in range(5)] == [[0], [1], [0], [1], [0]]


def test_batches_are_grouped_by_shard_example() -> None:
    order = Order((3, 3, 3), batch_size=9, shuffle=True, seed=1, window=3)
    g = order.global_order(0)
    batch = order.batch(0, 0)
    assert sorted(batch.tolist()) == list(range(9))
    shards = (batch // 3).tolist()
    runs = [s for i, s in enumerate(shards) if i == 0 or shards[i - 1] != s]
    assert len(runs) == 3, f"each shard's rows are contiguous: {shards}"
    for s in range(3):
        assert batch[batch // 3 == s].tolist() == [r for r in g.tolist() if r // 3 == s]


def test_empty_dataset() -> None:
    for shard_rows in [(), (0,), (0, 0, 0)]:
        order = Order(shard_rows, batch_size=3, shuffle=True)
        assert order.num_rows == 0 and len(order.global_order(0)) == 0
        assert order.num_batches(4) == 0 and list(order.batches(0, 1, 4)) == []
        assert order.consumed_after(0, 4) == 0
        assert order.check_state(order.state(0, 0)) == (0, 0)


# ---------------------------------------------------------------------------- arguments and state


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(window=0), "window"),
        (dict(shard_rows=(3, -1)), "negative"),
        (dict(seed=-1), "seed"),
        (dict(seed=2**63), "seed"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message) -> None:
    args = dict(shard_rows=(3, 4), batch_size=2) | kwargs
    with pytest.raises(ValueError, match=message):
        Order(**args)


def test_bad_rank_world_and_step_are_refused() -> None:
    order = Order((10,), batch_size=4)
    with pytest.raises(ValueError, match="world_size"):
        order.num_batches(0)
    with pytest.raises(ValueError, match="rank"):
        order.batch(0, 0, rank=2, world_size=2)
    with pytest.raises(IndexError, match="step 3"):
        order.batch(0, 3)


@SETTINGS
@given(orders(), epochs, st.data())
def test_state_round_trips(order: Order, epoch: int, data) -> None:
    consumed = data.draw(st.integers(0, order.num_rows))
    state = order.state(epoch, consumed)
    assert {"epoch", "consumed", "seed"} <= state.keys()
    assert all(isinstance(v, (int, bool, str)) for v in state.values())  # JSON-able, no numpy scalars
    twin = Order(order.shard_rows, order.batch_size, order.shuffle, order.seed, order.window, order.drop_last)
    assert twin.check_state(state) == (epoch, consumed)


BASE = dict(shard_rows=(30, 20, 50), batch_size=4, shuffle=True, seed=5, window=2)


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(seed=6), "seed"),
        (dict(shuffle=False), "shuffle"),
        (dict(window=3), "window"),
        (dict(shard_rows=(30, 20, 51)), "num_rows"),
        (dict(shard_rows=(30, 20, 25, 25)), "num_shards"),
    ],
)
def test_check_state_refuses_another_order(change, key) -> None:
    saved = Order(**BASE).state(epoch=3, consumed=40)
    other = Order(**(BASE | change))
    with pytest.raises(ValueError, match="cannot resume") as info:
        other.check_state(saved)
    text = str(info.value)
    assert f"{key}={saved[key]!r}" in text and f"{key}={other.state(0, 0)[key]!r}" in text, text


def test_check_state_refuses_a_position_outside_the_epoch() -> None:
    order = Order(**BASE)
    for consumed in (-1, 101):
        with pytest.raises(ValueError, match="outside an epoch of 100 rows"):
            order.check_state(order.state(0, 0) | {"consumed": consumed})
    assert order.check_state(order.state(2, 100)) == (2, 100)


def test_check_state_accepts_another_batch_size_and_drop_last() -> None:
    """The state is a position in rows: batch size and drop_last may change on resume."""
    saved = Order(**BASE).state(epoch=1, consumed=40)
    assert Order(**(BASE | dict(batch_size=7)), drop_last=True).check_state(saved) == (1, 40)


# ---------------------------------------------------------------------------- threads


class _EvictTogether(dict):
    """A memo dict whose evictions wait for a second thread's (up to 1 s), then run side by side.

    Loader worker threads share one ``Order``; this forces the interleaving in
    which two of them evict at the same moment, which a bare dict memo does not
    survive. A memo behind a lock never lets two threads in at once: each
    wait times out and the test passes (one second slower).
    """

    def __init__(self) -> None:
        super().__init__()
        self._before = threading.Barrier(2, timeout=1.0)
        self._after = threading.Barrier(2, timeout=1.0)

    @staticmethod
    def _wait(barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass

    def pop(self, *args):
        self._wait(self._before)
        try:
            return super().pop(*args)
        finally:
            self._wait(self._after)


def test_order_is_safe_to_share_between_threads() -> None:
    shard_rows = (4,) * 64
    order = Order(shard_rows, batch_size=4, shuffle=True, seed=1, window=1)
    reference = Order(shard_rows, batch_size=4, shuffle=True, seed=1, window=1)
    object.__setattr__(order, "_cache", _EvictTogether())  # white box: the memo, with a forced thread switch
    for step in range(7):
        order.batch(0, step)  # fill the memo (no eviction yet)
    results, errors = {}, []

    def work(step: int) -> None:
        try:
            results[step] = order.batch(0, step)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(step,)) for step in (20, 40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    for step, rows in results.items():
        assert np.array_equal(rows, reference.batch(0, step))


def test_state_from_another_shard_layout_of_the_same_size_is_refused() -> None:
    saved = Order((10, 20), batch_size=4, shuffle=True).state(0, 8)
    with pytest.raises(ValueError, match="layout"):
        Order((20, 10), batch_size=4, shuffle=True).check_state(saved)


def test_negative_position_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Order((10,), batch_size=4).batch(0, 0, consumed=-50)


@SETTINGS
@given(orders(), world_sizes, epochs, st.data())
@example(Order((200,) * 40, 8, shuffle=True, seed=9, window=3), 3, 2, None)
def test_steps_are_the_batches_computed_at_once(order: Order, world_size: int, epoch: int, data) -> None:
    """``steps`` (the Loader's vectorised form) equals ``batch`` step by step, for every rank and position."""
    consumed = data.draw(st.integers(0, order.num_rows), label="consumed") if data is not None else 17
    full = order.full_steps(world_size, consumed)
    assert full == order.num_batches(world_size, consumed) - (1 if (order.num_rows - consumed) % (order.batch_size * world_size) and not order.drop_last else 0)
    first = data.draw(st.integers(0, full), label="first") if data is not None else 0
    count = data.draw(st.integers(0, full - first), label="count") if data is not None else full
    for rank in range(min(world_size, 4)):
        rows = order.steps(epoch, first, count, rank, world_size, consumed)
        assert rows.shape == (count, order.batch_size) and rows.dtype == np.int64 and rows.flags.c_contiguous
        for k in range(count):
            assert np.array_equal(rows[k], order.batch(epoch, first + k, rank, world_size, consumed))
    with pytest.raises(IndexError):
        order.steps(epoch, first, full - first + 1, 0, world_size, consumed)
