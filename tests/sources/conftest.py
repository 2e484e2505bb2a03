"""Fixtures for the converter tests."""

from __future__ import annotations

import pytest
from source_data import write_pickle_index


@pytest.fixture
def pickle_index(tmp_path):
    """The write-up's layout (CSV index + per-sample .pkl.gz dicts) with 40 samples: (index.csv path, the dicts in order)."""
    return write_pickle_index(tmp_path / "src", 40)


from tests.storage.conftest import default_cache, http_server, s3_bucket  # noqa: E402,F401  (real servers)
