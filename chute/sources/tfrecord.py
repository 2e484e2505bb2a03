"""TFRecord files of ``tf.train.Example`` records, converted without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian)   uint32 masked crc32c(length)   data[length]   uint32 masked crc32c(data)

(``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8``), the whole file
possibly gzipped (told by its first bytes, not its name). Both CRCs of every
record are checked (``google-crc32c``), a length is bounded by the file's size
(or :data:`MAX_RECORD_BYTES` in a gzipped file) before anything is read, and
each record is parsed as a ``tf.train.Example`` by the protobuf library
(:mod:`chute.sources._example_pb`).

A feature is a column (in the order of their names); its type comes from every record (a first pass keeps
only each feature's kind and list lengths):

=========================================  ==========================================
feature                                    column
=========================================  ==========================================
int64_list / float_list of length 1        scalar int64 / float32
... of one length n in every record        tensor of shape (n,)
... of varying length                      ragged int64 / float32, 1 dimension
bytes_list of length 1                     bytes (an encoded image, say)
bytes_list of other lengths, UTF-8 text    JSON list of str
missing from some records                  nullable (None where missing)
=========================================  ==========================================

``column_types`` declares a column's type instead. Files are read in order,
records in file order; each file is cut into parts of a few MB read by
reader processes (a gzipped file is one part). A URL (``s3://``,
``https://``) is downloaded to a temporary local copy first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import gzip
import math
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, cast

import numpy as np

import chute
from chute.errors import ChuteError, SchemaError, ShardError
from chute.format.schema import Bytes, ColumnType, Json, Nullable, Ragged, Scalar, Tensor
from chute.sources._blocks import Block, write_blocks
from chute.sources._parallel import OrderedPool
from chute.sources._progress import Progress
from chute.sources._remote import is_remote, local_copy
from chute.sources._write import DEFAULT_SHARD_SIZE

TFRECORD_EXTENSIONS = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrec.gz")
MAX_RECORD_BYTES = 1 << 30
"""The largest record read from a gzipped file (a plain file's records are bounded by its size)."""
PART_BYTES = 4 << 20
"""About the bytes of records one reader task parses."""
_HEADER = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8
_DTYPES = {"int64_list": "int64", "float_list": "float32"}
_NUMPY = {"int64_list": np.int64, "float_list": np.float32}
API = "from_tfrecord() / convert()"


def _crc32c(data: bytes) -> int:
    try:
        import google_crc32c
    except ImportError:
        raise ChuteError("reading TFRecord files needs google-crc32c and protobuf: pip install 'chute[tfrecord]'") from None
    return int(google_crc32c.value(data))


def masked_crc(data: bytes) -> int:
    """TFRecord's masked crc32c of ``data``."""
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record (what a writer of TFRecord files does)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


# --------------------------------------------------------------------------- files and records


def list_files(src: str | os.PathLike | Sequence[str | os.PathLike], storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The TFRecord files of ``src``: a file, a directory of them, a glob, a URL (or a glob URL), or a list; sorted."""
    if isinstance(src, (list, tuple)):
        out = [f for part in src for f in list_files(part, storage_options)]
        if not out:
            raise ChuteError("no TFRecord file given")
        return out
    path = os.fspath(src)  # type: ignore[arg-type]  # not a list here
    if is_remote(path):
        if not any(c in path for c in "*?["):
            return [path]
        import fsspec

        fs, _, paths = fsspec.get_fs_token_paths(path, storage_options=dict(storage_options or {}))
        found = sorted(fs.unstrip_protocol(p) for p in paths)
        if not found:
            raise ChuteError(f"{path} matches no file")
        return found
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.lower().endswith(TFRECORD_EXTENSIONS))
        if not files:
            raise ChuteError(f"directory {path} holds no {'/'.join(TFRECORD_EXTENSIONS)} files")
        return files
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(path))
    if not files:
        raise ChuteError(f"TFRecord file {path} does not exist" if not any(c in path for c in "*?[") else f"{path} matches no file")
    return files


def _open_raw(path: str, storage_options: Mapping[str, Any] | None = None) -> IO[bytes]:
    """The file at ``path``, a local path or (read by a Ray task where it runs) a URL through fsspec."""
    if is_remote(path):
        import fsspec

        return cast("IO[bytes]", fsspec.open(path, "rb", **dict(storage_options or {})).open())
    return open(path, "rb")


def _is_gzip(path: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    with _open_raw(path, storage_options) as f:
        return f.read(2) == b"\x1f\x8b"


def _open(path: str, storage_options: Mapping[str, Any] | None = None) -> IO[bytes]:
    raw = _open_raw(path, storage_options)
    return cast("IO[bytes]", gzip.open(raw, "rb")) if _is_gzip(path, storage_options) else raw


def _damaged(name: str, record: int, what: str) -> ShardError:
    return ShardError(f"{name} record {record}: {what}; the file is truncated or damaged: write it again (or leave it out)")


def read_records(f: IO[bytes], name: str, first: int = 0, count: int = -1, limit: int = MAX_RECORD_BYTES) -> Iterator[bytes]:
    """The data of up to ``count`` records (all if -1) from the current position of ``f``; ``first`` numbers them
    in messages. Both CRCs are checked; a length over ``limit`` is refused before it is read."""
    record = first
    while count != 0:
        header = f.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise _damaged(name, record, f"the file ends inside a record header ({len(header)} of 12 bytes)")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise _damaged(name, record, "the length's CRC does not match")
        if length > limit:
            raise _damaged(name, record, f"a record of {length} bytes, more than the {limit} the file can hold")
        data = f.read(length)
        tail = f.read(4)
        if len(data) < length or len(tail) < 4:
            raise _damaged(name, record, f"the file ends inside a record of {length} bytes")
        if masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise _damaged(name, record, "the data's CRC does not match")
        yield data
        record += 1
        count -= 1


@dataclasses.dataclass(frozen=True)
class Part:
    """Records ``[first, first + count)`` of ``path`` (``count`` -1: to the end), starting at byte ``offset``;
    ``name`` names the file in messages."""

    path: str
    name: str
    offset: int
    first: int
    count: int
    storage_options: Mapping[str, Any] | None = None  # a URL's (a Ray task reads it where it runs)

    def records(self) -> Iterator[bytes]:
        with _open(self.path, self.storage_options) as f:
            limit = MAX_RECORD_BYTES
            if self.offset:
                f.seek(self.offset)
            if not isinstance(f, gzip.GzipFile) and not is_remote(self.path):
                limit = max(0, os.fstat(f.fileno()).st_size - self.offset)
            yield from read_records(f, self.name, self.first, self.count, limit)


def plan_parts(files: list[tuple[str, str]]) -> tuple[list[Part], int | None]:
    """The parts of ``(local path, name)`` files and the number of records (None when a gzipped file hides it):
    a plain file's record headers are walked (lengths and their CRCs) to cut it every :data:`PART_BYTES`."""
    parts: list[Part] = []
    total: int | None = 0
    for path, name in files:
        if _is_gzip(path):
            parts.append(Part(path, name, 0, 0, -1))
            total = None
            continue
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            offset = start = record = first = 0
            while offset < size:
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    raise _damaged(name, record, f"the file ends inside a record header ({len(header)} of 12 bytes)")
                length, length_crc = _HEADER.unpack(header)
                if masked_crc(header[:8]) != length_crc:
                    raise _damaged(name, record, "the length's CRC does not match")
                if offset + _HEADER.size + length + 4 > size:
                    raise _damaged(name, record, f"the file ends inside a record of {length} bytes")
                offset += _HEADER.size + length + 4
                f.seek(offset)
                record += 1
                if offset - start >= PART_BYTES:
                    parts.append(Part(path, name, start, first, record - first))
                    start, first = offset, record
            if record > first:
                parts.append(Part(path, name, start, first, record - first))
        if total is not None:
            total += record
    return parts, total


# --------------------------------------------------------------------------- types


@dataclasses.dataclass
class Feature:
    """What the records hold at one feature: its kind, its lists' lengths, where it is missing."""

    kind: str | None = None  # int64_list, float_list, bytes_list; None while only empty lists were seen
    kind_at: str = ""  # the record it was first seen in
    other: tuple[str, str] | None = None  # another kind and the record it is in
    present: int = 0
    shortest: int | None = None
    longest: int = 0
    text: bool = True  # every bytes value is UTF-8

    def add(self, kind: str | None, values: Any, record: str) -> None:
        self.present += 1
        n = len(values) if kind else 0
        self.shortest = n if self.shortest is None else min(self.shortest, n)
        self.longest = max(self.longest, n)
        if kind is None:
            return
        if self.kind is None:
            self.kind, self.kind_at = kind, record
        elif kind != self.kind and self.other is None:
            self.other = (kind, record)
        if kind == "bytes_list" and self.text:
            try:
                for value in values:
                    value.decode("utf-8")
            except UnicodeDecodeError:
                self.text = False

    def merge(self, other: Feature) -> None:
        if other.kind is not None:
            if self.kind is None:
                self.kind, self.kind_at = other.kind, other.kind_at
            elif other.kind != self.kind and self.other is None:
                self.other = (other.kind, other.kind_at)
        if self.other is None and other.other is not None:
            self.other = other.other
        self.present += other.present
        if other.shortest is not None:
            self.shortest = other.shortest if self.shortest is None else min(self.shortest, other.shortest)
        self.longest = max(self.longest, other.longest)
        self.text = self.text and other.text


@dataclasses.dataclass
class Summary:
    records: int = 0
    features: dict[str, Feature] = dataclasses.field(default_factory=dict)

    def merge(self, other: Summary) -> None:
        self.records += other.records
        for name, feature in other.features.items():
            if name in self.features:
                self.features[name].merge(feature)
            else:
                self.features[name] = feature


def _parse(data: bytes, where: str) -> Any:
    from google.protobuf.message import DecodeError

    from chute.sources._example_pb import Example

    try:
        return Example.FromString(data).features.feature
    except DecodeError as exc:
        raise ShardError(f"{where} is not a tf.train.Example ({exc}); chute reads TFRecord files of Examples") from None


def summarise(part: Part) -> list[Summary]:
    """A reader task of the first pass: the features of one part's records."""
    summary = Summary()
    for k, data in enumerate(part.records()):
        record = f"{part.name} record {part.first + k}"
        for name, feature in _parse(data, record).items():
            kind = feature.WhichOneof("kind")
            stats = summary.features.get(name)
            if stats is None:
                stats = summary.features[name] = Feature()
            stats.add(kind, getattr(feature, kind).value if kind else (), record)
        summary.records += 1
    return [summary]


def column_type(name: str, feature: Feature, records: int) -> ColumnType:
    """The column for a feature (see the module doc), or a SchemaError saying what to declare."""
    if feature.other is not None:
        raise SchemaError(
            f"feature {name!r} is a {feature.other[0]} in {feature.other[1]} but a {feature.kind} in "
            f"{feature.kind_at}; a column holds one kind: fix the records or leave the feature out"
        )
    shortest, longest = feature.shortest or 0, feature.longest
    ctype: ColumnType
    if feature.kind is None:
        return Json()  # only empty lists
    if feature.kind == "bytes_list":
        if shortest == longest == 1:
            ctype = Bytes()
        elif feature.text:
            return Json()
        else:
            raise SchemaError(
                f"feature {name!r} holds lists of {shortest} to {longest} bytes values that are not UTF-8 text; chute "
                "stores one bytes value per column: write one feature per value"
            )
    else:
        dtype = _DTYPES[feature.kind]
        ctype = Scalar(dtype) if shortest == longest == 1 else Tensor(dtype, (longest,)) if shortest == longest else Ragged(dtype, 1)
    return Nullable(ctype) if feature.present < records else ctype


def schema_of(summary: Summary, declared: Mapping[str, ColumnType]) -> dict[str, ColumnType]:
    """The columns of the summarised records, by feature name (an Example's features have no order)."""
    unknown = sorted(set(declared) - set(summary.features))
    if unknown:
        raise ChuteError(f"column_types names {unknown}, which no record has; the features are {sorted(summary.features)}")
    return {name: declared.get(name) or column_type(name, feature, summary.records) for name, feature in sorted(summary.features.items())}


def metadata(files: list[str]) -> dict[str, Any]:
    """The files' names (a URL stays a URL; no local path)."""
    return {"source": {"kind": "tfrecord", "files": files}}


# --------------------------------------------------------------------------- values


def _value(kind: str | None, values: Any, ctype: ColumnType) -> Any:
    """One record's value of a feature as its column takes it (``kind`` None: an empty list)."""
    inner = ctype.value if isinstance(ctype, Nullable) else ctype
    if isinstance(inner, Json):
        return [v.decode("utf-8") for v in values] if kind == "bytes_list" else list(values)
    if isinstance(inner, Bytes):
        return values[0] if len(values) == 1 else values
    dtype = _NUMPY.get(kind or "", np.float32 if isinstance(inner, (Tensor, Ragged, Scalar)) and inner.dtype.startswith("float") else np.int64)
    if isinstance(inner, Scalar) and len(values) == 1:
        return values[0]
    return np.asarray(values, dtype=dtype)


def read_part(schema: dict[str, ColumnType], part: Part) -> list[Block]:
    """A reader task of the second pass: one part's records as a block (fixed-size columns filled in place)."""
    datas = list(part.records())
    n = len(datas)
    block: dict[str, Any] = {}
    for name, ctype in schema.items():
        if isinstance(ctype, Scalar):
            block[name] = np.empty(n, dtype=np.float32 if ctype.dtype.startswith("float") else np.int64)
        elif isinstance(ctype, Tensor):
            block[name] = np.empty((n, *ctype.shape), dtype=np.float32 if ctype.dtype.startswith("float") else np.int64)
        else:
            block[name] = [None] * n
    for k, data in enumerate(datas):
        where = f"{part.name} record {part.first + k}"
        features = _parse(data, where)
        for name, ctype in schema.items():
            feature = features.get(name)
            if feature is None:
                if not isinstance(ctype, (Nullable, Json)):
                    raise SchemaError(f"{where} has no feature {name!r}; declare the column nullable to convert it")
                continue
            kind = feature.WhichOneof("kind")
            values: Any = getattr(feature, kind).value if kind else ()
            if isinstance(ctype, (Scalar, Tensor)):
                expected = 1 if isinstance(ctype, Scalar) else math.prod(ctype.shape)
                if len(values) != expected or kind == "bytes_list":
                    raise SchemaError(f"{where}: feature {name!r} holds {len(values)} {kind} values, the column {ctype.describe()}")
                block[name][k] = values[0] if isinstance(ctype, Scalar) else values if len(ctype.shape) == 1 else np.reshape(values, ctype.shape)
            else:
                block[name][k] = _value(kind, values, ctype)
    return [(block, n, f"{part.name} records {part.first}-{part.first + n - 1}")]


# --------------------------------------------------------------------------- the converter


def from_tfrecord(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    column_types: Mapping[str, ColumnType] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert TFRecord files of ``tf.train.Example`` records (a file, a directory, a glob, URLs or a list).

    A column per feature, typed from every record (see the module doc); ``column_types``
    declares some. Records are parsed by ``workers`` processes (default: one per CPU;
    0 parses in this process), twice: once for the types, once to write.
    """
    options = dict(storage_options or {})
    names = list_files(src, options)
    declared = dict(column_types or {})
    with contextlib.ExitStack() as stack:
        files = [(stack.enter_context(local_copy(n, options)) if is_remote(n) else n, n if is_remote(n) else os.path.basename(n))
                 for n in names]
        parts, total = plan_parts(files)
        if not parts:
            raise ChuteError(f"{', '.join(names)} hold(s) no records; there is nothing to convert")
        with OrderedPool(workers) as pool:
            summary = Summary()
            with Progress(total, "chute convert (tfrecord): reading types", enabled=progress, unit="records") as bar:
                for part in pool.map(summarise, parts):
                    summary.merge(part)
                    bar.update(part.records)
            if not summary.records:
                raise ChuteError(f"{', '.join(names)} hold(s) no records; there is nothing to convert")
            schema = schema_of(summary, declared)
            return write_blocks(
                pool.map(functools.partial(read_part, schema), parts), dst, schema=schema,
                progress=Progress(summary.records, "chute convert (tfrecord)", enabled=progress, unit="records"),
                metadata=metadata([name for _, name in files]),
                shard_size=shard_size, overwrite=overwrite, storage_options=options,
            )
