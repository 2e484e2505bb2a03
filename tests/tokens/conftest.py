"""Fixtures of the token tests: the real S3 server (moto) of the storage tests."""

from tests.storage.conftest import default_cache, moto_s3, s3_bucket  # noqa: F401
