"""The stage protocol: the README's example runs as written; a user's stage runs wherever it says, inside a Loader
or after it, is measured like chute's own (a row of the report, named as the bottleneck), and resumes exactly.

The live tests of the bottleneck use stages that sleep 20 ms per batch over an idle loop (hundreds of times the
rest of a batch's work: no timing is asserted); the attribution itself is tested from numbers in
tests/observe/test_report.py (test_any_stage_is_read_by_where_it_runs_a_users_as_chutes)."""

from __future__ import annotations

import itertools
import pathlib
import re
import threading
import time

import numpy as np
import pytest
import torch

import chute
from chute.pipeline.chain import plan
from chute.pipeline.transform import Functions
from tests.stages import Running

README = pathlib.Path(__file__).resolve().parents[2] / "chute" / "pipeline" / "README.md"
N, BATCH = 64, 4


def chute_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("chute-")]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    assert chute_threads() == []


def test_the_readme_example_runs():
    text = README.read_text()
    block = re.search(r"<!-- stage example -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, "chute/pipeline/README.md lost its stage example"
    exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme_example"})


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return chute.write(({"x": np.full(2, i, np.int64), "id": i} for i in range(N)), tmp_path_factory.mktemp("stage") / "ds")


def ids(batches):
    return [b["id"].tolist() for b in batches]


STAGE_S = 0.020  # what the slow stages below cost per batch: a sleep, hundreds of times the rest of a batch's work
SMALL = 2  # 32 batches: the loop's wait is far more than a pass's start-up, even on a loaded machine


def test_a_workers_stage_runs_on_the_workers_is_a_row_and_is_named_the_bottleneck(ds):
    threads = set()

    def double(batch):
        threads.add(threading.current_thread().name)
        time.sleep(STAGE_S)
        return {**batch, "x": batch["x"] * 2}

    stage = chute.BatchStage(double, name="double", where="workers")
    loader = chute.Loader(ds, SMALL, shuffle=True, seed=3, stages=[stage], workers=chute.Workers(count=2, prefetch=4))
    batches = list(loader)  # an idle loop: it only takes the batches
    assert all((b["x"][:, 0] == 2 * b["id"]).all() for b in batches)  # its output is in the batch
    assert sorted(sum(ids(batches), [])) == list(range(N))
    assert threads and all(name.startswith("chute-loader") for name in threads)  # on the workers
    report = loader.report()
    assert list(report.stages)[:3] == ["order", "read", "double"]
    row = report.stages["double"]
    assert row.busy_s >= STAGE_S * len(batches) and row.items == N and row.workers == 2
    assert report.bottleneck_stage == "double", report.bottleneck_cause
    assert report.bottleneck_cause.startswith("stage 'double' takes ")
    assert "double" in str(report)


def test_a_loop_stage_and_a_thread_stage_are_rows_and_named_when_they_make_the_loop_wait(ds):
    def slow(batch):
        time.sleep(STAGE_S)
        return batch

    for where in ("loop", "thread"):
        stage = chute.BatchStage(slow, name="slow", where=where)
        loader = chute.Loader(ds, SMALL, stages=[stage], workers=chute.Workers(count=1, prefetch=4))
        assert sorted(sum(ids(loader), [])) == list(range(N))
        report = loader.report()
        assert report.stages["slow"].busy_s >= STAGE_S * (N // SMALL), where
        assert report.bottleneck_stage == "slow", (where, report.bottleneck_cause)
        expect = "runs in the training loop's thread" if where == "loop" else "on its own thread"
        assert expect in report.bottleneck_cause


def test_a_stage_resumes_exactly_and_a_second_for_gives_a_whole_epoch(ds):
    def make():
        return chute.Loader(ds, BATCH, shuffle=True, seed=7, stages=[chute.BatchStage(_plus_one, name="plus_one")])

    loader = make()
    whole = ids(loader)
    assert sorted(sum(whole, [])) == list(range(N)) and len(whole) == N // BATCH
    again = ids(loader)  # the next epoch, whole
    assert sorted(sum(again, [])) == list(range(N)) and again != whole
    partial = make()
    first = ids(itertools.islice(iter(partial), 5))
    state = partial.state_dict()
    assert set(state) >= {"epoch", "consumed", "seed"}  # the root's position: the format of a Loader without stages
    assert state == chute.Loader(ds, BATCH, shuffle=True, seed=7).state() | {"consumed": 5 * BATCH}
    assert ids(partial) == whole  # the pass left early: a second for gives the whole epoch again
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert first + ids(rest) == whole
    assert all((b["x"][:, 0] == b["id"] + 1).all() for b in rest)


def _plus_one(batch):  # module-level: it can go to worker processes
    return {**batch, "x": batch["x"] + 1}


def test_a_workers_stage_runs_in_worker_processes(ds):
    stage = chute.BatchStage(_plus_one, name="plus_one")
    with chute.Loader(ds, BATCH, stages=[stage], workers=chute.Workers("processes", count=2)) as loader:
        batches = list(loader)
        report = loader.report()
    assert all((b["x"][:, 0] == b["id"] + 1).all() for b in batches)
    assert report.stages["plus_one"].items == N and report.stages["plus_one"].busy_s > 0
    with pytest.raises(chute.ChuteError, match="cannot send the stage 'anon' to the worker processes"):
        chute.Loader(ds, BATCH, stages=[chute.BatchStage(lambda b: b, name="anon")], workers="processes")


def test_a_stateful_stage_in_the_loop_keeps_its_state_across_a_resume(ds):
    loader = chute.Loader(ds, BATCH, shuffle=True, seed=2, stages=[Running()])
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state["count"] == 3 * BATCH and state["source"]["consumed"] == 3 * BATCH
    resumed = chute.Loader(ds, BATCH, shuffle=True, seed=2, stages=[Running()])
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [b["seen"] for b in first + rest] == [BATCH * (i + 1) for i in range(N // BATCH)]
    assert sorted(sum(ids(first + rest), [])) == list(range(N))
    assert [b["seen"] for b in resumed][0] == BATCH  # the next pass starts the stage afresh


class Halves(chute.Stage):
    """A stage of one's own in the loop that splits each batch in two (micro-batches), and says so."""

    name = "halves"

    def __init__(self):
        self.pending = []

    def reset(self, state=None):
        super().reset(state)
        self.source.reset(None if state is None else state["source"])
        self.pending = []

    def next(self):
        if not self.pending:
            batch = self.source.next()
            half = len(batch["id"]) // 2
            self.pending = [{k: v[:half] for k, v in batch.items()}, {k: v[half:] for k, v in batch.items()}]
        return self.pending.pop(0)

    def state(self):
        return {"source": self.source.state()}

    def length(self, batches):
        return 2 * batches


def test_len_counts_the_batches_a_stage_in_the_loop_hands_on_or_names_the_stage_that_cannot_say(ds):
    halves = chute.Loader(ds, BATCH, stages=[chute.BatchStage(_plus_one, name="plus", where="loop"), Halves()])
    assert len(halves) == 2 * N // BATCH
    it = iter(halves)
    first = next(it)
    assert len(halves) == 2 * N // BATCH and len(first["id"]) == BATCH // 2  # the pass running: the same
    assert len([first, *it]) == len(halves)
    same = chute.Loader(ds, BATCH, stages=[chute.BatchStage(_plus_one, name="plus", where="thread")])
    assert len(same) == len(list(same)) == N // BATCH  # a function of a batch: one out per batch in
    running = chute.Loader(ds, BATCH, stages=[Running()])
    with pytest.raises(TypeError, match=r"len\(\) is not known through stage 'running' \(Running\).*define length\(self, batches\)"):
        len(running)
    assert len(list(running)) == N // BATCH  # list() still takes the whole pass (a TypeError from len is no length)
    running.close()
    halves.close()
    same.close()


def test_an_error_in_a_stage_is_raised_at_its_batch_naming_the_stage(ds):
    def fail_on_3(batch):
        if 3 in batch["id"].tolist():
            raise KeyError("three")
        return batch

    for where in ("workers", "thread", "loop"):
        got = []
        with chute.Loader(ds, BATCH, stages=[chute.BatchStage(fail_on_3, name="picky", where=where)], workers=1) as loader, \
                pytest.raises((KeyError, chute.ChuteError)) as info:
            for batch in loader:
                got.append(batch["id"].tolist())
        assert got == [], where  # the first batch (ids 0..3) fails, at its step
        if where == "workers":
            assert "stage 'picky' failed on a batch of 4 samples starting with sample 0" in str(info.value)
        if where == "thread":
            assert "stage 'picky' failed on batch 0 (4 samples): KeyError" in str(info.value)
        if where != "loop":  # (in the loop the stage's own exception reaches the loop as it is)
            assert isinstance(info.value, chute.ChuteError) and isinstance(info.value.__cause__, KeyError)


def test_stages_go_from_the_workers_to_threads_to_the_loop():
    fns = Functions()
    with pytest.raises(ValueError, match="stage 'w' runs where='workers' but comes after 'l'"):
        plan(fns, [chute.BatchStage(lambda b: b, name="l", where="loop"), chute.BatchStage(lambda b: b, name="w")], device=False)
    with pytest.raises(ValueError, match="two stages are named 'a'"):
        plan(fns, [chute.BatchStage(lambda b: b, name="a"), chute.BatchStage(lambda b: b, name="a")], device=False)
    with pytest.raises(ValueError, match="the name of one of chute's own"):
        plan(fns, [chute.BatchStage(lambda b: b, name="read")], device=False)
    with pytest.raises(ValueError, match="keeps state of its own"):
        running = Running()
        running.where = "workers"
        plan(fns, [running], device=False)
    with pytest.raises(TypeError, match="wrap a function of a batch as chute.BatchStage"):
        plan(fns, [lambda b: b], device=False)
    chain = plan(Functions(batch_transform=lambda b: b), [chute.BatchStage(lambda b: b, name="t", where="thread")], device=True)
    assert chain.names() == ["order", "read", "batch_transform", "t", "device"]


def test_a_gil_free_stage_starts_the_autotuner_at_one_thread_per_cpu(ds):
    free = chute.Loader(ds, BATCH, stages=[chute.BatchStage(_plus_one, name="native", gil=False)])
    held = chute.Loader(ds, BATCH, stages=[chute.BatchStage(_plus_one, name="python")])
    assert free.num_threads == min(free.cpu_budget, free.max_threads) and held.num_threads == 1


def test_a_stage_after_the_loader_pulls_in_the_callers_thread_and_closes_the_pass(ds):
    seen = []

    def mark(batch):
        seen.append(threading.current_thread() is threading.main_thread())
        return batch

    loader = chute.Loader(ds, BATCH, shuffle=True, seed=1)
    with chute.BatchStage(mark, name="mark", where="loop", source=loader) as stages:
        assert ids(stages) == ids(chute.Loader(ds, BATCH, shuffle=True, seed=1))
        assert all(seen)
        next(iter(stages))  # a new pass, left open ...
    assert chute_threads() == []  # ... and closed with the stage


def test_a_trace_has_a_span_per_stage_per_batch(ds, tmp_path):
    loader = chute.Loader(ds, BATCH, device="cpu", stages=[
        chute.BatchStage(_plus_one, name="plus_one"), chute.BatchStage(lambda b: b, name="after", where="loop"),
    ])
    list(loader)
    names = {span[0] for span in loader.counters.trace_events()}
    assert names >= {"read", "plus_one", "device", "after", "wait", "compute"}


def test_the_watchdog_names_a_stuck_stage(ds):
    release = threading.Event()

    def stuck(batch):
        if 12 in batch["id"].tolist():
            release.wait(60)
        return batch

    for where in ("workers", "thread"):
        release.clear()
        loader = chute.Loader(ds, BATCH, stages=[chute.BatchStage(stuck, name="stuck", where=where)],
                              workers=chute.Workers(count=1, prefetch=2), watchdog=chute.Watchdog(1.0, on_stall="raise"))
        try:
            with pytest.raises(chute.StallError) as info:
                list(loader)
        finally:
            release.set()
            loader.close()  # (the exception's traceback holds it; its threads are kept across passes until then)
        assert "in stage 'stuck'" in str(info.value), where
        for thread in [t for t in threading.enumerate() if t.name.startswith("chute-")]:
            thread.join(10)


def _devices_seen(ds, device):
    seen = {}

    def record(where):
        def fn(batch):
            seen[where] = batch["x"].device.type
            return batch
        return chute.BatchStage(fn, name=f"on_{where}", where=where)

    loader = chute.Loader(ds, BATCH, device=device, stages=[record("workers"), record("thread"), record("loop")])
    for batch in loader:
        assert batch["x"].device.type == torch.device(device).type
    return seen


def test_stages_before_the_device_copy_see_host_tensors_and_those_in_the_loop_device_ones(ds):
    assert _devices_seen(ds, "cpu") == {"workers": "cpu", "thread": "cpu", "loop": "cpu"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_loop_stages_see_the_batch_on_the_device(ds):
    assert _devices_seen(ds, "cuda") == {"workers": "cpu", "thread": "cpu", "loop": "cuda"}


def test_the_deprecated_map_and_loader_stage_still_work_with_a_warning(ds):
    import chute.pipeline.stage as stage_module

    with pytest.warns(FutureWarning, match=r"chute.pipeline.stage.Map is deprecated since chute 0.1 and will be removed in chute 0.2; use chute.BatchStage"):
        Map = stage_module.Map
    with pytest.warns(FutureWarning, match="LoaderStage is deprecated"):
        LoaderStage = stage_module.LoaderStage
    expected = ids(chute.Loader(ds, BATCH, shuffle=True, seed=5))
    with Map(LoaderStage(chute.Loader(ds, BATCH, shuffle=True, seed=5)), lambda b: b, threads=3) as stages:
        got = [next(stages)["id"].tolist() for _ in range(5)]
        saved = stages.state()
    assert got == expected[:5]
    with Map(LoaderStage(chute.Loader(ds, BATCH, shuffle=True, seed=5)), lambda b: b, threads=2) as stages:
        stages.reset(saved)
        assert ids(stages) == expected[5:]  # batches computed ahead were not skipped
