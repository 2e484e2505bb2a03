"""Sources in remote storage (``s3://``, ``gs://``, ``https://``): read through chute's fsspec layer.

Every request goes through :class:`chute.storage.net.remote.Remote`, so a source
file gets the same retries, backoff and error messages as a dataset's shards.
Small files (an index, the per-sample files it lists) are read into memory; a
file a converter streams (Parquet, jsonl, tar) is downloaded to a temporary
local copy first, removed when the conversion ends.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from chute.errors import ChuteError
from chute.storage.net.remote import NotFound, Remote, is_remote

__all__ = ["is_remote", "join_url", "local_copy", "read_url", "remote_for", "split_url", "url_exists"]


def split_url(url: str) -> tuple[str, str]:
    """``("s3://b/dir", "index.csv")`` for ``s3://b/dir/index.csv``."""
    scheme, _, rest = url.partition("://")
    head, _, name = rest.rstrip("/").rpartition("/")
    if not head or not name:
        raise ChuteError(f"{url} names no file: give the URL of the file itself (s3://bucket/dir/index.csv)")
    return f"{scheme}://{head}", name


def join_url(base: str, path: str) -> str:
    """``path`` (relative, ``/``-separated) resolved against the URL folder ``base``; a URL stays as it is."""
    if is_remote(path):
        return path
    scheme, _, rest = base.partition("://")
    return f"{scheme}://{posixpath.normpath(posixpath.join(rest, path))}"


def remote_for(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Remote, str]:
    """The :class:`Remote` of the folder holding ``url``, and the file's name in it."""
    base, name = split_url(url)
    return Remote(base, dict(storage_options or {})), name


def read_url(url: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of the object at ``url`` (retried like a shard download); FileNotFoundError if there is none."""
    remote, name = remote_for(url, storage_options)
    try:
        return remote.read(name)
    except NotFound:
        raise FileNotFoundError(f"{url} does not exist") from None
    finally:
        remote.close()


def url_exists(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    remote, name = remote_for(url, storage_options)
    try:
        return remote.exists(name)
    finally:
        remote.close()


@contextlib.contextmanager
def local_copy(url: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[str]:
    """A temporary local copy of the object at ``url`` (its file name kept, for detection by extension)."""
    remote, name = remote_for(url, storage_options)
    folder = tempfile.mkdtemp(prefix="chute-source-")
    path = os.path.join(folder, name)
    try:
        with open(path, "wb") as f:

            def restart() -> None:
                f.seek(0)
                f.truncate()

            try:
                remote.download_stream(name, cast("Callable[[bytes], None]", f.write), restart)
            except NotFound:
                raise ChuteError(f"{url} does not exist") from None
        yield path
    finally:
        remote.close()
        shutil.rmtree(folder, ignore_errors=True)
