"""Tests of the device stage (chute.device).

The CPU tests run everywhere and cover the thread, channel, epoch, error and
shutdown logic (the same code runs on CUDA, minus the copies). The CUDA tests
check the synchronisation itself and are skipped without a GPU.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections import OrderedDict, defaultdict, namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.utils.data import DataLoader, Sampler, TensorDataset

from chute.device import (
    DeviceCopier,
    DevicePrefetcher,
    StagingRing,
    map_tensors,
    to_device,
)
from chute.errors import ChuteError

REPO = Path(__file__).resolve().parents[1]
JOIN = 5.0  # seconds: upper bound for any wait in these tests

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def device_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("chute-device")]


@pytest.fixture(autouse=True)
def bounded_and_no_leaked_threads():
    """Kill the run with stack traces if a test hangs; fail if a thread survives it."""
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    leftover = device_threads()
    for thread in leftover:
        thread.join(JOIN)
    assert not leftover, f"device threads left running: {leftover}"


# --------------------------------------------------------------------------
# Nested batches
# --------------------------------------------------------------------------

Point = namedtuple("Point", ["x", "label"])


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    name: str
    extra: dict


@dataclasses.dataclass(frozen=True)
class FrozenSample:
    image: torch.Tensor
    derived: int = dataclasses.field(init=False, default=7)


def nested_batch() -> dict:
    dd = defaultdict(list)
    dd["t"] = torch.zeros(2)
    return {
        "tensor": torch.arange(4),
        "list": [torch.ones(2), "text", None, 3],
        "tuple": (torch.zeros(3), 1.5),
        "named": Point(torch.full((2,), 5.0), "cat"),
        "data": Sample(torch.ones(2, 2), "a.jpg", {"k": torch.zeros(1)}),
        "frozen": FrozenSample(torch.ones(1)),
        "ordered": OrderedDict([("b", torch.ones(1)), ("a", torch.zeros(1))]),
        "default": dd,
        "string": "hello",
        "bytes": b"raw",
        "none": None,
        "int": 42,
        "array": np.arange(3),
    }


def test_map_tensors_rebuilds_every_nesting_kind_with_its_type():
    batch = nested_batch()
    out = map_tensors(lambda t: t + 1, batch)

    assert type(out) is dict and list(out) == list(batch)
    assert torch.equal(out["tensor"], torch.arange(1, 5))
    assert type(out["list"]) is list
    assert torch.equal(out["list"][0], torch.full((2,), 2.0))
    assert out["list"][1:] == ["text", None, 3]
    assert type(out["tuple"]) is tuple and out["tuple"][1] == 1.5
    assert type(out["named"]) is Point and out["named"].label == "cat"
    assert torch.equal(out["named"].x, torch.full((2,), 6.0))
    assert type(out["data"]) is Sample and out["data"].name == "a.jpg"
    assert torch.equal(out["data"].extra["k"], torch.ones(1))
    assert type(out["frozen"]) is FrozenSample and out["frozen"].derived == 7
    assert torch.equal(out["frozen"].image, torch.full((1,), 2.0))
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["b", "a"]
    assert type(out["default"]) is defaultdict and out["default"].default_factory is list
    for key in ("string", "bytes", "none", "int", "array"):
        assert out[key] is batch[key]
    # The input is left alone.
    assert torch.equal(batch["tensor"], torch.arange(4))
    assert torch.equal(batch["data"].image, torch.ones(2, 2))


def test_map_tensors_keeps_containers_whose_tensors_do_not_change():
    batch = nested_batch()
    assert map_tensors(lambda t: t, batch) is batch
    out = map_tensors(lambda t: t + 1 if t.dtype == torch.int64 else t, batch)
    assert out is not batch
    assert out["list"] is batch["list"] and out["data"] is batch["data"]


leaves = st.one_of(
    st.integers(0, 5).map(lambda n: torch.arange(n)),
    st.text(max_size=3),
    st.none(),
    st.integers(),
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), children, max_size=3),
        st.tuples(children, children).map(lambda xy: Point(*xy)),
    ),
    max_leaves=10,
)


def same_structure(a, b, fn) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(fn(a), b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_structure(a[k], b[k], fn) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_structure(x, y, fn) for x, y in zip(a, b))
    return a is b


@settings(max_examples=60, deadline=None)
@given(trees)
def test_map_tensors_preserves_any_structure(tree):
    assert map_tensors(lambda t: t, tree) is tree
    assert same_structure(tree, map_tensors(lambda t: t * 2, tree), lambda t: t * 2)


# --------------------------------------------------------------------------
# Pass-through on CPU
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", None, torch.device("cpu")])
def test_batches_pass_through_unchanged_and_in_order(device):
    batches = [nested_batch() for _ in range(7)] + ["just a string", None, 5]
    out = list(to_device(batches, device))
    assert len(out) == len(batches)
    for got, sent in zip(out, batches):
        assert got is sent  # nothing to move: the very same objects, same order


def test_cpu_device_moves_nothing_and_keeps_values():
    batches = [{"x": torch.full((3,), float(i)), "i": i} for i in range(50)]
    out = list(to_device(batches, "cpu", depth=4))
    assert [b["i"] for b in out] == list(range(50))
    assert all(torch.equal(b["x"], torch.full((3,), float(i))) for i, b in enumerate(out))


def test_invalid_arguments_are_refused():
    with pytest.raises(ValueError, match="depth"):
        to_device([], "cpu", depth=0)
    with pytest.raises(ValueError, match="device"):
        to_device([], "meta")
    if not torch.cuda.is_available():
        with pytest.raises(ChuteError, match="cuda"):
            to_device([], "cuda:0")


# --------------------------------------------------------------------------
# Epochs
# --------------------------------------------------------------------------


class RecordingIterable:
    """Logs set_epoch and iter() calls; yields (epoch, i) pairs; tracks live passes."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0
        self.log: list[tuple[str, int]] = []
        self.live = 0
        self.max_live = 0
        self.pulled = 0
        self.cond = threading.Condition()

    def set_epoch(self, epoch: int) -> None:
        self.log.append(("set_epoch", epoch))
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.log.append(("iter", self.epoch))
        return self._run(self.epoch)

    def _run(self, epoch: int):
        with self.cond:
            self.live += 1
            self.max_live = max(self.max_live, self.live)
        try:
            for i in range(self.n):
                with self.cond:
                    self.pulled += 1
                    self.cond.notify_all()
                yield {"epoch": epoch, "i": i, "x": torch.tensor([epoch, i])}
        finally:
            with self.cond:
                self.live -= 1


def test_set_epoch_is_honoured_before_each_pass_starts():
    source = RecordingIterable(5)
    loader = to_device(source, "cpu", depth=8)
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        seen.append([(b["epoch"], b["i"]) for b in loader])
    assert source.log == [
        ("set_epoch", 0), ("iter", 0),
        ("set_epoch", 1), ("iter", 1),
        ("set_epoch", 2), ("iter", 2),
    ]  # fmt: skip
    assert seen == [[(e, i) for i in range(5)] for e in range(3)]
    assert len(loader) == 5


def test_thread_does_not_run_into_the_next_epoch():
    source = RecordingIterable(3)
    loader = to_device(source, "cpu", depth=10)  # room for more than one epoch
    it = iter(loader)
    it.thread.join(JOIN)  # the pass ends on its own once the source is exhausted
    assert not it.thread.is_alive()
    assert source.log == [("iter", 0)]
    assert [b["i"] for b in it] == [0, 1, 2]
    assert source.log == [("iter", 0)]


def test_set_epoch_reaches_the_sampler_of_a_dataloader():
    class RecordingSampler(Sampler):
        def __init__(self, n: int) -> None:
            self.n, self.epoch, self.log = n, 0, []

        def set_epoch(self, epoch: int) -> None:
            self.log.append(("set_epoch", epoch))
            self.epoch = epoch

        def __len__(self) -> int:
            return self.n

        def __iter__(self):
            self.log.append(("iter", self.epoch))
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
            return iter(order.tolist())

    sampler = RecordingSampler(12)
    dl = DataLoader(TensorDataset(torch.arange(12)), batch_size=4, sampler=sampler)
    loader = to_device(dl, "cpu")
    assert loader.sampler is sampler
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = torch.cat([b[0] for b in loader]).tolist()
        expected = torch.randperm(12, generator=torch.Generator().manual_seed(epoch)).tolist()
        assert got == expected
    assert sampler.log == [("set_epoch", 0), ("iter", 0), ("set_epoch", 1), ("iter", 1)]


def test_set_epoch_without_a_target_is_an_attribute_error():
    with pytest.raises(AttributeError, match="set_epoch"):
        to_device([1, 2], "cpu").set_epoch(0)


def test_early_break_then_a_clean_full_epoch():
    source = RecordingIterable(10)
    loader = to_device(source, "cpu", depth=3)
    for b in loader:
        if b["i"] == 2:
            break
    assert not device_threads()  # stopped and joined at the break
    assert source.live == 0  # the source generator was closed
    loader.set_epoch(1)
    assert [(b["epoch"], b["i"]) for b in loader] == [(1, i) for i in range(10)]
    assert source.max_live == 1  # the two passes never overlapped


def test_a_new_iter_stops_the_previous_pass():
    source = RecordingIterable(6)
    loader = to_device(source, "cpu", depth=2)
    first = iter(loader)
    assert next(first)["i"] == 0
    second = iter(loader)
    with pytest.raises(StopIteration):
        next(first)
    assert [b["i"] for b in second] == list(range(6))
    assert source.max_live == 1


def test_depth_bounds_how_far_the_thread_reads_ahead():
    source = RecordingIterable(20)
    it = iter(to_device(source, "cpu", depth=3))
    with source.cond:
        assert source.cond.wait_for(lambda: source.pulled == 3, timeout=JOIN)
        assert not source.cond.wait_for(lambda: source.pulled > 3, timeout=0.2)
    assert next(it)["i"] == 0
    with source.cond:
        assert source.cond.wait_for(lambda: source.pulled == 4, timeout=JOIN)
    it.close()


# --------------------------------------------------------------------------
# Errors and shutdown
# --------------------------------------------------------------------------


def explode(i: int) -> None:
    raise ValueError(f"bad batch {i}")


def failing_source(k: int, raised: list):
    for i in range(10):
        if i == k:
            try:
                explode(i)
            except ValueError as exc:
                raised.append(exc)
                raise
        yield i


def test_error_surfaces_at_its_batch_with_the_original_traceback():
    raised: list[BaseException] = []
    loader = to_device(failing_source(3, raised), "cpu", depth=4)
    got = []
    with pytest.raises(ValueError, match="bad batch 3") as info:
        for b in loader:
            got.append(b)
    assert got == [0, 1, 2]
    assert info.value is raised[0]
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "explode" in frames and "failing_source" in frames
    assert not device_threads()


def test_error_in_iter_raises_at_iter():
    class Broken:
        def __iter__(self):
            raise OSError("cannot open shard 7")

    with pytest.raises(OSError, match="shard 7"):
        iter(to_device(Broken(), "cpu"))


def endless():
    i = 0
    while True:
        yield torch.tensor([i])
        i += 1


@pytest.mark.parametrize("how", ["break", "del", "consumer_error", "close", "loader_close"])
def test_thread_stops_when_the_consumer_leaves(how):
    loader = to_device(endless(), "cpu", depth=2)
    if how == "break":
        for b in loader:
            if b.item() == 3:
                assert device_threads()  # the check below is not vacuous
                break
    elif how == "del":
        it = iter(loader)
        next(it)
        assert device_threads()
        del it
    elif how == "consumer_error":
        with pytest.raises(RuntimeError):
            for _ in loader:
                assert device_threads()
                raise RuntimeError("loss is nan")
    elif how == "close":
        with iter(loader) as it:
            next(it)
            assert device_threads()
    else:
        it = iter(loader)
        next(it)
        assert device_threads()
        loader.close()
        with pytest.raises(StopIteration):
            next(it)
    assert not device_threads()


def test_blocked_source_is_abandoned_with_a_warning():
    release = threading.Event()

    def stuck():
        yield 0
        release.wait(JOIN * 2)  # "blocked forever", bounded for the test
        yield 1

    it = iter(to_device(stuck(), "cpu", shutdown_timeout=0.2))
    assert next(it) == 0
    with pytest.warns(RuntimeWarning, match="did not return from next"):
        assert it.close() is False
    release.set()
    it.thread.join(JOIN)
    assert not it.thread.is_alive()


def test_dataloader_keeps_len_sampler_dataset_and_values():
    dataset = TensorDataset(torch.arange(40).float(), torch.arange(40))
    dl = DataLoader(dataset, batch_size=8)
    loader = to_device(dl, "cpu")
    assert len(loader) == len(dl) == 5
    assert loader.sampler is dl.sampler and loader.dataset is dl.dataset
    assert loader.batch_size == 8
    expected = list(dl)
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(expected)
        for (gx, gy), (ex, ey) in zip(got, expected):
            assert torch.equal(gx, ex) and torch.equal(gy, ey)


def test_dataloader_with_worker_processes():
    dataset = TensorDataset(torch.arange(64))
    dl = DataLoader(dataset, batch_size=8, num_workers=2)
    loader = to_device(dl, "cpu", depth=3)
    for _ in range(2):
        assert torch.cat([b[0] for b in loader]).tolist() == list(range(64))
    for b in loader:  # break while workers are running
        break


def test_len_is_a_type_error_when_the_source_has_none():
    loader = to_device(iter([1, 2]), "cpu")
    with pytest.raises(TypeError):
        len(loader)
    with pytest.raises(AttributeError):
        loader.sampler  # noqa: B018


def test_prefetcher_reports_each_copied_batch():
    copied = []
    host = [{"x": torch.tensor([i])} for i in range(5)]
    prefetcher = DevicePrefetcher(
        host, DeviceCopier("cpu"), depth=2, on_copied=lambda b, ev: copied.append((b, ev))
    )
    assert [b["x"].item() for b in prefetcher] == list(range(5))
    assert [b for b, _ in copied] == host and all(ev is None for _, ev in copied)


SCRIPT_MID_ITERATION = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from chute.device import to_device

def endless():
    i = 0
    try:
        while True:
            yield {"x": torch.full((64,), i), "i": i}
            i += 1
    finally:
        print("source closed", flush=True)  # only if the thread was stopped, not abandoned

it = iter(to_device(endless(), "cpu", depth=4))
for _ in range(10):
    next(it)
dl = DataLoader(TensorDataset(torch.arange(1000)), batch_size=2, num_workers=2)
loader = to_device(dl, "cpu")
for batch in loader:
    if batch[0][0] == 20:
        print("exiting mid-iteration", flush=True)
        sys.exit(0)
"""

SCRIPT_BLOCKED = """
import threading
from chute.device import to_device

def blocked():
    yield 0
    threading.Event().wait()  # never returns
    yield 1

it = iter(to_device(blocked(), "cpu", shutdown_timeout=1.0))
assert next(it) == 0
print("exiting with a blocked source", flush=True)
"""


@pytest.mark.parametrize(
    "script, message",
    [(SCRIPT_MID_ITERATION, "source closed"), (SCRIPT_BLOCKED, "blocked source")],
    ids=["mid-iteration", "blocked-source"],
)
def test_interpreter_exits_promptly(script, message):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 0, proc.stderr
    assert message in proc.stdout
    assert time.monotonic() - start < 20
    if "blocked" in message:
        assert "did not return from next" in proc.stderr


# --------------------------------------------------------------------------
# Staging ring (its logic runs on CPU with unpinned buffers and fake events)
# --------------------------------------------------------------------------


class FakeEvent:
    def __init__(self, log: list, batch: int) -> None:
        self.log, self.batch = log, batch

    def synchronize(self) -> None:
        self.log.append(self.batch)


def test_staging_ring_reuses_buffers_after_their_copy_is_done():
    ring = StagingRing(slots=2, pin_memory=False)
    waited: list[int] = []
    seen_buffers = set()
    for n in range(20):
        x, y, z = torch.full((4, 3), float(n)), torch.full((4, 3), -float(n)), torch.arange(2)
        staged = [ring.stage(x), ring.stage(y), ring.stage(z)]
        assert torch.equal(staged[0], x) and torch.equal(staged[1], y) and torch.equal(staged[2], z)
        assert staged[0].data_ptr() != staged[1].data_ptr()  # same key, distinct buffers
        seen_buffers.update(t.data_ptr() for t in staged)
        ring.release(FakeEvent(waited, n))
    assert ring.allocations == 2 * 3  # slots x tensors per batch, then only reuse
    assert len(seen_buffers) == 6
    # Batch n reuses the buffers batch n-2 was copied from, after waiting on its event.
    assert waited == [n - 2 for n in range(2, 20) for _ in range(3)]


def test_staging_ring_bounds_the_number_of_shapes():
    ring = StagingRing(slots=2, max_shapes=3, pin_memory=False)
    for n in range(1, 30):
        ring.stage(torch.zeros(n))
        ring.release(None)
    assert ring.nbytes == 4 * (27 + 28 + 29)  # the last three shapes, one buffer each
    ring.clear()
    assert ring.nbytes == 0


# --------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# --------------------------------------------------------------------------


def slow_kernel() -> None:
    """Keep the current stream busy for a while (~0.5 ms), as a long step would."""
    torch.cuda._sleep(1_000_000)


@pytest.mark.parametrize("user_stream", [False, True], ids=["default-stream", "user-stream"])
@pytest.mark.cuda
@cuda_only
def test_cuda_values_match_host_while_the_consumer_is_slow(user_stream):
    """Race detector: 1,000 batches, host buffers rewritten by the source, a slow
    kernel queued before every read and each batch dropped at once. A missing
    wait_event reads before the copy lands; a missing record_stream lets the next
    batch reuse memory a queued read has not consumed; a staging buffer rewritten
    too early corrupts a copy. Any of these shows up as a wrong value."""
    n, shape = 1000, (256, 1024)
    host = [torch.empty(shape) for _ in range(3)]

    def source():
        for i in range(n):
            buf = host[i % 3]
            buf.fill_(float(i))  # the source reuses its own (unpinned) buffers
            yield {"x": buf, "i": torch.tensor([i]), "tag": f"b{i}", "none": None}

    device = torch.device("cuda", torch.cuda.current_device())
    loader = to_device(source(), device, depth=2)
    stream = torch.cuda.Stream(device) if user_stream else torch.cuda.current_stream(device)
    errors = torch.zeros((), dtype=torch.int64, device=device)
    stream.wait_stream(torch.cuda.current_stream(device))  # errors is zeroed before use
    count = 0
    with torch.cuda.stream(stream):
        for step, batch in enumerate(loader):
            assert batch["tag"] == f"b{step}" and batch["none"] is None
            assert batch["x"].device == device
            if step % 2:
                slow_kernel()
            errors += (batch["x"] != step).sum() + (batch["i"] != step).sum()
            del batch
            count += 1
    stream.synchronize()
    assert count == n
    assert errors.item() == 0
    assert loader.pinned_allocations == 2 * 2  # x and i, two slots each


@pytest.mark.cuda
@cuda_only
def test_cuda_loader_style_pinned_ring_waits_on_the_copy_event():
    """How chute's Loader plugs in: its own pinned ring, rewritten only after
    the event of the copy that last read each buffer."""
    n, shape, slots = 500, (512, 1024), 3
    ring = [torch.empty(shape, pin_memory=True) for _ in range(slots)]
    pending: list = [None] * slots

    def source():
        for i in range(n):
            slot = i % slots
            if pending[slot] is not None:
                pending[slot].synchronize()
            ring[slot].fill_(float(i))
            yield slot, ring[slot]

    def on_copied(host_batch, event) -> None:
        pending[host_batch[0]] = event

    copier = DeviceCopier("cuda")
    errors = torch.zeros((), dtype=torch.int64, device=copier.device)
    with DevicePrefetcher(source(), copier, depth=2, on_copied=on_copied) as batches:
        for step, (slot, x) in enumerate(batches):
            assert slot == step % slots and x.is_cuda
            slow_kernel()
            errors += (x != step).sum()
    torch.cuda.synchronize()
    assert errors.item() == 0
    assert copier.pinned_allocations == 0  # pinned input is copied directly


@pytest.mark.cuda
@cuda_only
def test_cuda_memory_does_not_grow_over_epochs():
    data = [{"x": torch.randn(64, 1024), "y": torch.arange(64)} for _ in range(20)]
    loader = to_device(data, "cuda", depth=3)

    def allocated() -> int:
        torch.cuda.synchronize()
        torch.empty(1, device=loader.device)  # lets the allocator retire recorded frees
        return torch.cuda.memory_allocated(loader.device)

    baseline = allocated()
    usage = []
    for epoch in range(6):
        for step, batch in enumerate(loader):
            total = batch["x"].sum() + batch["y"].sum()
            if epoch % 2 and step == 5:
                break  # early exits must not leak queued batches either
        del batch, total
        usage.append(allocated())
    assert usage == [baseline] * 6
    assert loader.pinned_allocations == 2 * 2


@pytest.mark.cuda
@cuda_only
def test_cuda_pinned_dataloader_input_needs_no_staging():
    dl = DataLoader(TensorDataset(torch.arange(256).float()), batch_size=32, pin_memory=True)
    last = torch.cuda.device_count() - 1
    loader = to_device(dl, f"cuda:{last}")
    for _ in range(2):
        got = torch.cat([b[0] for b in loader])
        assert got.device == torch.device("cuda", last)
        assert torch.equal(got.cpu(), torch.arange(256).float())
    assert loader.pinned_allocations == 0
