"""Shared fixtures: small generated datasets and a leak check."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest


@pytest.fixture(scope="session", autouse=True)
def chute_cache_dir(tmp_path_factory):
    """chute's files of this machine (the node cache, the marks of verified shards) go to a temporary
    directory, never the user's ~/.cache/chute (tests that need their own set CHUTE_CACHE_DIR again)."""
    path = str(tmp_path_factory.mktemp("chute-cache"))
    previous = os.environ.get("CHUTE_CACHE_DIR")
    os.environ["CHUTE_CACHE_DIR"] = path
    yield path
    if previous is None:
        os.environ.pop("CHUTE_CACHE_DIR", None)
    else:
        os.environ["CHUTE_CACHE_DIR"] = previous


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
