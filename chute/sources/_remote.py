"""Sources in remote storage (``s3://``, ``gs://``, ``https://``): read through chute's fsspec layer.

Every request goes through :class:`chute.storage.net.remote.Remote`, so a source
file gets the same retries, backoff and error messages as a dataset's shards.
Small files (an index, the per-sample files it lists) are read into memory; a
file a converter streams (Parquet, jsonl, tar) is downloaded to a temporary
local copy first, removed when the conversion ends.

What a server sends is bounded before it is kept: a file read into memory by
:data:`READ_LIMIT` (``CHUTE_SOURCE_READ_LIMIT`` changes it), a local copy by the
size the server gave for the object (a body longer or shorter is a transfer
error, retried) and by the room on the disk it is copied to, less
:data:`DISK_RESERVE`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from chute._sizes import format_size, parse_size
from chute.errors import ChuteError
from chute.storage.net.remote import NotFound, Remote, TooLarge, is_remote

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


#: The most bytes a source file read whole into memory (an index, one sample's file) may have.
READ_LIMIT = 4 << 30
#: Left free on the disk a remote source file is copied to.
DISK_RESERVE = 1 << 30


def read_limit() -> int:
    """:data:`READ_LIMIT`, or ``CHUTE_SOURCE_READ_LIMIT`` (a size such as ``8GiB``) where it is set."""
    text = os.environ.get("CHUTE_SOURCE_READ_LIMIT")
    if not text:
        return READ_LIMIT
    try:
        limit = parse_size(text)
    except ValueError as exc:
        raise ChuteError(f"CHUTE_SOURCE_READ_LIMIT={text!r}: {exc}") from None
    if limit <= 0:
        raise ChuteError(f"CHUTE_SOURCE_READ_LIMIT={text!r}: must be more than 0 bytes")
    return limit


def read_url(url: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of the object at ``url`` (retried like a shard download); FileNotFoundError if there is none."""
    remote, name = remote_for(url, storage_options)
    limit = read_limit()
    try:
        return remote.read(name, limit=limit)
    except NotFound:
        raise FileNotFoundError(f"{url} does not exist") from None
    except TooLarge:
        raise ChuteError(
            f"{url} is larger than {format_size(limit)}, the most chute reads of one source file into memory; "
            "set CHUTE_SOURCE_READ_LIMIT (e.g. 16GiB) to allow more"
        ) from None
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
        try:
            size = remote.size(name)
        except NotFound:
            raise ChuteError(f"{url} does not exist") from None
        room = shutil.disk_usage(folder).free - DISK_RESERVE
        if size is not None and size > room:
            raise ChuteError(_no_room(url, folder, size, room))
        with open(path, "wb") as f:
            written = 0

            def write(chunk: bytes) -> None:
                nonlocal written
                written += len(chunk)
                if written > room:
                    raise ChuteError(_no_room(url, folder, None, room))
                f.write(chunk)

            def restart() -> None:
                nonlocal written
                written = 0
                f.seek(0)
                f.truncate()

            try:
                remote.download_stream(name, write, restart, size=size)
            except NotFound:
                raise ChuteError(f"{url} does not exist") from None
        yield path
    finally:
        remote.close()
        shutil.rmtree(folder, ignore_errors=True)


def _no_room(url: str, folder: str, size: int | None, room: int) -> str:
    what = f"its {format_size(size)}" if size is not None else "more than that"
    return (f"copying {url} to {folder} needs {what} and would leave less than {format_size(DISK_RESERVE)} free on that "
            f"disk ({format_size(max(room, 0))} to use); point TMPDIR at a disk with room")
