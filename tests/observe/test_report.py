"""The stall report: the wait share, which stage and why, the what-if line, JSON, and chute.observe()."""

from __future__ import annotations

import json
import re
import threading
import time
import types

import numpy as np
import pytest
import torch

import chute
from chute.observe.autotune import Decision, Step
from chute.observe.counters import ConsumerTotals, Snapshot, StageTotals
from chute.observe.report import UNKNOWN_STAGE, Context, build, cache_window

N = 400
BATCH = 8
KEYS = {
    "wait_fraction", "batches", "samples", "elapsed_s", "bottleneck", "stages", "cache", "skipped",
    "settings", "decisions", "what_if",
}
STAGE_KEYS = {"busy_s", "items", "bytes", "throughput_per_s", "utilisation", "wait_in_s", "wait_out_s", "workers"}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "ds"
    return chute.write(({"x": np.full(4, i, np.float32), "id": i} for i in range(N)), path, shard_size=8_000)


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith(("chute-loader", "chute-device"))] == []


def slow_sample(sample):
    time.sleep(0.002)  # releases the GIL, like a decoder
    return sample


def slow_collate(samples):
    time.sleep(0.01)
    return torch.utils.data.default_collate(samples)


def test_a_slow_transform_is_named_with_a_what_if(ds):
    loader = chute.Loader(ds, BATCH, transform=slow_sample, workers=chute.Workers(count=1, max_count=4))
    for _ in loader:
        pass  # no compute: the loop waits for every batch
    report = loader.report()
    assert report.wait_fraction > 0.8
    assert report.bottleneck_stage == "transform"
    assert "per-sample transform" in report.bottleneck_cause
    assert "the 1 worker thread was busy" in report.bottleneck_cause
    # no projection from a model of threads: with the count set by hand nothing was measured, and it says so
    assert report.what_if == (
        "not measured: the thread count is set by hand (1); leave chute.Workers(count=) unset "
        "and the autotuner measures what thread 2 does"
    )
    data = report.to_json()
    assert data["bottleneck"]["stage"] == "transform"
    assert data["what_if"] == report.what_if
    text = str(report)
    assert "waiting for data:" in text and "bottleneck: transform:" in text and "what if: not measured" in text


def test_a_slow_collate_is_named(ds):
    loader = chute.Loader(ds, BATCH, collate=slow_collate, workers=chute.Workers(count=2, max_count=2))
    list(loader)
    report = loader.report()
    assert report.bottleneck_stage == "transform"
    assert report.bottleneck_cause.startswith("collate takes")
    # the collate sleeps: two busy threads use almost no CPU, so the CPU budget is not what limits them
    assert re.search(r"the process used 0\.\d\d of 2 cores", report.bottleneck_cause), report.bottleneck_cause
    assert report.what_if.startswith("not measured: the thread count is set by hand (2)")


class ControlledClock:
    """``time.perf_counter_ns`` for the loop's measurements, moved only by the test's "training step".

    The loop's wait and compute are wall-clock spans, so any assertion on their
    ratio depends on the machine's load. Under this clock a wait lasts exactly
    what the test says it does (here: nothing, the data is always ready in the
    clock's time) and a step exactly its ``advance``: the report is computed
    from numbers the test chose, end to end through the real pipeline.
    """

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)

    def install(self, monkeypatch, *modules) -> None:
        """Make ``modules`` (which ``import time``) read this clock; everything else in ``time`` is the real one."""
        fake = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
        fake.perf_counter_ns = self
        for module in modules:
            monkeypatch.setattr(module, "time", fake)


STEP_S = 0.02  # the training step, in the controlled clock's time


def test_a_loop_slower_than_its_data_is_not_data_bound(ds, monkeypatch):
    from chute.observe import passes
    from chute.pipeline import run

    clock = ControlledClock()
    clock.install(monkeypatch, run, passes)  # the loop's stream and the pass's window
    loader = chute.Loader(ds, BATCH, workers=chute.Workers(count=1, prefetch=4))
    for _ in loader:
        clock.advance(STEP_S)
    report = loader.report()
    # exactly the controlled times: a clock that stopped controlling the loop would fail here, not flake
    assert report.wait_s == 0.0
    assert report.compute_s == pytest.approx(N // BATCH * STEP_S)
    assert report.wait_fraction == 0.0
    assert report.bottleneck_stage is None
    assert "waited for data only 0% of its time, so its own compute sets the pace" in report.bottleneck_cause
    assert report.what_if is None


def fail_on_multiples_of_7(sample):
    if sample["id"] % 7 == 0:
        raise ValueError("bad sample")
    return sample


def test_to_json_has_every_key_and_counts_skipped_samples(ds):
    loader = chute.Loader(ds, BATCH, transform=fail_on_multiples_of_7, on_error="skip", workers=chute.Workers(count=2, prefetch=4))
    delivered = sum(len(b["id"]) for b in loader)
    data = loader.report().to_json()
    assert KEYS <= set(data)
    json.dumps(data)  # serialisable as is
    skipped = len(range(0, N, 7))
    assert data["skipped"] == skipped and delivered == N - skipped
    assert data["samples"] == N - skipped and data["batches"] == N // BATCH
    assert data["cache"] is None  # a local dataset has no cache
    assert data["settings"] == {
        "num_threads": 2, "prefetch": 4, "inline": False, "autotune": False, "tuned": [], "workers": "threads",
        "max_threads": loader.max_threads, "max_prefetch_bytes": loader.max_prefetch_bytes,
    }
    assert data["decisions"] == []
    for stage in data["stages"].values():
        assert STAGE_KEYS <= set(stage)
    assert 0 <= data["wait_fraction"] <= 1


# ---------------------------------------------------------------- attribution from synthetic counters


def window(consumer_wait: float, consumer_compute: float, stages: dict[str, dict], batches: int = 100, samples: int = 800) -> Snapshot:
    ns = 1_000_000_000
    totals = {}
    for name, spec in stages.items():
        spec = dict(spec)
        workers = spec.pop("workers", 1)
        parts = {k: int(v * ns) for k, v in spec.pop("parts", {}).items()}
        totals[name] = StageTotals(
            name, "samples", workers, busy_ns=int(spec.get("busy", 0) * ns), items=spec.get("items", samples),
            nbytes=spec.get("nbytes", 0), wait_in_ns=int(spec.get("wait_in", 0) * ns),
            wait_out_ns=int(spec.get("wait_out", 0) * ns), parts=parts, where=spec.get("where", ""),
        )
    consumer = ConsumerTotals(int(consumer_wait * ns), int(consumer_compute * ns), batches, samples)
    return Snapshot(int((consumer_wait + consumer_compute) * ns), totals, consumer)


def test_downloads_are_blamed_when_readers_wait_for_shards():
    snap = window(6.0, 4.0, {
        "workers": {"busy": 9.0, "wait_out": 0.5, "workers": 1, "items": 100},
        "read": {"busy": 2.0, "wait_in": 6.5, "nbytes": 10**9},
        "order": {"busy": 0.1}, "transform": {"busy": 0.2},
        "fetch": {"busy": 9.0, "nbytes": 5 * 10**8, "workers": 4, "items": 10},
    })
    cache = {"hits": 2, "misses": 10, "bytes_downloaded": 5 * 10**8, "shards_downloaded": 10, "evictions": 0, "bytes_cached": 10**9}
    report = build(snap, Context(cache=cache_window(cache, None), cpu_budget=8))
    assert report.bottleneck_stage == "fetch"
    assert "10 cache misses" in report.bottleneck_cause and "6.50 s waiting for shards" in report.bottleneck_cause
    assert report.cache["hit_rate"] == pytest.approx(2 / 12)
    assert "hit rate 17%" in str(report)


def test_device_copy_is_blamed_when_the_copier_is_saturated():
    snap = window(5.0, 5.0, {
        "workers": {"busy": 3.0, "wait_out": 7.0, "workers": 1, "items": 100},
        "read": {"busy": 2.5}, "order": {"busy": 0.1}, "transform": {"busy": 0.3},
        "device": {"busy": 9.5, "wait_in": 0.2, "wait_out": 0.3, "nbytes": 4 * 10**9},
    })
    report = build(snap, Context(cpu_budget=8))
    assert report.bottleneck_stage == "device"
    assert report.bottleneck_cause.startswith("the host-to-device copy")
    assert report.stages["device"].utilisation == pytest.approx(0.95)


def test_any_stage_is_read_by_where_it_runs_a_users_as_chutes():
    pool = {"workers": {"busy": 9.5, "wait_out": 0.5, "workers": 2, "items": 100}, "order": {"busy": 0.01}, "read": {"busy": 0.5}}
    # on the workers: the busiest stage, whatever its name
    report = build(window(8.0, 2.0, {**pool, "double": {"busy": 9.0}}), Context(cpu_budget=2))
    assert report.bottleneck_stage == "double" and report.bottleneck_cause.startswith("stage 'double' takes 90.00 ms per batch")
    assert list(report.stages) == ["order", "read", "double"]
    # in the loop: named when the loop's own stages take most of its wait (no worker can help)
    report = build(window(8.0, 2.0, {**pool, "resize": {"busy": 6.0, "where": "loop", "items": 100}}), Context(cpu_budget=2))
    assert report.bottleneck_stage == "resize" and "runs in the training loop's thread" in report.bottleneck_cause
    assert report.stages["resize"].workers == 1 and report.stages["resize"].utilisation == pytest.approx(0.6)
    # on a thread of its own: named when that thread is saturated and busier than the pool
    idle_pool = {**pool, "workers": {"busy": 2.0, "wait_out": 8.0, "workers": 2, "items": 100}}
    report = build(window(8.0, 2.0, {**idle_pool, "tokenize": {"busy": 9.5, "wait_in": 0.3, "wait_out": 0.2, "where": "thread"}}), Context(cpu_budget=2))
    assert report.bottleneck_stage == "tokenize" and "on its own thread" in report.bottleneck_cause


def test_read_is_blamed_and_the_what_if_quotes_the_last_measured_step():
    snap = window(8.0, 2.0, {
        "workers": {"busy": 9.8, "wait_out": 0.2, "workers": 1, "items": 100},
        "read": {"busy": 8.0}, "order": {"busy": 0.5}, "transform": {"busy": 0.1},
    })
    steps = (
        Step("threads 1 -> 2", 80.0, 82.0, 0.8, 0.8, kept=False),  # measured: a second thread did not help
        Step("prefetch 8 -> 12", 80.0, 120.0, 0.8, 0.6, kept=True),  # not about threads: not quoted here
    )
    settings = {"num_threads": 1, "prefetch": 12, "autotune": True, "tuned": ["threads", "prefetch"], "max_threads": 16}
    report = build(snap, Context(cpu_budget=4, cpu_s=9.0, steps=steps, settings=settings))
    assert report.bottleneck_stage == "read"
    assert report.bottleneck_cause.startswith("gathering rows from the shards takes 80.00 ms per batch")
    assert report.what_if == (
        "measured: threads 1 -> 2 took samples/s from 80 to 82 (+2%) and the loop's wait from 80% to 80%: undone"
    )


def test_a_wait_that_is_mostly_start_up_is_not_blamed_on_read():
    snap = window(3.0, 1.0, {
        "workers": {"busy": 1.0, "wait_out": 0.2, "workers": 2, "items": 100},
        "read": {"busy": 0.9}, "order": {"busy": 0.05},
    })
    report = build(snap, Context(cpu_budget=4, first_batch_s=2.5, workers_kind="processes"))
    assert report.bottleneck_stage is None
    assert report.bottleneck_cause.startswith("start-up: the loop waited 75% of its time, 2.50 s of it for the first batch")
    assert "worker processes starting" in report.bottleneck_cause


def test_gil_bound_threads_are_called_out_without_a_what_if():
    snap = window(8.0, 2.0, {
        "workers": {"busy": 19.0, "wait_out": 1.0, "workers": 2, "items": 100},
        "read": {"busy": 1.0}, "order": {"busy": 0.1},
        "transform": {"busy": 17.0, "workers": 2, "parts": {"per_sample": 16.0, "collate": 1.0}},
    })
    report = build(snap, Context(cpu_budget=8, cpu_s=10.0))  # 1.0 core for 2 busy threads
    assert report.bottleneck_stage == "transform"
    assert "holds the GIL" in report.bottleneck_cause and "workers='processes'" in report.bottleneck_cause
    assert report.what_if is None  # nothing measured


def test_decisions_and_settings_appear_in_text_and_json():
    snap = window(0.1, 9.9, {"workers": {"busy": 1.0, "wait_out": 9.0, "workers": 3, "items": 100}, "read": {"busy": 1.0}})
    decisions = (Decision(1.5, "threads 2 -> 3", "the loop waited 40% of its time"),)
    settings = {"num_threads": 3, "prefetch": 6, "autotune": True}
    report = build(snap, Context(settings=settings, decisions=decisions))
    data = report.to_json()
    assert data["decisions"] == [{"time_s": 1.5, "change": "threads 2 -> 3", "reason": "the loop waited 40% of its time"}]
    assert data["settings"]["autotune"] is True
    assert data["bottleneck"]["stage"] is None
    text = str(report)
    assert "threads 3, prefetch 6 (autotuned)" in text and "threads 2 -> 3: the loop waited 40%" in text


def test_cache_window_differences_counters_and_keeps_levels():
    start = {"hits": 5, "misses": 5, "bytes_downloaded": 100, "shards_downloaded": 1, "evictions": 0, "bytes_cached": 100}
    now = {"hits": 14, "misses": 6, "bytes_downloaded": 300, "shards_downloaded": 2, "evictions": 1, "bytes_cached": 250}
    out = cache_window(now, start)
    assert out == {"hits": 9, "misses": 1, "bytes_downloaded": 200, "shards_downloaded": 1, "evictions": 1,
                   "bytes_cached": 250, "hit_rate": 0.9}
    assert cache_window(None, start) is None


# ---------------------------------------------------------------- chute.observe around other iterables


def slow_source(n: int, delay: float):
    for i in range(n):
        time.sleep(delay)
        yield {"x": torch.zeros(4, 3), "i": i}


def test_observe_measures_a_data_bound_generator():
    observed = chute.observe(slow_source(20, 0.01))
    items = [b["i"] for b in observed]
    assert items == list(range(20))
    report = observed.report()
    assert (report.batches, report.samples) == (20, 80)
    assert report.wait_fraction > 0.9 and report.wait_s >= 0.2
    assert report.stages == {}
    assert report.bottleneck_stage is None and report.bottleneck_cause == UNKNOWN_STAGE
    data = report.to_json()
    assert KEYS <= set(data) and data["stages"] == {} and data["cache"] is None and data["decisions"] == []
    assert data["bottleneck"] == {"stage": None, "cause": UNKNOWN_STAGE}


class TimedLoader:
    """A torch DataLoader whose every batch takes ``wait_s`` of the controlled clock to arrive."""

    def __init__(self, loader, clock: ControlledClock, wait_s: float) -> None:
        self.loader, self.clock, self.wait_s = loader, clock, wait_s
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.clock.advance(self.wait_s)
            yield batch


def test_observe_around_a_torch_dataloader_with_compute(monkeypatch):
    from chute.observe import consumer

    clock = ControlledClock()
    clock.install(monkeypatch, consumer)
    dataset = torch.utils.data.TensorDataset(torch.arange(96.0).reshape(48, 2), torch.arange(48))
    observed = chute.observe(TimedLoader(torch.utils.data.DataLoader(dataset, batch_size=16), clock, 0.001))
    assert len(observed) == 3 and observed.dataset is dataset
    for _ in range(2):
        for x, y in observed:
            clock.advance(STEP_S)  # the "training step"
    report = observed.report()
    assert (report.batches, report.samples) == (3, 48)  # the last pass
    assert report.wait_s == pytest.approx(0.003) and report.compute_s == pytest.approx(3 * STEP_S)
    assert report.wait_fraction == pytest.approx(0.001 / (0.001 + STEP_S))  # 4.8%
    assert "waited for data only 5% of its time, so its own compute sets the pace" in report.bottleneck_cause
    whole = observed.report(whole=True)
    assert (whole.batches, whole.wait_s, whole.compute_s) == (6, pytest.approx(0.006), pytest.approx(6 * STEP_S))


def test_a_remote_dataset_waiting_on_downloads_is_blamed_on_fetch(tmp_path):
    from tests.servers import FaultyHTTPServer

    local = chute.write(({"x": np.full(64, i, np.float32), "id": i} for i in range(2000)), tmp_path / "ds", shard_size=60_000)
    with FaultyHTTPServer(tmp_path) as server:
        server.throttle(503, times=2, retry_after=1, pattern=r"shard")  # two shards arrive a second late
        remote = chute.open(server.url + "ds", cache_dir=tmp_path / "cache")
        loader = chute.Loader(remote, 50, shuffle=True, workers=2)
        assert sum(len(b["id"]) for b in loader) == 2000
        report = loader.report()
    assert report.bottleneck_stage == "fetch"
    assert f"({len(local.shards)} cache misses)" in report.bottleneck_cause
    read = report.stages["read"]
    assert read.wait_in_s > 0 and read.items == 2000  # the readers waited for shards (counted, not compared with
    # their busy time: on a loaded machine reading 2000 small rows can take as long as a late shard)
    cache = report.to_json()["cache"]
    assert cache["misses"] == cache["shards_downloaded"] == len(local.shards) and cache["hits"] == 0
    assert cache["bytes_downloaded"] == sum(s.bytes for s in local.shards)
    assert "hit rate 0%" in str(report)
