"""Reader processes: results in source order, errors raised in the caller, spawn works."""

from __future__ import annotations

import contextlib
import functools
import os

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
    assert not multiprocessing.active_children()  # the readers ended and were reaped before the error came out


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _exited_within(pid: int, seconds: float) -> bool:
    """Block until process ``pid`` exits (a process file descriptor: a wait, not a poll), at most ``seconds``."""
    from chute.sources._parallel import _wait_readable

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return _wait_readable(fd, seconds)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open") or not os.path.isdir("/proc"), reason="needs Linux (/proc, pidfd)")
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_reader_processes_exit_when_convert_is_killed(tmp_path, start_method):
    """`chute convert --workers 2` killed with SIGKILL while its readers work: they exit too."""
    import signal
    import subprocess
    import sys
    import threading

    import numpy as np

    src = tmp_path / "images"
    (src / "cat").mkdir(parents=True)
    for k in range(20):
        (src / "cat" / f"{k:02d}.png").write_bytes(np.random.default_rng(k).bytes(100))
    stuck = src / "cat" / "10-stuck.png"
    os.mkfifo(stuck)  # a read that blocks until the test writes: the convert is mid-run when killed
    code = ("import multiprocessing, sys; multiprocessing.set_start_method(sys.argv[1]); "
            "from chute.cli import main; sys.argv = ['chute', *sys.argv[2:]]; main()")
    convert = subprocess.Popen(
        [sys.executable, "-c", code, start_method, "convert", str(src), str(tmp_path / "out"), "--kind", "images",
         "--workers", "2", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    writer: list[int] = []
    opener = threading.Thread(target=lambda: writer.append(os.open(stuck, os.O_WRONLY)), daemon=True)
    opener.start()
    try:
        opener.join(120)  # returns once a reader process has opened the pipe
        assert writer, convert.stderr.read() if convert.poll() is not None else "no reader opened the file"
        readers = _children(convert.pid)
        assert len(readers) >= 2, readers
        convert.send_signal(signal.SIGKILL)
        convert.wait(30)
        left = [pid for pid in readers if not _exited_within(pid, 30)]
        assert left == [], f"reader processes {left} outlived the killed convert"
    finally:
        if convert.poll() is None:
            convert.kill()
        for fd in writer:
            os.close(fd)
        if not writer:  # unblock the opener thread
            with contextlib.suppress(OSError):
                os.close(os.open(stuck, os.O_RDONLY | os.O_NONBLOCK))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_reader_waits_on_a_descriptor_past_1024():
    """A reader forked from a process holding many files inherits them: its wait on the parent's pidfd gets a
    descriptor past 1024, which select() refuses (ValueError) and poll takes."""
    import resource

    from chute.sources._parallel import _wait_readable

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"the hard limit on open files ({hard}) is below 1100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    read, write = os.pipe()
    try:
        high = os.dup2(read, 1050)
        assert not _wait_readable(high, 0)
        os.write(write, b"x")
        assert _wait_readable(high, 5)
        os.close(high)
    finally:
        os.close(read), os.close(write)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# A reader that ends while it writes its result (killed, or terminated by the caller's error at that moment) leaves
# part of a message in the pool's result pipe. The pool's thread, which reads every result, then waits for the rest:
# this script writes such half a message from a reader (the result queue found in the reader's objects), then fails
# in the caller while that thread waits.
_HALF_A_RESULT = """
import gc, os, struct, sys, time
import multiprocessing.queues
from chute.sources._parallel import OrderedPool

def half_a_result(marker):
    queue = next(o for o in gc.get_objects() if type(o) is multiprocessing.queues.SimpleQueue)
    os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + bytes(100))  # a 1 MiB message's first 100 bytes
    open(marker, "w").close()
    time.sleep(600)

if __name__ == "__main__":
    readers = []
    try:
        with OrderedPool(2, start_method=sys.argv[2]) as pool:
            pool._executor.submit(half_a_result, sys.argv[1])
            while not os.path.exists(sys.argv[1]):
                time.sleep(0.01)
            readers = list(pool._executor._processes.values())
            raise RuntimeError("the caller fails")
    except RuntimeError as exc:
        print(exc, sorted({r.exitcode for r in readers}))
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_leaving_after_an_error_does_not_wait_for_a_result_a_reader_left_half_written(tmp_path, start_method):
    """The caller's error ends the readers and the pool returns, although its thread was reading half a message."""
    import subprocess
    import sys

    script = tmp_path / "half.py"
    script.write_text(_HALF_A_RESULT)
    try:
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "written"), start_method],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"leaving the pool after an error hung for {exc.timeout} s: {exc.stderr!r}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the caller fails [-15]"  # every reader ended (SIGTERM) and was reaped


def kill_self_at(x: int, bad: int) -> int:
    if x == bad:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    return x


def test_a_reader_killed_is_reported_with_what_to_do():
    fn = functools.partial(call_chunk, kill_self_at, {"bad": 150})
    seen = []
    with pytest.raises(ChuteError, match=r"a reader process died .*workers=0"):
        with OrderedPool(2) as pool:
            for x in pool.map(fn, chunked(list(range(1000)), 10)):
                seen.append(x)
    assert seen == list(range(150))


# A reader killed while it writes its result: it holds the result pipe's lock and has written part of a message,
# which the pool's thread reads and then waits for the rest of; the other reader waits for the lock.
_KILLED_WRITING = """
import gc, os, signal, struct, sys
import multiprocessing.queues
from chute.errors import ChuteError
from chute.sources._parallel import OrderedPool, call_chunk, chunked
import functools

def killed_writing_at(x, bad):
    if x == bad:
        queue = next(o for o in gc.get_objects() if type(o) is multiprocessing.queues.SimpleQueue)
        queue._wlock.acquire()
        os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + bytes(100))
        os.kill(os.getpid(), signal.SIGKILL)
    return x

if __name__ == "__main__":
    seen = []
    try:
        with OrderedPool(2, start_method=sys.argv[1]) as pool:
            for x in pool.map(functools.partial(call_chunk, killed_writing_at, {"bad": 150}), chunked(list(range(1000)), 10)):
                seen.append(x)
    except ChuteError as exc:
        print(str(exc).split(";")[0], seen == list(range(150)))
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_reader_killed_while_writing_its_result_is_reported_not_waited_for(tmp_path, start_method):
    import subprocess
    import sys

    script = tmp_path / "killed.py"
    script.write_text(_KILLED_WRITING)
    try:
        done = subprocess.run([sys.executable, str(script), start_method], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the pool waited {exc.timeout} s for a reader killed while it wrote its result: {exc.stderr!r}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "a reader process died (killed by the system, out of memory?) True"
