"""Fixtures of the pipeline's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pipeline._helpers import loader_threads, native_threads


@pytest.fixture
def no_loader_threads_left() -> Iterator[None]:
    """After the test, no Loader's worker thread is left, Python's or native (``pytestmark =
    pytest.mark.usefixtures(...)``)."""
    yield
    assert [t.name for t in loader_threads()] == []
    assert native_threads() == []
