"""The manifest: the JSON file that makes a directory of shards a chute dataset.

A dataset is valid exactly when ``manifest.json`` exists, parses, has a known
format version, and every shard it lists is inside the dataset root. The writer
writes the manifest last, under a temporary name renamed into place, so a
directory whose writer died has no manifest and is rejected.

Every field is checked for its type and range before it is used (a hostile or
damaged manifest gives a :class:`ManifestError` naming the field, never another
exception): row counts and byte sizes are integers from 0 to ``MAX_COUNT`` and
so are their sums (so int64 offsets cannot wrap), tensor shapes fit Arrow's
32-bit list sizes, the top-level ``rows`` equals the shards' sum.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import posixpath
import threading
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from chute._bounded import read_within
from chute._sizes import parse_size
from chute.errors import ChuteError, ManifestError
from chute.format.schema import Schema

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "chute"
FORMAT_VERSION = 1
CHECKSUM_ALGORITHMS = ("xxh3_128", "blake2b")
COMPRESSED_SUFFIX = {"zstd": ".zst"}
_DIGEST_HEX = {"xxh3_128": 32, "blake2b": 32}

#: The most rows or bytes a shard, or a whole dataset, may list: exact in every JSON
#: reader (2**53), and far from int64 overflow however the offsets are summed.
MAX_COUNT = 2**53
#: Arrow's fixed-size lists have 32-bit sizes: a tensor row holds fewer elements.
MAX_ROW_ELEMENTS = 2**31 - 1
MAX_NDIM = 32


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


_buffers = threading.local()


def new_hasher(algorithm: str) -> Any:
    """A fresh hash object of ``algorithm`` (one of ``CHECKSUM_ALGORITHMS``): ``update(bytes)``, ``hexdigest()``."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "blake2b":
        import hashlib

        return hashlib.blake2b(digest_size=16)
    raise ManifestError(f"unknown checksum algorithm {algorithm!r}; chute knows {CHECKSUM_ALGORITHMS}")


def checksum_fd(fd: int, algorithm: str = "xxh3_128", chunk: int = 1 << 20) -> str:
    """The ``"<algorithm>:<hex>"`` checksum of the file open at ``fd``, read with ``pread`` into a buffer
    this thread reuses (a new zeroed buffer per file cost more than the hash on small shards).

    Faster than hashing through a mapping, which pays a page fault per 4 KiB (docs/benchmarks.md,
    design figures).
    """
    hasher = new_hasher(algorithm)
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) != chunk:
        buffer = _buffers.buffer = bytearray(chunk)
    view = memoryview(buffer)
    offset = 0
    while n := os.preadv(fd, [buffer], offset):
        hasher.update(view[:n])
        offset += n
    return f"{algorithm}:{hasher.hexdigest()}"


def checksum_file(path: str | os.PathLike, algorithm: str = "xxh3_128") -> str:
    """The ``"<algorithm>:<hex>"`` checksum of a file's bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        return checksum_fd(fd, algorithm)
    finally:
        os.close(fd)


def local_path(path: str | os.PathLike, action: str) -> str:
    """``path`` as a local file-system path (``file://`` stripped, ``~`` expanded); another URL is refused.

    ``action`` completes the message, e.g. ``"write to"`` or ``"open"``.
    """
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise ManifestError(f"cannot {action} {text} as a local path: it is a URL")
    return os.path.expanduser(text)


#: The largest manifest read (bytes), unless chute.open's manifest_limit or CHUTE_MANIFEST_LIMIT says otherwise.
MANIFEST_LIMIT = 64 << 20
MANIFEST_LIMIT_ENV = "CHUTE_MANIFEST_LIMIT"


def manifest_cap(value: int | str | None = None) -> int:
    """The cap on a manifest's size in bytes: ``value`` (a number, or a string such as ``"256MB"``), else
    ``$CHUTE_MANIFEST_LIMIT``, else :data:`MANIFEST_LIMIT`."""
    source = "manifest_limit"
    if value is None:
        value, source = os.environ.get(MANIFEST_LIMIT_ENV) or MANIFEST_LIMIT, MANIFEST_LIMIT_ENV
    try:
        cap = parse_size(value)
    except ValueError as exc:
        raise ValueError(f"{source} must be a number of bytes or a size such as '64MB' ({exc})") from None
    if cap <= 0:
        raise ValueError(f"{source} must be a positive number of bytes, got {value!r}")
    return cap


def read_manifest(path: str, limit: int | None = None) -> str:
    """The text of the manifest file ``path`` (UTF-8); ManifestError if it cannot be read as such, or if it is
    larger than ``limit`` bytes (read no further than that)."""
    try:
        with open(path, "rb") as f:
            parts: list[bytes] = []
            if limit is None:
                parts.append(f.read())
            elif read_within(f.read, limit, parts.append) > limit:
                raise ManifestError(too_large(path, limit))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    data = b"".join(parts)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path} is not UTF-8 text (byte {exc.start} is {data[exc.start:exc.start + 1]!r}); the manifest is "
            "damaged: write the dataset again"
        ) from None


def too_large(where: str, limit: int) -> str:
    """The message of a manifest larger than the cap on manifests."""
    return (f"{where} is larger than {limit:,} bytes, the most chute reads of a manifest; if the dataset really "
            "has one that large, raise the cap: chute.open(..., manifest_limit=\"256MB\") or CHUTE_MANIFEST_LIMIT=256MB")


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


def _show(value: Any) -> str:
    """A short repr of a manifest value for an error message."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 64 else f"{value:.3e}"
    return text if len(text) <= 80 else text[:77] + "..."


def _count(value: Any, where: str, field: str, low: int = 0) -> int:
    """An integer field in ``[low, MAX_COUNT]`` (not a float, not a bool)."""
    if type(value) is not int or not low <= value <= MAX_COUNT:
        raise ManifestError(
            f"{where}: field {field} must be an integer from {low} to 2**53, got {_show(value)}; "
            "the manifest is damaged: write the dataset again"
        )
    return value


def _check_columns(columns: Any, where: str) -> None:
    """The column list's structure, before the schema classes see it (shapes that would overflow)."""
    if not isinstance(columns, list) or not columns:
        raise ManifestError(f"{where}: field columns must be a non-empty list of column objects, got {_show(columns)}")
    for k, entry in enumerate(columns):
        field = f"columns[{k}]"
        if not isinstance(entry, Mapping):
            raise ManifestError(f"{where}: field {field} must be an object, got {_show(entry)}")
        if not isinstance(entry.get("name"), str) or not isinstance(entry.get("kind"), str):
            raise ManifestError(f"{where}: field {field} needs a string name and kind, got {_show(dict(entry))}")
        if "shape" in entry:
            shape = entry["shape"]
            if (not isinstance(shape, list) or not 1 <= len(shape) <= MAX_NDIM
                    or any(type(d) is not int or not 0 <= d <= MAX_ROW_ELEMENTS for d in shape)
                    or math.prod(shape) > MAX_ROW_ELEMENTS):
                raise ManifestError(
                    f"{where}: field {field}.shape must list 1 to {MAX_NDIM} sizes whose product is at most "
                    f"2**31-1 elements, got {_show(shape)}"
                )
        if "ndim" in entry and (type(entry["ndim"]) is not int or not 1 <= entry["ndim"] <= MAX_NDIM):
            raise ManifestError(f"{where}: field {field}.ndim must be an integer from 1 to {MAX_NDIM}, got {_show(entry['ndim'])}")
        for key in ("dtype", "value"):
            if key in entry and not isinstance(entry[key], str):
                raise ManifestError(f"{where}: field {field}.{key} must be a string, got {_show(entry[key])}")


def _parse_shard(entry: Any, i: int, where: str) -> ShardInfo:
    field = f"shards[{i}]"
    if not isinstance(entry, Mapping):
        raise ManifestError(f"{where}: field {field} must be an object, got {_show(entry)}")
    for key in ("file", "rows", "bytes", "checksum"):
        if key not in entry:
            raise ManifestError(f"{where}: field {field} lacks {key!r}; the manifest is damaged: write the dataset again")
    file = check_shard_path(entry["file"], f"{where}, shard {i} (field {field}.file)")
    rows = _count(entry["rows"], where, f"{field}.rows")
    size = _count(entry["bytes"], where, f"{field}.bytes", low=1)
    checksum = entry["checksum"]
    algorithm, _, digest = checksum.partition(":") if isinstance(checksum, str) else ("", "", "")
    if algorithm not in CHECKSUM_ALGORITHMS or len(digest) != _DIGEST_HEX[algorithm] or digest.strip("0123456789abcdef"):
        raise ManifestError(
            f"{where}: field {field}.checksum must be '<algorithm>:<hex digest>' with algorithm one of "
            f"{CHECKSUM_ALGORITHMS}, got {_show(checksum)}"
        )
    compression = entry.get("compression")
    stored = entry.get("stored_bytes")
    if compression is not None:
        if not isinstance(compression, str) or compression not in COMPRESSED_SUFFIX:
            raise ManifestError(f"{where}: field {field}.compression {_show(compression)} is unknown (chute knows {sorted(COMPRESSED_SUFFIX)})")
        stored = _count(stored, where, f"{field}.stored_bytes", low=1)
    elif stored is not None:
        stored = _count(stored, where, f"{field}.stored_bytes", low=1)
    return ShardInfo(file=file, rows=rows, bytes=size, checksum=checksum, compression=compression, stored_bytes=stored)


def parse_manifest(text: str, where: str) -> Manifest:
    """Parse and validate manifest text; ``where`` names the file in error messages.

    Only :class:`ManifestError` comes out of here, whatever the text holds.
    """
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; deep nesting recurses
        raise ManifestError(f"{where} is not valid JSON ({_show(str(exc))}); the dataset is damaged: write it again") from None
    if not isinstance(data, Mapping):
        raise ManifestError(f"{where} does not hold a JSON object; it is not a chute manifest")
    if data.get("format") != FORMAT_NAME or not isinstance(data.get("format"), str):
        raise ManifestError(f"{where} is not a chute manifest (format is {_show(data.get('format'))}, expected 'chute')")
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ManifestError(
            f"{where} has format version {_show(version)}; this chute reads version {FORMAT_VERSION}. "
            "Upgrade chute if the dataset is newer, or convert it again with this version"
        )
    for key in ("columns", "arrow_schema", "shards"):
        if key not in data:
            raise ManifestError(f"{where} lacks the field {key!r}; the manifest is damaged: write the dataset again")
    _check_columns(data["columns"], where)
    try:
        schema = Schema.from_json(data["columns"])
        expected = schema.to_arrow()
    except (ChuteError, ValueError, TypeError, KeyError, OverflowError, pa.ArrowException, OSError) as exc:  # pa.ArrowIOError is a bare OSError
        raise ManifestError(f"{where}: field columns is not a valid schema ({_show(str(exc))}); write the dataset again") from None
    encoded = data["arrow_schema"]
    if not isinstance(encoded, str):
        raise ManifestError(f"{where}: field arrow_schema must be a base64 string, got {_show(encoded)}")
    try:
        arrow_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded, validate=True)))
    except (ValueError, TypeError, pa.ArrowException, OSError) as exc:  # binascii.Error is a ValueError; pa.ArrowIOError an OSError
        raise ManifestError(f"{where}: field arrow_schema is not a serialised Arrow schema ({_show(str(exc))}); write the dataset again") from None
    try:
        same = arrow_schema.equals(expected, check_metadata=False)
    except (pa.ArrowException, OSError, ValueError, TypeError) as exc:
        raise ManifestError(f"{where}: its Arrow schema cannot be compared with its column list ({_show(str(exc))}); the manifest is damaged") from None
    if not same:
        raise ManifestError(f"{where}: its Arrow schema does not match its column list; the manifest is damaged")
    raw_shards = data["shards"]
    if not isinstance(raw_shards, list):
        raise ManifestError(f"{where}: field shards must be a list of shard objects, got {_show(raw_shards)}")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ManifestError(f"{where}: field metadata must be an object, got {_show(metadata)}")
    shards = []
    seen = set()
    total = 0
    for i, entry in enumerate(raw_shards):
        shard = _parse_shard(entry, i, where)
        if shard.file in seen:
            raise ManifestError(f"{where}: shard {shard.file} is listed twice")
        seen.add(shard.file)
        total += shard.rows
        if total > MAX_COUNT:
            raise ManifestError(f"{where}: field shards[{i}].rows brings the dataset past 2**53 rows; the manifest is damaged")
        shards.append(shard)
    if "rows" in data and data["rows"] != total:
        raise ManifestError(
            f"{where}: field rows says {_show(data['rows'])} but the shards list {total:,} rows; the manifest "
            "is damaged or was edited: write the dataset again"
        )
    created_by = data.get("created_by", "")
    return Manifest(schema, tuple(shards), dict(metadata or {}), arrow_schema, created_by if isinstance(created_by, str) else "")
