"""``chute.write`` and ``chute.Writer``: a dataset written to a local directory or a URL.

The format's writer (``chute.format.writer``) builds shards in a local
directory and knows nothing of where they go next. This module picks that
directory and, for a URL (or compressed shards), the upload that puts each
finished shard and the manifest in place (chute/storage/upload.py).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chute.errors import ChuteError
from chute.format import writer as _format
from chute.format.manifest import local_path
from chute.format.reader import Dataset
from chute.format.writer import Target, WriteOptions, write_options
from chute.storage.net.remote import is_remote
from chute.storage.open import open_dataset
from chute.storage.upload import Upload

if TYPE_CHECKING:
    from typing_extensions import Unpack


class StoreOptions(WriteOptions, total=False):
    """:class:`chute.format.writer.WriteOptions` and where the dataset goes: ``compression="zstd"`` stores each
    shard compressed as a whole file, ``storage_options`` go to fsspec for a URL."""

    compression: str | None
    storage_options: Mapping[str, Any] | None


#: The defaults :class:`StoreOptions` adds.
STORE_DEFAULTS: dict[str, Any] = {"compression": None, "storage_options": None}


def store_options(given: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``given`` with every :class:`StoreOptions` default filled in; a TypeError naming any other argument."""
    return write_options(given, where, STORE_DEFAULTS)


def destination(path: str | os.PathLike, storage_options: Mapping[str, Any] | None, compression: str | None) -> Target:
    """Where a dataset at ``path`` is written: ``(root, url, upload, staging)``.

    ``root`` is the local directory shards are built in: the dataset directory
    itself, or for a URL a new staging directory (``staging``, to remove when
    done) whose shards ``upload`` puts at ``url``. A local dataset with
    compressed shards also has an ``upload`` (to ``file://root``).
    """
    text = os.fspath(path)
    upload: Upload | None
    if is_remote(text):
        if text.startswith(("http://", "https://")):
            raise ChuteError(
                f"cannot write to {text}: HTTP servers are read-only for chute; write the dataset to a "
                "local directory or an object store and serve that"
            )
        url = text.rstrip("/")
        upload = Upload(url, dict(storage_options or {}), compression)
        staging = tempfile.mkdtemp(prefix="chute-write-")
        return Target(staging, url, upload, staging)
    root = os.path.abspath(local_path(text, "write to"))
    upload = None if compression is None else Upload("file://" + root, None, compression)
    return Target(root, root, upload, None)


class Writer(_format.Writer):
    """Writes samples (dicts of column name to value) into a chute dataset at ``path``.

    Use as a context manager; leaving the block normally commits the dataset, an
    exception discards everything this writer wrote::

        with chute.Writer("/data/ds", shard_size="64MB") as w:
            for sample in samples:
                w.append(sample)

    Without ``schema`` the column types are inferred from the first ``lookahead``
    samples (so a column whose shape varies within that window becomes ragged) and
    every later sample is checked against them. ``path`` may be a URL
    (``storage_options`` go to fsspec); ``compression="zstd"`` stores each shard
    compressed as a whole file.
    """

    def __init__(
        self, path: str | os.PathLike, *, compression: str | None = None, storage_options: Mapping[str, Any] | None = None,
        **options: Unpack[WriteOptions],
    ) -> None:
        super().__init__(path, target=destination(path, storage_options, compression), **options)


def write(samples: Iterable[Mapping[str, Any]], path: str | os.PathLike, **options: Unpack[StoreOptions]) -> Dataset:
    """Write ``samples`` (an iterable of dicts) as a chute dataset at ``path`` and open it.

    Values may be numpy arrays, torch tensors, lists of numbers, bytes, str, numbers
    and dicts with str keys. ``shard_size`` is the target size of one shard in bytes
    (or a string such as ``"128MB"``). See :class:`Writer` for the schema rules, the
    other options (:class:`StoreOptions`) and what happens when writing fails.

    ``path`` may be a URL (``s3://bucket/prefix``, any fsspec URL that can be
    written; ``storage_options`` go to fsspec): shards are built locally, uploaded
    as they are finished, and the manifest is uploaded last. ``compression="zstd"``
    stores each shard compressed as a whole file; readers decompress it into
    their cache.
    """
    store_options(options, "chute.write")  # an unknown argument fails before anything is written
    with Writer(path, **options) as writer:
        for sample in samples:
            writer.append(sample)
    return open_dataset(writer.url, storage_options=options.get("storage_options"))


__all__ = ["Writer", "write", "destination", "StoreOptions", "store_options"]
