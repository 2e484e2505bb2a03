"""The manifest: the JSON file that makes a directory of shards a chute dataset.

A dataset is valid exactly when ``manifest.json`` exists, parses, has a known
format version, and every shard it lists is inside the dataset root. The writer
writes the manifest last, under a temporary name renamed into place, so a
directory whose writer died has no manifest and is rejected.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import posixpath
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from chute.errors import ManifestError
from chute.format.schema import Schema

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "chute"
FORMAT_VERSION = 1
CHECKSUM_ALGORITHMS = ("xxh3_128", "blake2b")
COMPRESSED_SUFFIX = {"zstd": ".zst"}


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard as the manifest lists it."""

    file: str
    rows: int
    bytes: int
    checksum: str  # "<algorithm>:<hex digest>"
    # A shard stored compressed as a whole file (remote stores): the object is
    # ``file + ".zst"`` of ``stored_bytes`` bytes; ``bytes`` and ``checksum`` are the
    # decompressed Arrow file's, as the cache holds it.
    compression: str | None = None
    stored_bytes: int | None = None

    @property
    def stored_file(self) -> str:
        return self.file + COMPRESSED_SUFFIX[self.compression] if self.compression else self.file

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "rows": self.rows, "bytes": self.bytes, "checksum": self.checksum}
        if self.compression:
            out["compression"] = self.compression
            out["stored_bytes"] = self.stored_bytes
        return out


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The parsed contents of ``manifest.json``."""

    schema: Schema
    shards: tuple[ShardInfo, ...]
    metadata: dict[str, Any]
    arrow_schema: pa.Schema
    created_by: str = ""

    @property
    def rows(self) -> int:
        return sum(shard.rows for shard in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created_by": self.created_by,
            "rows": self.rows,
            "columns": self.schema.to_json(),
            "arrow_schema": base64.b64encode(self.arrow_schema.serialize().to_pybytes()).decode("ascii"),
            "shards": [shard.to_json() for shard in self.shards],
            "metadata": self.metadata,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n"


def checksum_file(path: str | os.PathLike, algorithm: str = "xxh3_128", chunk: int = 8 << 20) -> str:
    """The ``"<algorithm>:<hex>"`` checksum of a file's bytes."""
    if algorithm == "xxh3_128":
        import xxhash

        hasher = xxhash.xxh3_128()
    elif algorithm == "blake2b":
        import hashlib

        hasher = hashlib.blake2b(digest_size=16)
    else:
        raise ManifestError(f"unknown checksum algorithm {algorithm!r}; chute knows {CHECKSUM_ALGORITHMS}")
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(chunk)
        view = memoryview(buffer)
        while n := f.readinto(buffer):
            hasher.update(view[:n])
    return f"{algorithm}:{hasher.hexdigest()}"


def local_path(path: str | os.PathLike, action: str) -> str:
    """``path`` as a local file-system path (``file://`` stripped); another URL is refused.

    ``action`` completes the message, e.g. ``"write to"`` or ``"open"``.
    """
    text = os.fspath(path)
    if text.startswith("file://"):
        return text[len("file://") :]
    if "://" in text:
        raise ManifestError(f"cannot {action} {text} as a local path: it is a URL")
    return text


def check_shard_path(file: str, where: str) -> str:
    """Reject shard paths that could escape the dataset root; return the normalised path."""
    if not isinstance(file, str) or not file:
        raise ManifestError(f"{where}: shard file name {file!r} is not a non-empty string")
    if "\\" in file or "\x00" in file:
        raise ManifestError(f"{where}: shard path {file!r} contains a backslash or NUL; use '/' separated relative paths")
    if file.startswith("/") or posixpath.isabs(file) or (len(file) > 1 and file[1] == ":"):
        raise ManifestError(
            f"{where}: shard path {file!r} is absolute; shard paths must be relative to the "
            "dataset root. The manifest is corrupt or was not written by chute: rewrite the dataset"
        )
    normal = posixpath.normpath(file)
    if normal == ".." or normal.startswith("../") or normal == ".":
        raise ManifestError(
            f"{where}: shard path {file!r} escapes the dataset root; chute refuses to read files "
            "outside the dataset directory. The manifest is corrupt or hostile: rewrite the dataset"
        )
    return normal


def parse_manifest(text: str, where: str) -> Manifest:
    """Parse and validate manifest text; ``where`` names the file in error messages."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{where} is not valid JSON ({exc}); the dataset is damaged: write it again") from None
    if not isinstance(data, Mapping):
        raise ManifestError(f"{where} does not hold a JSON object; it is not a chute manifest")
    if data.get("format") != FORMAT_NAME:
        raise ManifestError(f"{where} is not a chute manifest (format is {data.get('format')!r}, expected 'chute')")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{where} has format version {version!r}; this chute reads version {FORMAT_VERSION}. "
            "Upgrade chute if the dataset is newer, or convert it again with this version"
        )
    try:
        schema = Schema.from_json(data["columns"])
        arrow_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow_schema"])))
        raw_shards = data["shards"]
        metadata = dict(data.get("metadata") or {})
    except KeyError as exc:
        raise ManifestError(f"{where} lacks the field {exc.args[0]!r}; the manifest is damaged: write the dataset again") from None
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise ManifestError(f"{where} has an invalid schema ({exc}); write the dataset again") from None
    if not arrow_schema.equals(schema.to_arrow(), check_metadata=False):
        raise ManifestError(f"{where}: its Arrow schema does not match its column list; the manifest is damaged")
    shards = []
    seen = set()
    for i, entry in enumerate(raw_shards):
        try:
            shard = ShardInfo(
                file=check_shard_path(entry["file"], f"{where}, shard {i}"),
                rows=int(entry["rows"]),
                bytes=int(entry["bytes"]),
                checksum=str(entry["checksum"]),
                compression=entry.get("compression"),
                stored_bytes=None if entry.get("stored_bytes") is None else int(entry["stored_bytes"]),
            )
            if shard.compression is not None and shard.compression not in COMPRESSED_SUFFIX:
                raise ValueError(f"unknown compression {shard.compression!r} (chute knows {sorted(COMPRESSED_SUFFIX)})")
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{where}, shard {i}: invalid entry {entry!r} ({exc})") from None
        if shard.rows < 0 or shard.bytes <= 0:
            raise ManifestError(f"{where}, shard {i} ({shard.file}): invalid row count or byte size")
        if shard.checksum.split(":", 1)[0] not in CHECKSUM_ALGORITHMS:
            raise ManifestError(f"{where}, shard {i} ({shard.file}): unknown checksum {shard.checksum!r}")
        if shard.file in seen:
            raise ManifestError(f"{where}: shard {shard.file} is listed twice")
        seen.add(shard.file)
        shards.append(shard)
    return Manifest(schema, tuple(shards), metadata, arrow_schema, str(data.get("created_by", "")))
