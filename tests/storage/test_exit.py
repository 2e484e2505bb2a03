"""A process that used a limited shared cache exits normally: after it was stopped and continued
(``SIGSTOP``/``SIGCONT``) while other processes rang its doorbell and waited for its lease, with
its loader and dataset closed or left open.

The exit is bounded by an event (the process ending) with a generous timeout; a
process still alive past it fails the test naming the case, with its Python
stacks (faulthandler, SIGUSR1) and its native ones (gdb, where installed).
"""

from __future__ import annotations

import glob
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.servers import REPO_ROOT
from tests.storage._helpers import native_stacks, stated_minimum, write_dataset

#: Seconds a process may take to start (import torch, open the dataset, read its first batches) and to exit.
START_S = 300.0
EXIT_S = 120.0
#: Stop/continue cycles, with rings at the stopped process's doorbell in each.
CYCLES = 5


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("exit") / "ds"
    write_dataset(str(root))
    return str(root)


def _ring_all(cache_dir: str, times: int) -> None:
    from chute.storage.node.share import _ring

    for _ in range(times):
        for bell in glob.glob(os.path.join(cache_dir, ".chute-members", "*.bell")):
            _ring(bell)


@pytest.mark.parametrize("how", ["close", "leave"])
def test_a_process_stopped_and_continued_while_others_wait_for_its_lease_exits(http_server, dataset, tmp_path, how):
    import shutil

    from chute.storage.node.share import Sharing

    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    limit = stated_minimum(url, str(tmp_path / "probe")) * 3 // 2  # one loader fits, a second must wait
    cache_dir = str(tmp_path / "cache")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    err_path = tmp_path / "stderr"
    child = subprocess.Popen([sys.executable, "-m", "tests.storage._exit_child", url, cache_dir, str(limit), how],
                             cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(err_path, "w"), text=True)
    waiter = Sharing(cache_dir, limit)  # this process, waiting for a turn the child's lease keeps from it
    turn = threading.Event()
    failed: list[BaseException] = []

    def wait_for_turn() -> None:
        try:
            waiter.reserve(0, at_least=limit)
            turn.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    thread = threading.Thread(target=wait_for_turn, name="test-exit-waiter", daemon=True)
    try:
        with selectors.DefaultSelector() as waiting:  # (not select(): the suite may hold fds past 1024 by now)
            waiting.register(child.stdout, selectors.EVENT_READ)
            ready = waiting.select(START_S)
        line = child.stdout.readline() if ready else ""
        assert line == "holding\n", f"the child did not start ({line!r}):\n{err_path.read_text()[-4000:]}"
        thread.start()
        for _ in range(CYCLES):
            child.send_signal(signal.SIGSTOP)
            _ring_all(cache_dir, 20)  # rings pile up in the stopped process's doorbell
            time.sleep(0.05)  # a short stop (not a timing assertion: any length must do)
            child.send_signal(signal.SIGCONT)
            _ring_all(cache_dir, 20)
        child.stdin.write("exit\n")
        child.stdin.flush()
        try:
            child.wait(EXIT_S)
        except subprocess.TimeoutExpired:
            native = native_stacks(child.pid)
            child.send_signal(signal.SIGUSR1)
            time.sleep(2.0)  # let faulthandler write (on the failure path only)
            pytest.fail(f"a process stopped and continued ({how}) did not exit within {EXIT_S} s of being told to:\n"
                        f"{err_path.read_text()[-6000:]}\n{native[-6000:]}")
        assert child.returncode == 0, err_path.read_text()[-6000:]
        assert "exiting" in err_path.read_text()
        # its lease is free once it is gone (it left, or the kernel dropped its member lock)
        assert turn.wait(EXIT_S), failed or "the waiting process never got the lease the child held"
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait(30)
        waiter.close()
        thread.join(30)
    assert not failed, failed
    assert os.listdir(os.path.join(cache_dir, ".chute-members")) == []
