"""A local Ray (2 CPUs) for the whole session, and the S3 server fixtures of the storage tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.storage.conftest import default_cache, s3_bucket  # noqa: F401  (fixtures)


@pytest.fixture(scope="session")
def local_ray() -> Iterator[object]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("needs Ray (install the test extras: pip install -e '.[test]')")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()
