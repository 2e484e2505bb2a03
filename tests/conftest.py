"""Shared fixtures: small generated datasets and a leak check."""

from __future__ import annotations

import gc
import importlib.util
import os
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from tests.servers import MotoS3Server, s3_client_env


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


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (install the test extras: pip install -e '.[test]')")


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3Server]:
    """moto's S3 in a child process, one for the whole run (s3fs caches its clients by their arguments, not by
    the endpoint in the environment: a second server would be sent the first one's requests)."""
    _require("moto", "flask", "boto3", "s3fs")
    with pytest.MonkeyPatch.context() as mp:
        with MotoS3Server() as server:
            for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
                mp.delenv(key, raising=False)
            for key, value in s3_client_env(server.endpoint_url).items():
                mp.setenv(key, value)
            yield server


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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """Collect a Loader the test dropped before the fixtures check that no chute thread is left.

    A Loader's worker threads are kept across its passes and stop when it is
    closed or collected. One the test dropped may sit in a reference cycle
    that only the collector frees (a test's frame and the exception of a
    ``pytest.raises(...) as info`` in it hold each other), and when the
    collector last ran must not decide whether a later check passes. (That
    chute itself makes no such cycle, tests/pipeline/test_passes.py checks with
    the collector off.)
    """
    if any(t.name.startswith("chute-") for t in threading.enumerate()):
        gc.collect()


def image_samples(n: int, shape=(3, 8, 8), seed: int = 0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {"image": rng.integers(0, 256, shape, dtype=np.uint8), "label": i}


# --------------------------------------------------------------------------- CI: no silent skips
# With CI set (CI=true, as .ci/run and most CI services do), a skipped test fails the
# session unless it needs a CUDA device (the `cuda` marker, or a skip saying so): a
# missing test extra must not hide a whole suite.

_SKIPS: list[str] = []


def _skip_allowed(report) -> bool:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return "cuda" in getattr(report, "keywords", {}) or "CUDA device" in reason


def _note_skip(report) -> None:
    if os.environ.get("CI", "").lower() in ("", "0", "false", "no") or not report.skipped or _skip_allowed(report):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    _SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report):
    _note_skip(report)


def pytest_collectreport(report):
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if _SKIPS:
        print(f"\nCI is set and {len(_SKIPS)} test(s) or module(s) were skipped for a reason other than a missing CUDA device:")
        for line in _SKIPS:
            print(f"  {line}")
        print("install the test extras (pip install -e '.[test]') or fix the skip; unset CI to allow skips locally")
        session.exitstatus = 1
