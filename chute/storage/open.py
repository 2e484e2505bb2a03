"""Opening a dataset that lives in remote storage (or whose shards are stored compressed)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from chute._sizes import parse_size
from chute.errors import ManifestError
from chute.format.manifest import MANIFEST_NAME, parse_manifest
from chute.format.reader import Dataset
from chute.storage.cache import ShardCache
from chute.storage.remote import NotFound, Remote, RetryPolicy


def open_remote(
    url: str,
    cache_dir: str | os.PathLike | None = None,
    cache_limit: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int | None = None,
    *,
    verify: bool = True,
) -> Dataset:
    """Read the manifest at ``url`` and return the dataset, its shards read through the node cache."""
    retry = RetryPolicy() if retries is None else RetryPolicy(attempts=max(1, int(retries)))
    remote = Remote(url, dict(storage_options or {}), retry)
    where = f"{remote.url}/{MANIFEST_NAME}"
    try:
        text = remote.read(MANIFEST_NAME).decode("utf-8")
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
