"""Inline passes: the loop builds its batches itself, and they are the very batches the worker threads build.

The autotuner may have the training loop build each batch in its own
``next()`` when a batch's work costs less than handing it to a worker thread
and back (``chute.observe.autotune``, ``INLINE_S``; its rule is tested there
with numbers). Here the setting is forced (the policy's ``inline`` before a
pass, the pass's executor's ``inline`` during one) and the outcomes are held:
the same batches in the same order as the threads deliver, across passes,
switched either way in the middle of a pass, a pass broken off and resumed,
``state_dict``/``load_state_dict`` mid-pass, a failing batch's error, and no
thread left once the Loader is closed. Counts and events only: no timing.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import chute
from chute.pipeline.transform import TransformError

N, BATCH = 200, 8


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    # (a variable-size column: a gather-only pass of fixed-size columns runs on native threads, never inline,
    # chute.pipeline.native_gather)
    samples = ({"x": np.full(4, i, np.int32), "id": i, "tag": f"t{i}"} for i in range(N))
    return chute.write(samples, tmp_path_factory.mktemp("inline") / "ds", shard_size=1500)  # a few shards


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 60_000, int(n)).astype(np.uint16) for n in rng.integers(1, 300, 200)]
    return chute.tokens.write(documents, tmp_path_factory.mktemp("inline") / "tokens", vocab_size=60_000, shard_size="16KB")


pytestmark = pytest.mark.usefixtures("no_loader_threads_left")


def make(ds, inline: bool, **kwargs) -> chute.Loader:
    loader = chute.Loader(ds, BATCH, shuffle=True, seed=5, **kwargs)
    policy = loader._meter.tuner.policy
    policy.inline = inline  # where the autotuner would have got to
    policy.step = lambda window: []  # and it stays there (a loaded machine's windows could move it)
    return loader


def ids(batch) -> list[int]:
    return batch["id"].tolist()


def reference(ds, epochs: int = 2) -> list[list[list[int]]]:
    """The batches of the first ``epochs`` epochs, built by two worker threads (the setting fixed: not tuned)."""
    with chute.Loader(ds, BATCH, shuffle=True, seed=5, workers=chute.Workers(count=2)) as loader:
        return [[ids(b) for b in loader] for _ in range(epochs)]


def test_an_inline_pass_builds_its_batches_in_the_loop_and_they_are_the_threads_batches(ds):
    want = reference(ds)
    with make(ds, inline=True) as loader:
        got = [[ids(b) for b in loader] for _ in range(2)]  # two passes: two epochs
        assert got == want
        assert loader._pass.executor.inline and loader.counters.snapshot().stages["workers"].items == 0  # no worker built one
        report = loader.report()
        assert report.settings["inline"] is True and "; batches built in the loop (inline)" in str(report)
        assert report.bottleneck_stage is None or "building the batches itself (inline" in str(report)


def test_switching_in_the_middle_of_a_pass_either_way_keeps_every_batch_in_order(ds):
    want = reference(ds, epochs=1)[0]
    # 2 batches in flight (set by hand: no autotuner to switch back), so that each switch has steps on both sides
    with chute.Loader(ds, BATCH, shuffle=True, seed=5, workers=chute.Workers(count=2, prefetch=2)) as loader:
        got = []
        for k, batch in enumerate(loader):
            got.append(ids(batch))
            if k in (3, 11):  # to inline: the steps already submitted come from the workers first
                loader._pass.executor.inline = True
            elif k in (7, 17):  # back to the threads: the next steps are submitted again
                loader._pass.executor.inline = False
        assert got == want
        assert threading.get_ident() in loader._pass.task.threads and len(loader._pass.task.threads) > 1


def test_batches_taken_from_the_workers_are_let_go_once_the_loop_builds_its_own(ds):
    """The channel keeps the batches the loop took until a worker's next put (their memory is freed on a worker's
    thread); once the loop builds the batches itself no put comes: they are let go of when it starts."""
    import gc
    import weakref

    with chute.Loader(ds, BATCH, shuffle=True, seed=5, workers=chute.Workers(count=2, prefetch=2)) as loader:
        taken = []
        for k, batch in enumerate(loader):
            if k < 4:
                taken.append(weakref.ref(batch["x"]))
            if k == 3:
                loader._pass.executor.inline = True  # steps 4 and 5 still come from the workers, then the loop builds
            if k == 8:
                del batch
                gc.collect()
                assert [ref() for ref in taken] == [None] * 4  # nothing of the threads' batches is held any more
                break


def test_a_pass_broken_off_inline_restarts_where_it_started_and_resumes_from_a_state(ds):
    want = reference(ds)
    with make(ds, inline=True) as loader:
        it = iter(loader)
        head = [ids(next(it)) for _ in range(5)]
        saved = loader.state_dict()  # after 5 batches
        del it  # broken off: the next iter() starts the same epoch again
        assert head == want[0][:5]
        assert [ids(b) for b in loader] == want[0]
        assert [ids(b) for b in loader] == want[1]
    with make(ds, inline=True) as resumed:
        resumed.load_state_dict(saved)
        assert [ids(b) for b in resumed] == want[0][5:]
    with make(ds, inline=False) as threads:  # the state of an inline pass resumes with the threads too
        threads.load_state_dict(saved)
        assert [ids(b) for b in threads] == want[0][5:]


def test_token_sequences_inline_are_the_threads_sequences(tokens):
    view = chute.tokens.sequences(tokens, 16)
    with chute.Loader(view, BATCH, shuffle=True, seed=5, workers=chute.Workers(count=2)) as threads:
        want = [(b["input_ids"].clone(), b["labels"].clone()) for b in threads]
    with make(view, inline=True) as loader:
        loader_batches = [(b["input_ids"].clone(), b["labels"].clone()) for b in loader]
    assert len(loader_batches) == len(want) == -(-len(view) // BATCH)
    for (a, b), (c, d) in zip(loader_batches, want):
        assert a.equal(c) and b.equal(d)


def broken(sample):
    if sample["id"] == 77:
        raise ValueError("no 77")
    return sample


def test_a_batch_that_fails_inline_raises_the_error_the_threads_raise(ds):
    errors = []
    for inline in (False, True):
        with make(ds, inline=inline, transform=broken) as loader:
            with pytest.raises(TransformError) as raised:
                for _ in loader:
                    pass
            errors.append(str(raised.value))
    assert errors[0] == errors[1] and "no 77" in errors[0]


def test_a_pass_with_a_stage_on_a_thread_of_its_own_is_never_inline(ds):
    stage = chute.BatchStage(lambda batch: batch, name="own", where="thread")
    with make(ds, inline=True, stages=[stage]) as loader:
        got = [ids(b) for b in loader]
        assert not loader._pass.executor.can_inline and not loader._pass.executor.inline
    assert got == reference(ds, epochs=1)[0]


def test_samples_skipped_inline_are_the_samples_the_threads_skip(ds):
    got = []
    for inline in (False, True):
        with make(ds, inline=inline, transform=broken, on_error="skip") as loader:
            got.append(([ids(b) for b in loader], loader.report().skipped))
    assert got[0] == got[1] and got[1][1] == 1 and 77 not in sum(got[1][0], [])


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chute-watchdog-inline"]


def test_a_batch_the_loop_builds_itself_past_the_watchdog_timeout_is_reported(ds, capfd):
    """The loop cannot time out its own work: a thread of the pass reports a build that lasts (the hang watchdog)."""
    seen: list[str] = []
    watched: list[bool] = []

    def stuck_on_37(sample):
        if sample["id"] == 37:  # held until the report is out (a deadline only so that a failure cannot hang the suite)
            watched.append(bool(watch_threads()))
            deadline = threading.Event()
            for _ in range(3000):
                seen.append(capfd.readouterr().err)
                if "building step" in "".join(seen) or deadline.wait(0.01):
                    break
        return sample

    step = next(i for i, b in enumerate(reference(ds, epochs=1)[0]) if 37 in b)
    with make(ds, inline=True, transform=stuck_on_37, watchdog=chute.Watchdog(0.2)) as loader:
        got = sorted(i for b in loader for i in ids(b))
    assert got == list(range(N))  # the batch came once the transform returned: nothing lost
    assert watched == [True] and not watch_threads()  # the pass's watch ran while it built, and stopped with it
    report = "".join(seen)
    assert f"the training loop, building step {step} itself (an inline pass)" in report
    assert "stuck_on_37" in report  # the loop's stack, where it is stuck


def test_a_loader_whose_watchdog_raises_never_builds_its_batches_itself(ds):
    """A thread cannot raise into a loop stuck in a read: with on_stall="raise" the workers build the batches."""
    with make(ds, inline=True, watchdog=chute.Watchdog(5.0, on_stall="raise")) as loader:
        for _ in loader:
            pass
        assert not loader._pass.executor.inline and loader.counters.snapshot().stages["workers"].items > 0
