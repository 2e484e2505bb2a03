"""Fixtures that start real servers on 127.0.0.1 for the remote-storage tests.

- ``moto_s3`` (session, defined in tests/conftest.py so that the whole run has ONE
  server: s3fs caches its clients, and a second server would get the first one's): moto's S3 in a child process. While it runs, the
  environment sends every botocore/s3fs client to it with dummy credentials
  (``tests.servers.s3_client_env``); ``moto_s3.storage_options`` are the same
  settings as s3fs keyword arguments.
- ``s3_bucket``: a fresh, empty bucket per test, as ``"s3://<name>"``; emptied
  and deleted afterwards.
- ``s3_proxy``: a ``FaultyHTTPServer`` forwarding to moto, for S3 faults and
  outages (``s3_storage_options(s3_proxy.endpoint_url)`` reaches S3 through it;
  stopping it does not lose moto's data).
- ``http_server``: a ``FaultyHTTPServer`` over an empty directory
  (``http_server.root``); the test writes its dataset there.

Each skips with the reason when the test extras (moto[server], s3fs, aiohttp)
are missing.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import FaultyHTTPServer, MotoS3Server


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (install the test extras: pip install -e '.[test]')")


@pytest.fixture
def s3_bucket(moto_s3: MotoS3Server) -> Iterator[str]:
    name = f"chute-test-{uuid.uuid4().hex[:16]}"
    url = moto_s3.create_bucket(name)
    yield url
    moto_s3.delete_bucket(name)


@pytest.fixture
def s3_proxy(moto_s3: MotoS3Server) -> Iterator[FaultyHTTPServer]:
    with FaultyHTTPServer(upstream=moto_s3.endpoint_url) as proxy:
        yield proxy
    assert not proxy.errors, proxy.errors


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[FaultyHTTPServer]:
    _require("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    with FaultyHTTPServer(root) as server:
        yield server
    assert not server.errors, server.errors


@pytest.fixture(autouse=True)
def default_cache(tmp_path, monkeypatch) -> str:
    """The default cache directory, inside the test's tmp dir: ``chute.write`` to a URL opens the
    result with it, and nothing may land in the user's ~/.cache/chute."""
    path = str(tmp_path / "default-cache")
    monkeypatch.setenv("CHUTE_CACHE_DIR", path)
    return path
