"""Shared fixtures: small generated datasets and a leak check."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest


def _open_fds() -> set[str]:
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return fds


@pytest.fixture
def no_fd_leak():
    """Fails the test if it leaves a file under its tmp dir open."""
    before = _open_fds()
    yield
    gc.collect()  # a dataset the test dropped may sit in a reference cycle until collected
    leaked = {f for f in _open_fds() - before if "pytest" in f or "/tmp" in f}
    assert not leaked, f"file descriptors left open: {sorted(leaked)}"


def image_samples(n: int, shape=(3, 8, 8), seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {"image": rng.integers(0, 256, shape, dtype=np.uint8), "label": i}
