"""Nothing chute started outlives ``close()``: no ``chute-*`` thread, in every mode a Loader runs in.

Each case starts a pass, takes a few batches (so every stage is running), then
leaves the pass and closes the Loader; the threads named ``chute-*`` that were
not there before must be gone. Counted, not timed: ``close()`` joins what it
started, so the check runs right after it returns.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

import chute


def chute_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("chute-")}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    rows = ({"x": np.full(4, i, np.float32), "id": i} for i in range(400))
    return chute.write(rows, tmp_path_factory.mktemp("close") / "ds", shard_size=4000)


def leave_and_close(loader: chute.Loader, batches: int = 3) -> None:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    loader.close()
    del it


def add_one(sample):
    return sample


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # threads, autotuned
        {"workers": 3},
        {"workers": chute.Workers("processes", count=2)},
        {"device": "cpu"},
        {"transform": add_one},
    ],
    ids=["threads", "three-threads", "processes", "device-cpu", "transform"],
)
def test_no_thread_survives_close(ds, kwargs):
    before = chute_threads()
    leave_and_close(chute.Loader(ds, 16, shuffle=True, **kwargs))
    assert not {t.name for t in chute_threads() - before}


def test_no_thread_survives_close_after_a_whole_pass_and_a_started_one(ds):
    before = chute_threads()
    loader = chute.Loader(ds, 16, workers=2)
    assert sum(len(b["id"]) for b in loader) == 400
    it = iter(loader)
    next(it)
    loader.close()
    assert not {t.name for t in chute_threads() - before}


def test_no_thread_survives_close_of_a_mixture(ds, tmp_path):
    other = chute.write(({"x": np.zeros(4, np.float32), "id": -i} for i in range(100)), tmp_path / "other")
    before = chute_threads()
    leave_and_close(chute.Loader(chute.mix({"a": ds, "b": other}, weights={"a": 3, "b": 1}), 16, shuffle=True))
    assert not {t.name for t in chute_threads() - before}


def test_no_thread_survives_close_of_stages(ds):
    before = chute_threads()
    loader = chute.Loader(ds, 16, device="cpu", stages=[
        chute.BatchStage(lambda b: b, name="on_workers"), chute.BatchStage(lambda b: b, name="on_a_thread", where="thread"),
    ])
    stages = chute.BatchStage(lambda b: b, name="after", source=loader)
    next(stages), next(stages)
    assert {t.name for t in chute_threads() - before} >= {"chute-stage-on_a_thread-r0", "chute-device:cpu"}
    stages.close()
    assert not {t.name for t in chute_threads() - before}


@pytest.mark.skipif(importlib.util.find_spec("aiohttp") is None, reason="needs aiohttp (the test HTTP server)")
def test_no_thread_survives_close_of_a_progressive_loader(ds, tmp_path, monkeypatch):
    import shutil

    from tests.servers import FaultyHTTPServer

    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "default-cache"))
    root = tmp_path / "www"
    shutil.copytree(ds.root, root / "ds")
    with FaultyHTTPServer(root) as server:
        before = chute_threads()
        remote = chute.open(server.url + "ds", progressive=True, cache_dir=tmp_path / "cache", cache_limit=2 * ds.nbytes)
        loader = chute.Loader(remote, 16, shuffle=True)
        for _ in loader:  # epoch 0: what the filler brought by then
            pass
        loader.close()
        remote.cache.close()
        assert not {t.name for t in chute_threads() - before}


_LEFT_OPEN = """
import sys
import numpy as np
import chute
ds = chute.write(({"x": np.full(4, i, np.float32)} for i in range(400)), sys.argv[1], shard_size=4000)
loader = chute.Loader(ds, 16, shuffle=True, seed=0)
it = iter(loader)
next(it)
loader.close()
print(str(loader.report()).splitlines()[0])
# `it` is still referenced: Python collects it at exit, after the modules are torn down
"""


def test_an_iterator_left_open_after_close_ends_quietly_at_interpreter_exit(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LEFT_OPEN, str(tmp_path / "ds")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 batches" in done.stdout  # the report's window ended at close(), with the one batch taken
    assert done.stderr == "", done.stderr  # no "hook raised" traceback at exit


_CTRL_C_ELSEWHERE = """
import signal, sys, threading, time
import numpy as np
import chute
signal.signal(signal.SIGINT, signal.default_int_handler)  # Python leaves SIGINT ignored if started so (a `cmd &` job)
ds = chute.write(({"x": np.full(4, i, np.float32), "id": i} for i in range(64)), sys.argv[1], shard_size=4000)
blocked, release, where = threading.Event(), threading.Event(), {}

def transform(sample):  # the second batch never finishes: the loop waits for it with nothing else arriving
    if sample["id"] >= 8:
        where["thread"] = threading.get_ident()
        blocked.set()
        release.wait()
    return sample

def loop_waits():  # the main thread is inside the channel's take (waiting for the batch)
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_code.co_name != "take":
        frame = frame.f_back
    return frame is not None

def ctrl_c():  # Ctrl-C as the kernel may deliver it: to a thread other than the main one
    blocked.wait()
    while not loop_waits():
        time.sleep(0.01)
    signal.pthread_kill(where["thread"], signal.SIGINT)
    while loop_waits():  # the loop must wake for it (if it never does, the test times out)
        time.sleep(0.01)
    release.set()  # then the blocked batch may finish, and close() joins its thread

device = None if sys.argv[2] == "none" else sys.argv[2]  # with a device, the loop waits on the device stage
loader = chute.Loader(ds, 8, transform=transform, workers=chute.Workers(count=1), watchdog=None, device=device)
it = iter(loader)
next(it)
threading.Thread(target=ctrl_c, daemon=True).start()
try:
    next(it)
except KeyboardInterrupt:
    print("interrupted", flush=True)
finally:
    release.set()
loader.close()
"""


@pytest.mark.parametrize("device", ["none", "cpu"])
def test_ctrl_c_delivered_to_another_thread_interrupts_the_waiting_loop(tmp_path, device):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CTRL_C_ELSEWHERE, str(tmp_path / "ds"), device], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted"


@pytest.mark.skipif(importlib.util.find_spec("aiohttp") is None, reason="needs aiohttp (the test HTTP server)")
@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_close_while_batches_wait_for_a_download_ends_everything_at_once(ds, tmp_path, caplog, kind):
    """A remote dataset whose last shard's download never returns: the batches that read it wait
    for it (thread workers in their task; with worker processes in the gate, not sent to a
    worker). Closing makes them give up at once (no worker left busy to wait for, no warning),
    then ends the receiver, the downloads and the workers."""
    import logging
    import os
    import shutil

    from tests.servers import FaultyHTTPServer

    root = tmp_path / "www"
    shutil.copytree(ds.root, root / "ds")
    pids: list[int] = []
    with FaultyHTTPServer(root) as server:
        before = chute_threads()
        remote = chute.open(server.url + "ds", cache_dir=tmp_path / "cache")
        # in order, 13 batches: all submitted at the start (prefetch 16); the last shard is read by the last 3 only
        loader = chute.Loader(remote, 32, workers=chute.Workers(kind, count=2))
        last = len(remote.shards) - 1
        server.hang(pattern=remote.shards[last].file)
        try:
            it = iter(loader)
            next(it)
            assert server.wait_hung(1, timeout=60), "the last shard was never requested"
            if kind == "processes":
                pids = loader._processes.pids
                assert loader._processes.waiting_for_shards()[-3:] == [10, 11, 12]
            with caplog.at_level(logging.WARNING, logger="chute"):
                loader.close()
            assert "still busy after shutdown" not in caplog.text
            del it
            assert not {t.name for t in chute_threads() - before if not t.name.startswith("chute-fetch")}
        finally:
            server.release()
        for thread in chute_threads() - before:  # the download hung in its request ends with it (a daemon meanwhile)
            thread.join(30)
        assert not {t.name for t in chute_threads() - before}
        remote.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
