"""The autotuner: the policy on synthetic windows, then live against stages of known cost."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import chute
from chute.observe.autotune import Policy, Window

# ---------------------------------------------------------------- the policy, fed numbers


def data_bound(rate: float = 1000.0, busy: float = 0.95, wait: float = 0.5, min_ready: int | None = 0, batch_bytes: float = 1e6) -> Window:
    """A 1 s window where the loop waited ``wait`` of its time and the workers were ``busy``."""
    return Window(
        seconds=1.0, wait_s=wait, compute_s=1.0 - wait, batches=int(rate / 10), samples=int(rate),
        busy_s=busy, idle_s=1.0 - busy, min_ready=min_ready, batch_bytes=batch_bytes,
    )


def test_adds_threads_while_the_loop_waits_and_stops_at_the_cpu_budget():
    policy = Policy(1, 2, max_threads=3)
    rate = 100.0
    for _ in range(10):
        policy.step(data_bound(rate))
        rate *= 1.5  # every thread helps
        assert policy.threads <= 3
    assert policy.threads == 3
    assert policy.depth == 6  # 2 per thread
    notes = policy.step(data_bound(rate))  # still waiting: said once why it does not add more
    assert policy.threads == 3
    assert notes == [] or "CPU budget" in notes[0][1]


def test_a_thread_is_added_and_judged_after_two_windows_at_the_same_settings():
    policy = Policy(1, 2, max_threads=8)
    assert policy.step(data_bound(900)) == []  # one window is not enough to know the rate
    changes = policy.step(data_bound(1000))
    assert changes[0][0] == "threads 1 -> 2"
    assert policy.step(data_bound(500)) == []  # the window disturbed by the change is not judged alone
    changes = policy.step(data_bound(1010))  # the best of the two: +1% over the best before (the GIL, say)
    assert changes[0][0] == "threads 2 -> 1"
    assert "did not help: 1,000 -> 1,010 samples/s" in changes[0][1]
    assert (policy.threads, policy.depth, policy.ceiling) == (1, 2, 1)
    for _ in range(5):
        policy.step(data_bound(1000))
    assert policy.threads == 1


def test_a_thread_that_ends_the_waiting_stays_even_without_much_gain():
    policy = Policy(3, 6, max_threads=8)
    policy.step(data_bound(1000))
    policy.step(data_bound(1000))
    assert policy.threads == 4
    policy.step(data_bound(1030, wait=0.01))  # +3%, but the loop no longer waits: the consumer sets the pace now
    policy.step(data_bound(1030, wait=0.01))
    assert policy.threads == 4


def test_the_first_window_of_a_pass_is_not_a_baseline():
    policy = Policy(1, 2, max_threads=8)
    policy.new_pass()
    assert policy.step(data_bound(300)) == []  # start-up of the new threads: not used
    changes = policy.step(data_bound(1000))
    assert changes[0][0] == "threads 1 -> 2"
    policy.step(data_bound(1040))
    policy.step(data_bound(1040))  # +4% over 1,000 (not over the 300 of the start-up window): not enough
    assert policy.threads == 1


def test_memory_budget_bounds_depth_and_threads():
    policy = Policy(1, 2, max_threads=16, max_bytes=350_000_000)
    rate = 100.0
    for _ in range(10):
        policy.step(data_bound(rate, batch_bytes=100e6))
        rate *= 1.5
        assert policy.depth <= 3 and policy.threads <= 3  # 3 batches of 100 MB fit; a thread needs one in flight
    assert policy.threads == 3 and policy.depth == 3


def test_a_depth_over_the_memory_budget_is_cut_at_once():
    policy = Policy(2, 8, max_threads=2, max_bytes=50_000_000)
    changes = policy.step(data_bound(1000, wait=0.0, batch_bytes=20e6))
    assert policy.depth == 2
    assert changes[0][0] == "prefetch 8 -> 2" and "memory budget of 50.0 MB" in changes[0][1]


def test_depth_grows_when_workers_idle_while_the_loop_waits_and_shrinks_when_it_never_drains():
    policy = Policy(2, 4, max_threads=2)
    policy.step(data_bound(busy=0.5, wait=0.3, min_ready=0))
    assert policy.depth == 6
    policy.step(data_bound(busy=0.5, wait=0.3, min_ready=0))
    assert policy.depth == 9
    for _ in range(4):  # the loop no longer waits, 5 batches always ready: but 9 was needed to stop the waiting
        policy.step(data_bound(busy=0.5, wait=0.0, min_ready=5))
    assert policy.depth == 9  # never below the depth that fixed a wait


def test_an_overprovisioned_depth_shrinks_to_threads_plus_one():
    policy = Policy(2, 8, max_threads=2)
    for _ in range(20):
        policy.step(data_bound(busy=0.3, wait=0.0, min_ready=6))
    assert policy.depth == 3


def test_hand_set_values_are_never_changed():
    policy = Policy(2, 3, max_threads=8, tune_threads=False, tune_depth=False)
    for _ in range(5):
        assert policy.step(data_bound()) == []
        assert policy.step(data_bound(busy=0.3, min_ready=0)) == []
    assert (policy.threads, policy.depth) == (2, 3)


def test_nothing_changes_when_the_loop_does_not_wait():
    policy = Policy(1, 2, max_threads=8)
    for _ in range(5):
        assert policy.step(data_bound(wait=0.01, min_ready=1)) == []
    assert (policy.threads, policy.depth) == (1, 2)


# ---------------------------------------------------------------- live, against stages of known cost

BATCH = 8
SAMPLE_S = 0.002  # the transform's cost per sample (a sleep: releases the GIL, like a decoder)
STEP_S = 0.005  # the training step


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("autotune") / "ds"
    return chute.write(({"x": np.full(4, i, np.float32), "id": i} for i in range(2400)), path, shard_size=20_000)


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith("chute-loader")] == []


def decode(sample):
    time.sleep(SAMPLE_S)
    return sample


def live_threads() -> int:
    return len([t for t in threading.enumerate() if t.name.startswith("chute-loader")])


def test_converges_to_the_thread_count_computed_by_hand(ds, caplog):
    # A batch costs one thread 8 x 2 ms = 16 ms; the loop takes one every 5 ms: ceil(16 / 5) = 4 threads.
    expected = -(-BATCH * SAMPLE_S // STEP_S)
    loader = chute.Loader(ds, BATCH, transform=decode, workers=chute.Workers(max_count=8))
    with caplog.at_level(logging.INFO, logger="chute"):
        for _ in loader:
            time.sleep(STEP_S)
            assert live_threads() <= 8 + 1  # the budget (+ a retired thread finishing its last batch)
    report = loader.report()
    threads = report.settings["num_threads"]
    assert abs(threads - expected) <= 1, report
    assert report.settings["autotune"] is True
    assert report.decisions and report.decisions[0].change == "threads 1 -> 2"
    assert "the loop waited" in report.decisions[0].reason
    assert any("autotune: threads 1 -> 2" in r.getMessage() for r in caplog.records)
    # the next pass starts where the tuner got to and hardly waits
    for _ in loader:
        time.sleep(STEP_S)
    assert loader.report().wait_fraction < 0.15
    assert loader.num_threads == threads


def test_never_exceeds_its_thread_and_memory_budgets(ds):
    row_bytes = 4 * 4 + 8  # float32[4] + int64 id
    budget = 3 * BATCH * row_bytes  # three batches in flight
    loader = chute.Loader(ds, BATCH, transform=decode, workers=chute.Workers(max_count=2, max_prefetch_bytes=budget))
    worst_threads = worst_in_flight = 0
    for i, _ in enumerate(loader):
        run = loader._pass
        worst_threads = max(worst_threads, run.executor.threads, live_threads())
        worst_in_flight = max(worst_in_flight, run.in_flight)
        if i == 150:
            break
    del _
    report = loader.report()
    assert worst_threads <= 2
    assert report.settings["num_threads"] == 2  # the loop waits: it used the whole CPU budget
    assert worst_in_flight <= 3
    assert report.settings["prefetch"] <= 3
    assert any("CPU budget of 2" in d.reason for d in report.decisions)
