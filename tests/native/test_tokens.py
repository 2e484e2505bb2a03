"""chute._native token kernels (tokens_window, tokens_plan, tokens_packed), fuzzed against pure Python and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from chute import _native
from tests.tokens.reference import num_windows, pack_documents, packed_batch

from ._reference import SETTINGS

dtypes = st.sampled_from([np.uint16, np.uint32])
doc_lengths = st.lists(st.one_of(st.integers(0, 12), st.integers(13, 70), st.just(0)), max_size=25)


def shard_arrays(lengths: list[int], dtype, seed: int, prefix: int) -> tuple[np.ndarray, int, np.ndarray]:
    """A shard's tokens (behind ``prefix`` junk tokens), its base and absolute document offsets."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    tokens = rng.integers(0, top, prefix + sum(lengths), dtype=np.int64).astype(dtype)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return tokens, prefix, offsets + prefix


@SETTINGS
@given(st.lists(doc_lengths, min_size=1, max_size=5), dtypes, st.integers(1, 40), st.integers(0, 2**32), st.data())
def test_window_equals_numpy_slicing_of_the_stream(shards, dtype, seq_len, seed, data):
    built = [shard_arrays(lengths, dtype, seed + k, prefix=k % 3) for k, lengths in enumerate(shards)]
    stream = np.concatenate([t[base:] for t, base, _ in built]).astype(np.int64)
    starts = np.zeros(len(shards) + 1, np.int64)
    np.cumsum([len(t) - base for t, base, _ in built], out=starts[1:])
    windows = num_windows(len(stream), seq_len)
    indices = np.asarray(data.draw(st.lists(st.integers(0, max(0, windows - 1)), max_size=12 if windows else 0)), np.int64)
    inputs = np.full((len(indices), seq_len), -7, np.int64)
    labels = np.full((len(indices), seq_len), -7, np.int64)
    _native.tokens_window(indices, seq_len, starts, [(t, base) for t, base, _ in built], np.dtype(dtype).itemsize, inputs, labels)
    for row, w in enumerate(indices.tolist()):
        assert inputs[row].tolist() == stream[w * seq_len : w * seq_len + seq_len].tolist()
        assert labels[row].tolist() == stream[w * seq_len + 1 : w * seq_len + seq_len + 1].tolist()


def test_window_asks_for_the_lowest_unmapped_shard_and_checks_bounds():
    tokens = np.arange(10, dtype=np.uint16)
    starts = np.array([0, 10, 20, 30], np.int64)
    out = np.zeros((1, 12), np.int64)
    with pytest.raises(_native.Unmapped) as info:
        _native.tokens_window(np.array([1], np.int64), 12, starts, [(tokens, 0), None, None], 2, out, out.copy())
    assert info.value.shard == 1
    with pytest.raises(IndexError, match="window 2 is out of range"):
        _native.tokens_window(np.array([2], np.int64), 12, starts, [(tokens, 0)] * 3, 2, out, out.copy())
    with pytest.raises(_native.CorruptShard, match="too few for 10 tokens"):
        _native.tokens_window(np.array([0], np.int64), 12, starts, [(tokens[:5], 0)] * 3, 2, out, out.copy())
    with pytest.raises(ValueError, match="never decrease"):
        _native.tokens_window(np.array([0], np.int64), 12, starts[::-1].copy(), [(tokens, 0)] * 3, 2, out, out.copy())


@SETTINGS
@given(doc_lengths, st.integers(1, 40), st.integers(0, 5))
def test_plan_equals_the_reference_packing(lengths, seq_len, prefix):
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    offsets += prefix
    count = _native.tokens_plan(offsets, seq_len)
    bounds = np.empty(count + 1, np.int64)
    assert _native.tokens_plan(offsets, seq_len, bounds) == count
    positions = iter(range(prefix, prefix + sum(lengths)))
    docs = [[next(positions) for _ in range(n)] for n in lengths]  # token = its position: pieces show where they sit
    expected = pack_documents(docs, seq_len)
    assert count == len(expected)
    for k, pieces in enumerate(expected):
        flat = [t for piece in pieces for t in piece]
        assert [int(bounds[k]), int(bounds[k + 1])] == [flat[0], flat[-1] + 1]  # contiguous ranges that tile the tokens


def test_plan_refuses_decreasing_offsets():
    with pytest.raises(ValueError, match="decrease at document 1"):
        _native.tokens_plan(np.array([0, 5, 3, 9], np.int64), 4)


@SETTINGS
@given(st.lists(st.integers(-2_000, 2_000) | st.integers(-3, 40), min_size=1, max_size=30), st.integers(1, 40),
       st.booleans(), st.data())
def test_plan_refuses_exactly_the_offsets_numpy_finds_decreasing(values, seq_len, sorted_, data):
    """The plan pass is what checks a token shard's offsets (Arrow's full validation is skipped when a token
    shard is opened): it must refuse every offsets array that starts below 0 or decreases, at the first bad
    document, and accept every other one, with or without an ``out`` to fill."""
    offsets = np.asarray(sorted(values) if sorted_ else values, np.int64)
    if sorted_ and data.draw(st.booleans()):  # one entry moved: a single local dent
        k = data.draw(st.integers(0, len(offsets) - 1))
        offsets[k] += data.draw(st.integers(-50, 50))
    steps = np.diff(offsets)
    bad = 0 if offsets[0] < 0 else (int(np.argmax(steps < 0)) if (steps < 0).any() else None)
    if bad is None:
        count = _native.tokens_plan(offsets, seq_len)
        out = np.empty(count + 1, np.int64)
        assert _native.tokens_plan(offsets, seq_len, out) == count
        assert out[0] == offsets[0] and out[-1] == offsets[-1] and (np.diff(out) > 0).all() and (np.diff(out) <= seq_len).all()
        return
    with pytest.raises(ValueError, match=f"decrease at document {bad} "):
        _native.tokens_plan(offsets, seq_len)
    with pytest.raises(ValueError, match=f"decrease at document {bad} "):
        _native.tokens_plan(offsets, seq_len, np.empty(len(offsets) + 2, np.int64))


@SETTINGS
@given(st.lists(doc_lengths, min_size=1, max_size=4), dtypes, st.integers(1, 40), st.integers(-5, 5), st.integers(0, 2**32), st.data())
def test_packed_rows_equal_the_reference(shards, dtype, seq_len, pad_id, seed, data):
    sources, expected_rows = [], []
    for k, lengths in enumerate(shards):
        tokens, base, offsets = shard_arrays(lengths, dtype, seed + k, prefix=k % 2)
        bounds = np.empty(_native.tokens_plan(offsets, seq_len) + 1, np.int64)
        _native.tokens_plan(offsets, seq_len, bounds)
        sources.append((tokens, offsets, bounds))
        docs = [tokens[a:b].astype(np.int64).tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        expected_rows.append(pack_documents(docs, seq_len))
    rows = [len(r) for r in expected_rows]
    row_offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(rows, out=row_offsets[1:])
    total = int(row_offsets[-1])
    indices = np.asarray(data.draw(st.lists(st.integers(0, max(0, total - 1)), max_size=10 if total else 0)), np.int64)
    flat = [seq for shard in expected_rows for seq in shard]
    n = len(indices)
    outs = [np.full((n, seq_len), -7, np.int64) for _ in range(3)]
    cu = np.full(n * seq_len + 1, -7, np.int32)
    count = _native.tokens_packed(indices, row_offsets, sources, np.dtype(dtype).itemsize, seq_len, pad_id, *outs, cu)
    want = packed_batch([flat[i] for i in indices.tolist()], seq_len, pad_id)
    assert outs[0].tolist() == want["input_ids"]
    assert outs[1].tolist() == want["labels"]
    assert outs[2].tolist() == want["position_ids"]
    assert cu[:count].tolist() == want["cu_seqlens"]


def test_packed_asks_for_unmapped_shards_and_checks_the_plan():
    tokens = np.arange(8, dtype=np.uint32)
    offsets = np.array([0, 3, 8], np.int64)
    plan = np.array([0, 3, 8], np.int64)
    outs = [np.zeros((1, 5), np.int64) for _ in range(3)]
    cu = np.zeros(6, np.int32)
    with pytest.raises(_native.Unmapped) as info:
        _native.tokens_packed(np.array([2], np.int64), np.array([0, 2, 4], np.int64), [(tokens, offsets, plan), None], 4, 5, 0, *outs, cu)
    assert info.value.shard == 1
    bad = np.array([0, 3, 9], np.int64)  # past the tokens
    with pytest.raises(_native.CorruptShard, match="does not fit 8 tokens"):
        _native.tokens_packed(np.array([1], np.int64), np.array([0, 2], np.int64), [(tokens, offsets, bad)], 4, 5, 0, *outs, cu)


@pytest.mark.parametrize(
    ("window", "starts", "base", "itemsize"),
    [
        (10**6, [0, 2**62], 0, 4),  # a huge start: (base + count) * itemsize wrapped to 0 and passed the check
        (2**58, [0, 2**62], 0, 4),  # a huge window, far past the 16 bytes
        (2**40, [0, 2**63 - 1], 0, 2),  # the last int64: base + count alone overflows once base > 0
        (0, [0, 2**63 - 1], 1, 2),
        (0, [0, 8], 2**60 - 1, 2),  # a huge base
    ],
)
def test_window_refuses_a_shard_too_short_for_a_huge_claim_without_reading_past_it(window, starts, base, itemsize):
    """A direct call with a 16-byte shard whose starts claim far more tokens: the kernel's own check must
    refuse it (CorruptShard naming the bytes it holds), not read past the buffer or segfault; the outputs
    are left as they were."""
    tokens = np.arange(16 // itemsize, dtype=np.uint16 if itemsize == 2 else np.uint32)
    assert tokens.nbytes == 16
    inputs, labels = np.full((1, 4), -7, np.int64), np.full((1, 4), -7, np.int64)
    with pytest.raises(_native.CorruptShard, match="holds 16 bytes of tokens, too few"):
        _native.tokens_window(np.array([window], np.int64), 4, np.array(starts, np.int64), [(tokens, base)], itemsize, inputs, labels)
    assert (inputs == -7).all() and (labels == -7).all()


def test_window_takes_its_sources_as_a_tuple_as_well_as_a_list():
    # the sources were read as a list's items even when given as a tuple (which the check of their count
    # accepts): a tuple crashed the process
    tokens = np.arange(20, dtype=np.uint16)
    for sources in ([(tokens, 0)], ((tokens, 0),)):
        inputs, labels = np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64)
        _native.tokens_window(np.array([1, 3], np.int64), 4, np.array([0, 20], np.int64), sources, 2, inputs, labels)
        assert inputs.tolist() == [[4, 5, 6, 7], [12, 13, 14, 15]]
        assert labels.tolist() == [[5, 6, 7, 8], [13, 14, 15, 16]]


def test_packed_refuses_a_plan_past_a_16_byte_shard():
    tokens = np.arange(4, dtype=np.uint32)  # 16 bytes
    offsets = np.array([0, 4], np.int64)
    outs = [np.full((1, 5), -7, np.int64) for _ in range(3)]
    cu = np.zeros(6, np.int32)
    for plan in ([0, 2**62], [2**62, 2**62 + 4], [0, 2**63 - 1]):
        with pytest.raises(_native.CorruptShard, match="does not fit 4 tokens"):
            _native.tokens_packed(np.array([0], np.int64), np.array([0, 1], np.int64), [(tokens, offsets, np.array(plan, np.int64))],
                                  4, 5, 0, *outs, cu)
        assert all((out == -7).all() for out in outs)
