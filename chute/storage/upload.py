"""Writing a dataset to remote storage (or with compressed shards): the writer's upload side.

The writer builds each shard in a local staging directory as usual; this
uploads it (compressed first when asked) and the manifest last. Object stores
make each upload appear whole or not at all, so as on local disk a reader never
sees a manifest that lists a missing shard. Concurrent writers to one URL are
not detected (object stores have no ``flock``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from chute.errors import ChuteError
from chute.format.manifest import COMPRESSED_SUFFIX, MANIFEST_NAME, Manifest, ShardInfo, manifest_cap, parse_manifest
from chute.storage.net.remote import NotFound, Remote, TooLarge


class Upload:
    """Puts a writer's shards and manifest at ``url``."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, compression: str | None) -> None:
        if compression is not None and compression not in COMPRESSED_SUFFIX:
            raise ChuteError(f"unknown compression {compression!r}; chute knows {sorted(COMPRESSED_SUFFIX)}")
        if compression == "zstd" and importlib.util.find_spec("zstandard") is None:
            raise ChuteError("compression='zstd' needs the zstandard package: pip install 'chute[zstd]'") from None
        self.remote = Remote(url, storage_options)
        self.compression = compression
        self.uploaded: list[str] = []

    def previous(self) -> Manifest | None:
        """The manifest of a dataset already at the URL, if any."""
        try:
            text = self.remote.read(MANIFEST_NAME, manifest_cap()).decode("utf-8")
        except (NotFound, TooLarge):
            return None  # none, or one too large to read: replaced by this write
        try:
            return parse_manifest(text, f"{self.remote.url}/{MANIFEST_NAME}")
        except ChuteError:
            return None  # a damaged manifest: replaced by this write

    def put(self, local: str, info: ShardInfo) -> ShardInfo:
        """Upload the finished shard file ``local``; its manifest entry."""
        if self.compression is None:
            self.remote.upload(local, info.file)
            self.uploaded.append(info.file)
            return info
        import zstandard

        packed = local + COMPRESSED_SUFFIX[self.compression] + ".tmp"
        try:
            with open(local, "rb") as src, open(packed, "wb") as dst:
                zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(src, dst)
            info = dataclasses.replace(info, compression=self.compression, stored_bytes=os.path.getsize(packed))
            self.remote.upload(packed, info.stored_file)
            self.uploaded.append(info.stored_file)
        finally:
            if os.path.exists(packed):
                os.unlink(packed)
        return info

    def commit(self, manifest_text: str, previous: Manifest | None, shards: tuple[ShardInfo, ...]) -> None:
        """Put the manifest (the dataset is valid from here on), then delete the replaced dataset's shards."""
        self.remote.write_text(MANIFEST_NAME, manifest_text)
        if previous is not None:
            keep = {s.stored_file for s in shards}
            for old in previous.shards:
                if old.stored_file not in keep:
                    self.remote.remove(old.stored_file)

    def abort(self) -> None:
        """Delete what this write uploaded (a previous dataset at the URL stays valid)."""
        for name in self.uploaded:
            self.remote.remove(name)
        self.uploaded.clear()
