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


class StallError(ChuteError):
    """No batch reached the training loop within the watchdog timeout (``chute.Watchdog(..., on_stall="raise")``).

    ``report`` holds the watchdog's full stall report: thread and worker stacks,
    reads in flight, the samples being built and the queue depths.
    """

    def __init__(self, message: str, report: str = "") -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self):  # keep ``report`` when pickled (e.g. across processes)
        return (type(self), (self.args[0] if self.args else "", self.report))


class RemoteError(ChuteError):
    """A request to remote storage failed for good: after its retries, or at once when retrying cannot help."""


class CacheFullError(ChuteError):
    """The cache limit is too small for the shards that must be in the cache at once."""


class WriteError(ChuteError):
    """Writing a dataset failed on the file system (the disk is full, a file grew past a limit):
    nothing half-written is left, the message names the path and what to do."""


class TextError(ChuteError):
    """A text corpus cannot be read as documents: a missing key or column, a value that is not a string, bad JSON,
    or bytes that do not decode (the message names the file and line or row, and what to do)."""
