"""The hang watchdog: a stuck batch is reported (stacks, samples, reads, queues), or raised, and nothing is left behind."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import threading
import time
from multiprocessing import resource_tracker

import numpy as np
import pytest

import chute
from chute.observe import inflight
from chute.observe.watchdog import FIRST_TIMEOUT, FLOOR, StallTimeout, WaitHistory

N, BATCH, STUCK = 40, 4, 13  # sample 13 is in batch 3 (unshuffled): samples 12..15


@pytest.fixture
def ds(tmp_path):
    return chute.write(({"x": np.full(4, i, np.uint8), "label": i} for i in range(N)), tmp_path / "ds")


def _chute_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("chute")]


def _join_chute_threads(timeout: float = 10.0) -> list[str]:
    """Names of chute threads still alive after waiting up to ``timeout`` for each."""
    deadline = time.monotonic() + timeout
    for thread in _chute_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in _chute_threads()]


def _blocker():
    """A transform that blocks on sample STUCK until ``release`` is set, and the line it blocks on."""
    release = threading.Event()

    def blocking_transform(sample):
        if int(sample["label"]) == STUCK:
            release.wait(60)  # bounded: a broken test must not hang the suite
        return sample

    line = blocking_transform.__code__.co_firstlineno + 2
    return blocking_transform, release, line


# ---------------------------------------------------------------- threads


@pytest.mark.parametrize("device", [None, "cpu"])
def test_raise_names_the_transform_frame_and_the_stuck_sample(ds, device):
    transform, release, line = _blocker()
    loader = chute.Loader(
        ds, BATCH, transform=transform, workers=chute.Workers(count=1, prefetch=2), watchdog=chute.Watchdog(1.0, on_stall="raise"), device=device
    )
    received = []
    try:
        with pytest.raises(chute.StallError) as info:
            for batch in loader:
                received.extend(batch["label"].tolist())
    finally:
        release.set()
    assert received == list(range(12))  # batches 0..2 arrived, then the wait for batch 3 was cut
    report = info.value.report
    assert f'File "{__file__}", line {line}, in blocking_transform' in report  # the stuck frame, file:line
    assert "release.wait(60)" in report  # ... and its source line
    assert "batch 3: samples [12, 13, 14, 15]" in report
    assert "inside the transform on sample 13 (shard shard-00000" in report and "row 13)" in report
    assert "'chute-loader-r0-0'" in report and "(the training loop, waiting in next())" in report
    assert "queue: " in report and "Reads in flight:\n  none" in report
    message = str(info.value)
    assert "no batch for" in message and f"blocking_transform ({__file__}:{line})" in message and "sample 13" in message
    loader.close()  # (the Loader's kept threads: the device copy's)
    assert _join_chute_threads() == []  # the released thread finished its task and exited; no watchdog left


def test_warn_reports_to_stderr_and_the_log_then_the_loop_completes(ds, capsys):
    transform, release, line = _blocker()

    class ReleaseOnReport(logging.Handler):
        """Releases the stuck transform once the first stall report has been logged."""

        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.records: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record.getMessage())
            release.set()

    handler = ReleaseOnReport()
    logger = logging.getLogger("chute")
    logger.addHandler(handler)
    try:
        loader = chute.Loader(ds, BATCH, transform=transform, workers=2, watchdog=1.0)  # on_stall="warn" by default
        labels = [label for batch in loader for label in batch["label"].tolist()]
    finally:
        logger.removeHandler(handler)
        release.set()
    assert labels == list(range(N))  # nothing lost: the wait just went on
    err = capsys.readouterr().err
    assert err.count("chute: STALL:") >= 1 and "on_stall='warn'" in err
    assert f'line {line}, in blocking_transform' in err and "batch 3: samples [12, 13, 14, 15]" in err
    stalls = [r for r in handler.records if r.startswith("chute: STALL:")]
    assert stalls and "inside the transform on sample 13" in stalls[0]
    loader.close()  # (its threads are kept across passes until then)
    assert _join_chute_threads() == []


def test_a_slow_training_loop_is_not_a_stall(ds, capsys):
    """Time the loop spends between next() calls is its own: only the wait inside next() counts."""
    loader = chute.Loader(ds, 20, workers=1, watchdog=chute.Watchdog(0.5, on_stall="raise"))
    for _ in loader:
        time.sleep(0.7)  # longer than the timeout, but the loader is not waited on
    assert "STALL" not in capsys.readouterr().err


def test_the_watchdog_needs_no_thread(ds):
    """The loop's own waits time out: no watchdog thread exists, during a pass or after it."""
    loader = chute.Loader(ds, BATCH, workers=1, watchdog=30)
    for _ in loader:
        assert not [t for t in threading.enumerate() if "watchdog" in t.name]
    for _ in loader:
        break  # a pass left early
    loader.close()  # (its threads are kept across passes until then)
    assert _join_chute_threads() == []


def test_reads_in_flight_are_named(ds):
    """A read registered by the storage layer (here by hand, from the transform) shows in the report."""
    release = threading.Event()

    def reading_transform(sample):
        if int(sample["label"]) == STUCK:
            with inflight.track("GET", "http://127.0.0.1:9/ds/shard-00000.arrow", start=4096, length=1024):
                release.wait(60)
        return sample

    loader = chute.Loader(ds, BATCH, transform=reading_transform, workers=1, watchdog=chute.Watchdog(1.0, on_stall="raise"))
    try:
        with pytest.raises(chute.StallError) as info:
            for _ in loader:
                pass
    finally:
        release.set()
    assert "GET http://127.0.0.1:9/ds/shard-00000.arrow bytes=4096-5119: " in info.value.report
    assert "in thread 'chute-loader-r0-0'" in info.value.report
    loader.close()  # (the exception's traceback holds it; its threads are kept across passes until then)
    assert _join_chute_threads() == []


def test_bad_settings_are_refused(ds):
    with pytest.raises(ValueError, match="on_stall must be 'warn' or 'raise'"):
        chute.Loader(ds, BATCH, watchdog=chute.Watchdog(on_stall="ignore"))
    with pytest.raises(ValueError, match=r"the watchdog timeout must be positive \(watchdog=None turns it off\)"):
        chute.Loader(ds, BATCH, watchdog=0)
    with pytest.raises(ValueError, match="the watchdog timeout must be a number of seconds or 'auto'"):
        chute.Loader(ds, BATCH, watchdog="soon")
    with pytest.raises(TypeError, match=r"stall_timeout=: chute's Loader takes watchdog=seconds"):
        chute.Loader(ds, BATCH, stall_timeout=5)


def test_the_auto_timeout_is_generous_first_then_follows_the_waits():
    rule, history = StallTimeout("auto"), WaitHistory()
    assert rule.seconds(history, first_of_pass=False) == FIRST_TIMEOUT  # nothing seen yet
    for _ in range(8):
        history.add(0.010)
    assert rule.seconds(history, first_of_pass=True) == FIRST_TIMEOUT  # start-up of a pass
    assert rule.seconds(history, first_of_pass=False) == FLOOR  # 20 x 10 ms is below the floor
    for _ in range(300):
        history.add(5.0)  # a slow pipeline: the older fast waits fall out of the window
    assert rule.seconds(history, first_of_pass=False) == pytest.approx(100.0)
    assert StallTimeout(2.5).seconds(history, first_of_pass=True) == 2.5  # a number applies to every wait
    assert not StallTimeout(None).enabled


# ---------------------------------------------------------------- processes


def sleepy_transform(sample):
    """Sleeps for good on sample STUCK once the file named by $CHUTE_TEST_HANG exists (module-level: picklable)."""
    if int(sample["label"]) == STUCK and os.path.exists(os.environ["CHUTE_TEST_HANG"]):
        time.sleep(3600)
    return sample


def _pipes() -> int:
    return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") for fd in os.listdir("/proc/self/fd") if _readable(fd))


def _readable(fd: str) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


def test_processes_report_the_worker_stack_and_nothing_is_left(ds, tmp_path, monkeypatch):
    flag = tmp_path / "hang"
    monkeypatch.setenv("CHUTE_TEST_HANG", str(flag))  # inherited by the spawned workers
    resource_tracker.ensure_running()  # its pipe stays open for the life of the process
    pipes = _pipes()
    loader = chute.Loader(ds, BATCH, transform=sleepy_transform, workers=chute.Workers("processes", count=2), watchdog=None)
    try:
        assert sum(len(b["label"]) for b in loader) == N  # starts the workers (spawn) with no watchdog
        pids = loader._processes.pids
        flag.touch()
        loader.watchdog = chute.Watchdog(1.0, on_stall="raise")
        with pytest.raises(chute.StallError) as info:
            for _ in loader:
                pass
    finally:
        loader.close()
    report = info.value.report
    assert "Worker processes (stacks dumped by faulthandler" in report
    stuck_pid = next(int(line.split()[2]) for line in report.splitlines() if line.startswith("  worker pid ") and "building batch 3" in line)
    assert stuck_pid in pids
    assert f'File "{__file__}", line {sleepy_transform.__code__.co_firstlineno + 3} in sleepy_transform' in report
    assert f"batch 3: samples [12, 13, 14, 15]: building in worker pid {stuck_pid}" in report
    assert f"stuck: batch 3 is being built by worker process {stuck_pid} at sleepy_transform" in str(info.value)
    for pid in pids:  # stopped (the stall broke the pool) and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _pipes() == pipes  # worker, stack-dump and wake pipes all closed
    assert _join_chute_threads() == []


# ---------------------------------------------------------------- a server that never answers


def test_a_read_that_never_returns_names_the_url(ds, tmp_path):
    """An HTTP server that accepts the connection and never answers: the report names the URL.

    With on_stall="warn" the watchdog reports again every timeout; the server is
    released once a report names the hung URL (or after 10 reports, and the test
    fails), and the epoch then completes with nothing lost.
    """
    if importlib.util.find_spec("chute.storage") is None:
        pytest.skip("needs chute.storage (remote datasets, issue 4)")
    if importlib.util.find_spec("aiohttp") is None:
        pytest.skip("needs aiohttp for http:// datasets (pip install -e '.[test]')")
    from tests.servers import FaultyHTTPServer

    root = tmp_path / "served"
    root.mkdir()
    shutil.copytree(ds.root, root / "ds")
    shard = ds.shards[0].file
    with FaultyHTTPServer(root) as server:
        url = f"{server.url}ds/{shard}"

        def named(text: str) -> bool:
            return f"GET {url}" in _section(text, "Reads in flight")

        remote = chute.open(server.url + "ds/", cache_dir=tmp_path / "cache")  # the manifest is read before the hang
        server.hang(pattern=r"\.arrow")
        handler = _ReleaseWhen(server, named)
        logger = logging.getLogger("chute")
        logger.addHandler(handler)
        try:
            loader = chute.Loader(remote, BATCH, workers=1, watchdog=1.0)
            labels = [label for batch in loader for label in batch["label"].tolist()]
        finally:
            logger.removeHandler(handler)
            server.release()
    assert labels == list(range(N))
    named = [r for r in handler.reports if f"GET {url}" in _section(r, "Reads in flight")]
    assert named, handler.reports
    assert "batch 0: samples [0, 1, 2, 3]" in named[0]
    loader.close()  # (its threads are kept across passes until then)
    assert _join_chute_threads() == []


def test_processes_name_a_batch_waiting_for_its_shards_download(ds, tmp_path):
    """With worker processes, a batch goes to a worker only once the loader holds its shards: a
    download that never returns is reported as the batch waiting for the downloader, with the
    URL; released, the epoch completes with nothing lost and nothing left running."""
    if importlib.util.find_spec("aiohttp") is None:
        pytest.skip("needs aiohttp for http:// datasets (pip install -e '.[test]')")
    from tests.servers import FaultyHTTPServer

    root = tmp_path / "served"
    root.mkdir()
    shutil.copytree(ds.root, root / "ds")
    with FaultyHTTPServer(root) as server:
        url = f"{server.url}ds/{ds.shards[0].file}"

        def named(text: str) -> bool:
            return "waits for the downloader" in text and f"GET {url}" in _section(text, "Reads in flight")

        remote = chute.open(server.url + "ds/", cache_dir=tmp_path / "cache")
        server.hang(pattern=r"\.arrow")
        handler = _ReleaseWhen(server, named)
        logger = logging.getLogger("chute")
        logger.addHandler(handler)
        loader = chute.Loader(remote, BATCH, workers=chute.Workers("processes", count=1), watchdog=1.0)
        try:
            labels = [label for batch in loader for label in batch["label"].tolist()]
        finally:
            logger.removeHandler(handler)
            server.release()
            loader.close()
    assert labels == list(range(N))
    named = [r for r in handler.reports if f"GET {url}" in _section(r, "Reads in flight")]
    assert named, handler.reports
    assert "Stuck: batch 0 waits for the downloader: its shards are not held yet" in named[0]
    assert "batch 0: samples [0, 1, 2, 3]: not sent to a worker yet (waiting until the downloader holds its shards)" in named[0]
    assert _join_chute_threads() == []


class _ReleaseWhen(logging.Handler):
    """Keeps the watchdog's reports; releases ``server``'s hung requests once a report satisfies
    ``named`` (or after 10 reports: the test then fails on what they say)."""

    def __init__(self, server, named) -> None:
        super().__init__(logging.WARNING)
        self.server, self.named = server, named
        self.reports: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("chute: STALL:"):
            self.reports.append(text)
            if self.named(text) or len(self.reports) >= 10:
                self.server.release()


def _section(report: str, title: str) -> str:
    """The lines of one section of a report."""
    return report.split(f"{title}:\n", 1)[-1].split("\n\n", 1)[0] if f"{title}:" in report else ""
