"""Exception classes. Every error chute raises on purpose is a ``ChuteError``."""

from __future__ import annotations


class ChuteError(Exception):
    """Base class for errors chute raises on purpose.

    Messages name the dataset, shard, file or URL involved and say what to do.
    """


class SchemaError(ChuteError):
    """A sample does not match the dataset's schema, or a schema is invalid."""


class ManifestError(ChuteError):
    """A dataset's manifest is missing, unreadable or refers to invalid shards."""


class ShardError(ChuteError):
    """A shard is missing, truncated, corrupt or does not match the manifest."""


class PickleRefusedError(ChuteError):
    """A source holds pickled data and the caller did not opt in to unpickling it."""
