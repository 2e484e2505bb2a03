"""The hot path's budget for token sequences: a batch of ``sequences(...)`` costs a handful of Python calls.

Counted the way tests/pipeline/test_calls.py counts a W2 batch (``sys.setprofile`` on
every thread, the Loader's default settings, a whole pass minus a pass resumed
half-way): a count, not a timing, so it holds on any machine and under any load.
``pack="documents"`` adds ``position_ids`` (one more block of the Loader's arena) and the
variable-length ``cu_seqlens`` (one array per batch, handed to the user) to what a
``concat`` batch costs; the bound keeps that from creeping up, whatever the batch size.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import chute
from tests.pipeline.test_calls import calls_of_a_pass

#: Python calls per batch, all threads together, but the channel's ``lock.locked`` polls (below): measured
#: 25.0-25.3 (concat) and 30.0-30.3 (documents), the larger figure at the larger batch (the order's chunks
#: are shared by fewer batches); the budget leaves about one call of room for the autotuner starting a
#: thread mid-pass, and the lowest of up to three measurements is held to it, as for W2. One call of each
#: figure is the clock a worker reads after handing its batch over (the hand-over is busy time, not idle:
#: chute.pipeline.threads); the figures were 23.3-23.7 and 28.3-28.7 before. A documents batch adds to a
#: concat one: ``torch.from_numpy`` and a free-list ``pop`` for the position_ids block, ``np.empty`` and
#: ``torch.from_numpy`` for cu_seqlens, the ``dict.update`` that puts it into the batch.
BUDGET = {"concat": 26, "documents": 31}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """4,000 documents of 1 to 150 tokens (uint16), in several shards."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 151, 4000)
    docs = [rng.integers(0, 1000, n).astype(np.uint16) for n in lengths]
    return chute.tokens.write(docs, tmp_path_factory.mktemp("calls") / "tokens", shard_size="64KB")


def calls_per_batch(make) -> tuple[float, collections.Counter]:
    """Python calls per batch in the steady state: a whole pass minus a pass resumed half-way.

    Leaves out ``lock.locked``: every few batches the loop samples how many batches are ready for the
    autotuner, polling up to the prefetch depth's slots, a number of calls that depends on timing."""
    warm = make()
    for _ in warm:  # chute's modules imported, shards mapped and planned
        pass
    full = make()
    half_way = full.order.state(0, full.order.num_rows // 2)
    _, batches, counts = calls_of_a_pass(full)
    _, batches_half, counts_half = calls_of_a_pass(make(), half_way)
    counts.subtract(counts_half)
    del counts["lock.locked"]
    return sum(counts.values()) / (batches - batches_half), counts


@pytest.mark.parametrize("pack", ["concat", "documents"])
@pytest.mark.parametrize("batch_size", [4, 32])
def test_a_sequence_batch_costs_a_fixed_handful_of_python_calls(corpus, pack, batch_size):
    view = chute.tokens.sequences(corpus, 64, pack=pack)
    assert len(view.shards) > 1 and len(view) // batch_size >= 40
    seen = []
    for _ in range(3):  # the scheduler only adds calls (a thread started, a wait): the lowest count is the path's own
        per_batch, counts = calls_per_batch(lambda: chute.Loader(view, batch_size, shuffle=True, seed=0))
        seen.append(f"{per_batch:.2f} calls per batch; per pass, the most frequent: {counts.most_common(16)}")
        if per_batch <= BUDGET[pack]:
            return
    pytest.fail("\n".join(seen))


def test_a_packed_view_starts_with_a_thread_per_core_like_a_concat_one(tmp_path):
    """Both are one native call per batch with the GIL released (cu_seqlens included): the Loader starts them
    alike, at one worker thread per core, instead of growing a packed view's one thread by probing."""
    ds = chute.tokens.write([list(range(1, 40))] * 50, tmp_path / "ds", vocab_size=100)
    concat = chute.Loader(chute.tokens.sequences(ds, 16), 4)
    packed = chute.Loader(chute.tokens.sequences(ds, 16, pack="documents"), 4)
    assert packed.num_threads == concat.num_threads == min(concat.max_threads, concat.cpu_budget)


def inline_loader(view, batch_size: int) -> chute.Loader:
    """A Loader whose loop builds its batches itself (where the autotuner goes for batches this cheap when the
    loop waits for them; docs/observe.md, rule 7), held there."""
    loader = chute.Loader(view, batch_size, shuffle=True, seed=0)
    policy = loader._meter.tuner.policy
    policy.inline = True
    policy.step = lambda window: []
    return loader


@pytest.mark.parametrize("pack", ["concat", "documents"])
def test_a_sequence_batch_built_in_the_loop_costs_no_more_calls(corpus, pack):
    view = chute.tokens.sequences(corpus, 64, pack=pack)
    per_batch, counts = calls_per_batch(lambda: inline_loader(view, 4))
    assert counts["run.py:first"] > 0 and counts["SimpleQueue.put"] <= 0  # built in the loop, nothing handed out
    assert per_batch <= BUDGET[pack], f"{per_batch:.2f} calls per batch; per pass, the most frequent: {counts.most_common(16)}"
