"""``chute.open``: a dataset from a local directory or a URL (remote shards are read through the node cache).

Storage decides where a dataset's shards come from; the reader
(``chute.format.reader``) only maps the local files it is given. A local
dataset's shards are its own files; a remote one's (or one whose shards are
stored compressed) come through a :class:`chute.storage.node.cache.ShardCache`,
which the reader uses as its shard source.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from chute._sizes import parse_size
from chute.errors import ManifestError, ShardError
from chute.format import validate
from chute.format.manifest import MANIFEST_NAME, local_path, manifest_cap, parse_manifest, read_manifest, too_large
from chute.format.reader import Dataset


def open_dataset(
    path: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int | None = None,
    verify: bool = True,
    progressive: bool = False,
    min_speed: int | str | None = None,
    min_speed_window: float | None = None,
    manifest_limit: int | str | None = None,
) -> Dataset:
    """Open the chute dataset at ``path``: a local directory holding ``manifest.json``, or a URL.

    A local dataset's shards are memory-mapped where they are. A remote one
    (``s3://``, ``gs://``, ``http(s)://``, any fsspec URL) has its manifest read
    now and its shards downloaded into the node cache ``cache_dir`` (default
    ``$CHUTE_CACHE_DIR`` or ``~/.cache/chute``) as they are needed, never holding
    more than ``cache_limit`` bytes there (a number or a string such as
    ``"20GB"``; default: no limit). ``storage_options`` go to fsspec (e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}`` for an S3-compatible store).
    A request that fails transiently (timeout, reset connection, HTTP 5xx,
    throttling) is tried up to ``retries`` times in all (default 8, about 20 s
    of backoff) before a :class:`chute.RemoteError` names the URL and the errors.
    A request that moves less than ``min_speed`` bytes/s (default 64 KiB/s; a
    number or a string such as ``"1MB"``; 0: no floor) over ``min_speed_window``
    seconds (default 30) is cancelled and retried, like a failed one.

    A manifest larger than ``manifest_limit`` bytes (a number or a string such as
    ``"256MB"``; default ``$CHUTE_MANIFEST_LIMIT``, else 64 MiB) is a
    :class:`chute.ManifestError`: no more than that is read or kept in memory.
    Every download is bounded by the manifest: a server that sends more bytes
    than a shard has fails that transfer (retried), and the cache never holds
    more than ``cache_limit``.

    ``progressive=True`` (a remote dataset with a ``cache_limit``): each
    epoch of a Loader covers the shards in the cache when it starts, while a
    background filler keeps rotating new shards in (docs/remote.md).

    Validates the manifest and, for a local dataset, that every shard exists with
    the size it lists. Each shard is checked when it is first read: its checksum
    (``verify=True``, the default; ``verify=False`` skips it) once per machine
    (remembered in chute's cache directory) and, once per process and always, the
    structure the reader relies on (offsets, buffer bounds, row count); see
    docs/format.md. :meth:`Dataset.verify` checks every shard at once.
    """
    cap = manifest_cap(manifest_limit)
    if progressive:
        if not _is_remote(os.fspath(path)):
            raise ValueError(
                f"progressive=True needs a remote dataset with a node cache; {os.fspath(path)} is local "
                "(all of it is there already: open it without progressive)"
            )
        if cache_limit is None:
            raise ValueError(
                f"progressive=True needs a cache_limit (chute.open({os.fspath(path)!r}, progressive=True, cache_limit=...)): "
                "the mode trains on what fits in the cache while it rotates"
            )
        ds = open_remote(os.fspath(path), cache_dir, cache_limit, storage_options, retries, verify=verify, min_speed=min_speed, min_speed_window=min_speed_window, manifest_limit=cap)
        ds.progressive = True
        return ds
    if _is_remote(os.fspath(path)):
        return open_remote(os.fspath(path), cache_dir, cache_limit, storage_options, retries, verify=verify, min_speed=min_speed, min_speed_window=min_speed_window, manifest_limit=cap)
    root = os.path.abspath(local_path(path, "open"))
    manifest_path = os.path.join(root, MANIFEST_NAME)
    if os.path.isfile(root):  # it exists: say what it is not, not that it is missing
        if _is_hdf5(root):
            raise ManifestError(
                f"{root} is an HDF5 file, not a chute dataset (a directory with a {MANIFEST_NAME}); chute.open returns "
                "a chute.Dataset (manifest, checksums, verify). Read the file in place with "
                f"chute.sources.open_hdf5({os.fspath(path)!r}) (its contiguous, uncompressed datasets: a view the Loader "
                f"takes), or convert it: chute convert {os.fspath(path)} DST, then open DST"
            )
        raise ManifestError(f"{root} is a file, not a chute dataset (a directory with a {MANIFEST_NAME}); "
                            "convert it first: chute convert SRC DST, then open DST")
    if not os.path.isdir(root):
        raise ManifestError(f"{root} does not exist or is not a directory; a chute dataset is a directory with a {MANIFEST_NAME}")
    try:
        text = read_manifest(manifest_path, cap)
    except FileNotFoundError:
        raise ManifestError(
            f"{root} has no {MANIFEST_NAME}: it is not a chute dataset, or its writer did not "
            "finish (the manifest is written last). Write the dataset again"
        ) from None
    manifest = parse_manifest(text, manifest_path)
    if any(info.compression for info in manifest.shards):  # compressed shards are read through the cache
        return open_remote("file://" + root, cache_dir, cache_limit, storage_options, retries, verify=verify, min_speed=min_speed, min_speed_window=min_speed_window, manifest_limit=cap)
    real_root = os.path.realpath(root)
    for info in manifest.shards:
        path_i = os.path.join(root, *info.file.split("/"))
        real = os.path.realpath(path_i)
        if os.path.commonpath([real, real_root]) != real_root:
            raise ManifestError(f"{manifest_path}: shard {info.file} resolves outside the dataset root ({real}); chute refuses to read it")
        try:
            size = os.path.getsize(path_i)
        except FileNotFoundError:
            raise ShardError(
                f"dataset {root}: shard {info.file} is missing; the dataset is incomplete: write or download it again"
            ) from None
        except OSError as exc:  # a name too long, a path through a file, no permission
            raise ShardError(
                f"dataset {root}: shard {info.file} cannot be read ({exc.strerror or exc}); the manifest is damaged "
                "or the dataset's files are not readable: write or download it again"
            ) from None
        if size != info.bytes:
            raise ShardError(
                f"dataset {root}: shard {info.file} is {size} bytes but the manifest says {info.bytes}; "
                "it is truncated or was replaced: write or download the dataset again"
            )
    validate.check_empty_shards(root, manifest, f"dataset {root}")
    return Dataset(root, manifest, text, verify=verify)


#: The first bytes of an HDF5 file (NetCDF4 files are HDF5 files).
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(path: str) -> bool:
    """Whether the file starts with HDF5's signature (read without h5py)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_HDF5_SIGNATURE)) == _HDF5_SIGNATURE
    except OSError:
        return False


def _is_remote(path: str) -> bool:
    """``is_remote(path)``, without importing the network stack (asyncio, ssl, http.client) for a local path."""
    if "://" not in path:
        return False
    from chute.storage.net.remote import is_remote

    return is_remote(path)


def open_remote(
    url: str,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int | None = None,
    *,
    verify: bool = True,
    min_speed: int | str | None = None,
    min_speed_window: float | None = None,
    manifest_limit: int | str | None = None,
) -> Dataset:
    """Read the manifest at ``url`` (at most ``manifest_limit`` bytes, see :func:`manifest_cap`) and return
    the dataset, its shards read through the node cache."""
    from chute.storage.net.remote import NotFound, Remote, RetryPolicy, TooLarge
    from chute.storage.node.cache import ShardCache

    retry = RetryPolicy()
    if retries is not None:
        retry = dataclasses.replace(retry, attempts=max(1, int(retries)))
    if min_speed is not None:
        retry = dataclasses.replace(retry, min_speed=parse_size(min_speed) if isinstance(min_speed, str) else int(min_speed))
    if min_speed_window is not None:
        retry = dataclasses.replace(retry, min_speed_window=float(min_speed_window))
    remote = Remote(url, dict(storage_options or {}), retry)
    where = f"{remote.url}/{MANIFEST_NAME}"
    cap = manifest_cap(manifest_limit)
    try:
        text = remote.read(MANIFEST_NAME, cap).decode("utf-8")
    except TooLarge:
        raise ManifestError(too_large(where, cap)) from None
    except NotFound:
        raise ManifestError(
            f"{where} does not exist: {remote.url} is not a chute dataset, or its writer did not finish "
            "(the manifest is written last)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{where} is not UTF-8 text (at byte {exc.start}); the manifest is damaged: write the dataset again") from None
    manifest = parse_manifest(text, where)
    limit = None if cache_limit is None else parse_size(cache_limit)
    cache = ShardCache(remote, manifest, None if cache_dir is None else os.fspath(cache_dir), limit)
    return Dataset(remote.url, manifest, text, cache, verify=verify)
