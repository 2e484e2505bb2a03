"""Reader processes: results in source order, errors raised in the caller, spawn works."""

from __future__ import annotations

import functools

import pytest
from source_data import no_dataset_at, write_pickle_index

from chute.errors import ChuteError
from chute.sources import from_index
from chute.sources._parallel import OrderedPool, call_chunk, chunk_size_for, chunked


def square_slowly_at_the_start(x: int) -> int:
    """Early items take longer, so later chunks finish first: the order must still hold."""
    if x < 8:
        import time

        time.sleep(0.02)
    return x * x


def fail_at(x: int, bad: int) -> int:
    if x == bad:
        raise ChuteError(f"item {x} is bad")
    return x


def test_results_come_back_in_order_with_workers():
    items = list(range(300))
    fn = functools.partial(call_chunk, square_slowly_at_the_start, {})
    with OrderedPool(2) as pool:
        assert list(pool.map(fn, chunked(items, 8))) == [x * x for x in items]
    with OrderedPool(0) as pool:
        assert list(pool.map(fn, chunked(items, 7))) == [x * x for x in items]


def test_an_error_in_a_worker_is_raised_in_the_caller():
    fn = functools.partial(call_chunk, fail_at, {"bad": 150})
    seen = []
    with pytest.raises(ChuteError, match="item 150 is bad"):
        with OrderedPool(2) as pool:
            for x in pool.map(fn, chunked(list(range(1000)), 10)):
                seen.append(x)
    assert seen == list(range(150))


def test_chunk_sizes():
    assert chunk_size_for(10, 2) == 8
    assert chunk_size_for(10_000, 2) == 256
    assert chunk_size_for(1600, 4) == 100


def test_index_conversion_under_spawn(tmp_path):
    """The reader processes need nothing inherited from the parent (spawn, as on macOS/Windows)."""
    index, dicts = write_pickle_index(tmp_path / "src", 30)
    ds = from_index(index, tmp_path / "out", allow_pickle=True, workers=2, start_method="spawn", progress=False)
    assert [ds[i]["data"] for i in range(len(ds))] == dicts


def test_interrupt_while_writing_stops_the_readers_and_leaves_no_dataset(tmp_path, monkeypatch):
    import multiprocessing
    import time

    from chute.format.writer import Writer

    index, _ = write_pickle_index(tmp_path / "src", 400)
    original = Writer.append
    calls = []

    def interrupted(self, sample):
        calls.append(1)
        if len(calls) == 100:
            raise KeyboardInterrupt  # Ctrl-C while the readers are busy
        original(self, sample)

    monkeypatch.setattr(Writer, "append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        from_index(index, tmp_path / "out", allow_pickle=True, workers=2, shard_size=1000, progress=False)
    assert no_dataset_at(tmp_path / "out")
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)  # the readers finish the chunk in hand, then exit
    assert not multiprocessing.active_children()
