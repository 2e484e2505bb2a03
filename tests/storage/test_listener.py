"""A member's doorbell listener: its file descriptor is closed exactly once, by end() or, when the
thread is still busy after end() stopped waiting, by the thread as it ends."""

from __future__ import annotations

import os
import threading

import pytest

from chute.storage.node import share


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


@pytest.fixture
def bell(tmp_path):
    """A doorbell as a member makes it (a FIFO opened read-write, non-blocking), and a ringer's end."""
    path = str(tmp_path / "member.bell")
    os.mkfifo(path, 0o600)
    read = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    write = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    yield read, write
    os.close(write)
    if _is_open(read):
        os.close(read)


def test_end_closes_the_bell_of_an_idle_listener(bell):
    read, write = bell
    rang = threading.Event()
    listener = share._Listener(read, rang.set, "chute-test-bell")
    os.write(write, b"\0")
    assert rang.wait(60)  # the ring was handled: the thread goes back to waiting on the bell
    listener.end()  # wakes it through the bell and joins it
    assert not listener.thread.is_alive()
    assert not _is_open(read)


def test_a_listener_busy_past_end_closes_its_bell_itself(bell, monkeypatch):
    read, write = bell
    monkeypatch.setattr(share, "_LISTENER_JOIN_S", 0.0)
    entered, release = threading.Event(), threading.Event()

    def on_ring() -> None:
        entered.set()
        release.wait()

    listener = share._Listener(read, on_ring, "chute-test-bell")
    os.write(write, b"\0")
    assert entered.wait(60)
    listener.end()  # gives up waiting at once: the thread is in on_ring
    assert listener.thread.is_alive() and _is_open(read)
    release.set()
    listener.thread.join(60)
    assert not listener.thread.is_alive()
    assert not _is_open(read)  # closed by the thread, once
