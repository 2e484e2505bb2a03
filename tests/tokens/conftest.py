"""Fixtures of the token tests: the real S3 server (moto) of the storage tests."""

from tests.storage.conftest import default_cache, s3_bucket  # noqa: F401
