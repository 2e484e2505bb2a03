"""Threads: concurrent calls while shards are swapped out, the GIL released by big copies,
and buffers released on every path (success or error)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

from chute import _native

from ._reference import binary_source, map_source, offsets_of

WORKERS = 3
CALLS = 150


def _binary_column(rng, layout):
    arrays = [pa.array([str(v) * 40 for v in rng.integers(0, 10**6, r)], pa.large_string()) for r in layout]
    return [binary_source(a) for a in arrays], pa.chunked_array(arrays).to_pylist()


def _map_column(rng, layout):
    map_type = pa.map_(pa.large_string(), pa.large_string())
    rows = [[{f"k{j}": str(v) * 20 for j, v in enumerate(rng.integers(0, 10**6, 4))} for _ in range(r)] for r in layout]
    arrays = [pa.array([list(d.items()) for d in shard], map_type) for shard in rows]
    return [map_source(a) for a in arrays], [d for shard in rows for d in shard]


@pytest.mark.parametrize("kind", ["gather", "gather_binary", "take_objects", "take_dicts"])
def test_concurrent_calls_while_another_thread_swaps_shards(kind):
    """Every call returns the exact rows or raises Unmapped; freed shards are never read."""
    rng = np.random.default_rng(7)
    layout = [700, 0, 500, 900]
    offsets = offsets_of(layout)
    if kind == "gather":
        # 512 KiB per shard: freeing one returns its pages to the system, so a read after free would crash.
        originals = [rng.integers(0, 256, (r, 768), dtype=np.uint8) for r in layout]
        expected = np.concatenate(originals)
    elif kind == "take_dicts":
        originals, expected = _map_column(rng, layout)
    else:
        originals, expected = _binary_column(rng, layout)

    def fresh(s):
        """An equal copy in new memory, so the previous item is freed when replaced."""
        item = originals[s]
        if isinstance(item, np.ndarray):
            return item.copy()
        return tuple(None if b is None else bytearray(bytes(b)) for b in item)

    sources = [fresh(s) for s in range(len(layout))]
    stop = threading.Event()
    start = threading.Barrier(WORKERS + 1)
    failures: list[str] = []
    counts = {"exact": 0, "unmapped": 0}
    lock = threading.Lock()

    def call(indices):
        if kind == "gather":
            out = np.empty((len(indices), 768), np.uint8)
            _native.gather(indices, offsets, [(sources, out, 768)])
            return np.array_equal(out, expected[indices])
        if kind == "gather_binary":
            new_offsets, data = _native.gather_binary(indices, offsets, sources)
            o = np.frombuffer(new_offsets, np.int64)
            return [data[o[i] : o[i + 1]].decode() for i in range(len(indices))] == [expected[i] for i in indices]
        if kind == "take_objects":
            return _native.take_objects(indices, offsets, sources, "str") == [expected[i] for i in indices]
        return _native.take_dicts(indices, offsets, sources, "str") == [expected[i] for i in indices]

    def worker(seed):
        local = np.random.default_rng(seed)
        start.wait(timeout=60)
        for _ in range(CALLS):
            indices = local.integers(0, offsets[-1], 256).astype(np.int64)
            try:
                ok = call(indices)
            except _native.Unmapped:
                with lock:
                    counts["unmapped"] += 1
                continue
            except Exception as error:  # noqa: BLE001 - reported below
                failures.append(repr(error))
                return
            with lock:
                counts["exact"] += 1
            if not ok:
                failures.append("wrong rows")
                return

    def swapper():
        local = np.random.default_rng(99)
        start.wait(timeout=60)
        while not stop.is_set():  # a stress generator: it swaps until the workers are done
            s = int(local.integers(0, len(layout)))
            sources[s] = None if local.random() < 0.05 else fresh(s)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
    swapping = threading.Thread(target=swapper)
    for t in threads + [swapping]:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    swapping.join(timeout=60)
    assert not any(t.is_alive() for t in threads + [swapping])
    assert not failures, failures
    assert counts["exact"] + counts["unmapped"] == WORKERS * CALLS


def _observes_released_gil(call) -> bool:
    """Whether this thread runs while ``call`` runs in another thread.

    With a switch interval far longer than the call, a thread holding the GIL is never
    asked to drop it: this thread then runs only after the call has returned.
    """
    started = threading.Event()
    done = []

    def work():
        started.set()
        call()
        done.append(True)

    thread = threading.Thread(target=work)
    thread.start()
    started.wait(timeout=60)
    running_meanwhile = not done
    thread.join(timeout=120)
    assert not thread.is_alive()
    return running_meanwhile


@pytest.mark.parametrize("kind", ["gather", "feistel"])
def test_big_copies_release_the_gil(kind):
    if kind == "gather":
        rows = np.ones((4, 1 << 16), np.uint8)
        indices = np.zeros(1024, np.int64)  # 64 MiB copied from a hot 256 KiB source
        out = np.empty((1024, 1 << 16), np.uint8)

        def call():
            _native.gather(indices, np.array([0, 4]), [([rows], out, 1 << 16)])

    else:
        out = np.empty(1 << 22, np.int64)

        def call():
            _native.feistel(len(out), 11, [1, 2, 3, 4, 5, 6], out)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        # Scheduling may let the call finish before this thread wakes: a few attempts.
        assert any(_observes_released_gil(call) for _ in range(8))
    finally:
        sys.setswitchinterval(interval)


def test_small_copies_keep_the_gil():
    """Below 64 KiB the call never lets another thread in (a GIL round trip would cost more)."""
    rows = np.ones((4, 64), np.uint8)
    indices = np.zeros(100, np.int64)
    out = np.empty((100, 64), np.uint8)

    def call():
        for _ in range(200):
            _native.gather(indices, np.array([0, 4]), [([rows], out, 64)])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        assert not _observes_released_gil(call)
    finally:
        sys.setswitchinterval(interval)


def _resizable(*buffers: bytearray) -> bool:
    """A bytearray cannot be resized while a buffer export of it is held."""
    try:
        for b in buffers:
            b.append(0)
            b.pop()
    except BufferError:
        return False
    return True


def test_buffers_and_references_are_released_on_every_path():
    shard0, shard1 = bytearray(b"abcdef"), bytearray(b"gh")
    out = bytearray(4)
    sources = [shard0, shard1]
    before = sys.getrefcount(shard0), sys.getrefcount(shard1), sys.getrefcount(sources)
    offsets = np.array([0, 3, 4], np.int64)
    _native.gather(np.array([0, 3]), offsets, [(sources, out, 2)])
    assert out == b"abgh"
    with pytest.raises(IndexError):
        _native.gather(np.array([0, 9]), offsets, [(sources, out, 2)])
    with pytest.raises(_native.CorruptShard):
        _native.gather(np.array([0, 3]), offsets, [([shard0, bytearray(b"g")], out, 2)])
    with pytest.raises(_native.Unmapped):
        _native.gather(np.array([0, 3]), offsets, [([shard0, None], out, 2)])
    with pytest.raises(ValueError):
        _native.gather(np.array([0, 3]), offsets, [(sources, out, 2), (sources, bytearray(3), 2)])
    assert _resizable(shard0, shard1, out)
    assert (sys.getrefcount(shard0), sys.getrefcount(shard1), sys.getrefcount(sources)) == before

    value_offsets, data = bytearray(np.array([0, 1, 3], np.int64).tobytes()), bytearray(b"a\xff\xfe")
    binary = [(value_offsets, data)]
    for call in (
        lambda: _native.gather_binary(np.array([1]), np.array([0, 2]), binary),
        lambda: _native.take_objects(np.array([1]), np.array([0, 2]), binary, "str"),
        lambda: _native.take_objects(np.array([0]), np.array([0, 2]), binary, "str"),
        lambda: _native.join_json(value_offsets, data),
    ):
        try:
            call()
        except _native.CorruptShard:
            pass
        assert _resizable(value_offsets, data)
    parts = [bytearray(b) for b in (np.array([0, 1], np.int32).tobytes(), np.array([0, 1], np.int64).tobytes(), b"\xff")]
    values = [bytearray(np.array([0, 1], np.int64).tobytes()), bytearray(b"v")]
    with pytest.raises(_native.CorruptShard):
        _native.take_dicts(np.array([0]), np.array([0, 1]), [(parts[0], parts[1], parts[2], values[0], values[1])], "str")
    assert _resizable(*parts, *values)
