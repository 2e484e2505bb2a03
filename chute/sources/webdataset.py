"""Convert WebDataset tar shards into a chute dataset.

WebDataset stores a sample as consecutive tar members sharing a key: the member
path up to the first ``.`` of its file name (``train/0001.jpg`` and
``train/0001.cls`` are sample ``train/0001``, fields ``jpg`` and ``cls``). Each
sample becomes one row with a ``__key__`` column and one column per field, named
by the field's extension and decoded by its last part:

* ``cls``, ``index``, ``id``: int (int64);
* ``txt``: str;
* ``json``: the parsed JSON value;
* anything else (``jpg``, ``png``, ``npy``, ``pyd``, ...): the raw bytes.

Tars are read in sorted order as streams (``.tar``, ``.tar.gz``), samples in tar
order. Every sample must have the same fields: a sample that lacks one (or adds
one) is an error naming its tar and key. Reading a tar is sequential I/O and the
decoding is cheap, so this converter reads in the main process.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import posixpath
import re
import tarfile
from collections.abc import Iterator, Sequence
from typing import Any, cast

import chute
from chute.errors import ChuteError
from chute.format.schema import Bytes, ColumnType, Json, Scalar, String
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

TAR_EXTENSIONS = (".tar", ".tar.gz", ".tgz")
KEY_COLUMN = "__key__"
INT_FIELDS = frozenset({"cls", "index", "id"})
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's shard ranges: ``shard-{000..002}.tar`` -> three names (zero padding kept)."""
    match = _BRACES.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.group(1), match.group(2)
    width = len(first)
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for i in range(int(first), int(last) + 1) for name in expand_braces(f"{head}{i:0{width}d}{tail}")]


def list_tars(src: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The tar files of ``src`` (a tar, a directory of tars, a glob or brace pattern, or a list), sorted."""
    if isinstance(src, (list, tuple)):
        return sorted({tar for part in src for tar in list_tars(part)})
    path = os.fspath(cast("str | os.PathLike", src))  # not a list or tuple here
    if os.path.isdir(path):
        tars = [os.path.join(path, n) for n in os.listdir(path) if n.lower().endswith(TAR_EXTENSIONS)]
        if not tars:
            raise ChuteError(f"directory {path} holds no {'/'.join(TAR_EXTENSIONS)} files")
        return sorted(tars)
    if os.path.isfile(path):
        return [path]
    tars = sorted({match for name in expand_braces(path) for match in glob.glob(name)})
    if not tars:
        raise ChuteError(f"{path} does not exist (or matches no tar files)")
    return tars


def split_name(member: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member path (``a/b/0001.seg.png`` -> ``a/b/0001``, ``seg.png``), or None without a field."""
    directory, name = posixpath.split(member)
    stem, dot, field = name.partition(".")
    if not dot or not stem or not field:
        return None
    return (f"{directory}/{stem}" if directory else stem), field


def field_type(field: str) -> ColumnType:
    """The column type a field's values get, from its last extension."""
    ext = field.rsplit(".", 1)[-1].lower()
    if ext in INT_FIELDS:
        return Scalar("int64")
    if ext == "txt":
        return String()
    if ext == "json":
        return Json()
    return Bytes()


def decode(field: str, raw: bytes, where: str) -> Any:
    """A field's value from its bytes (see the module doc)."""
    ext = field.rsplit(".", 1)[-1].lower()
    try:
        if ext in INT_FIELDS:
            return int(raw.decode("utf-8").strip())
        if ext == "txt":
            return raw.decode("utf-8")
        if ext == "json":
            return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChuteError(f"{where}: field {field!r} is not a valid .{ext} value ({exc})") from None
    return raw


def tar_samples(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {field: bytes})`` for each sample of one tar, in tar order (members streamed)."""
    seen: set[str] = set()
    key: str | None = None
    fields: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                parts = split_name(member.name) if member.isfile() else None
                if parts is None:
                    continue  # directories, links, files without a field: not sample data
                member_key, field = parts
                if member_key != key:
                    if key is not None:
                        yield key, fields
                    if member_key in seen:
                        raise ChuteError(
                            f"{path}: sample {member_key!r} appears twice, apart; WebDataset samples must "
                            "be stored as consecutive members (write the tar sorted by key)"
                        )
                    seen.add(member_key)
                    key, fields = member_key, {}
                if field in fields:
                    raise ChuteError(f"{path}: sample {key!r} has two {field!r} members")
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file
                fields[field] = extracted.read()
    except tarfile.TarError as exc:
        raise ChuteError(f"{path} is not a readable tar file ({exc})") from None
    if key is not None:
        yield key, fields


def from_webdataset(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert WebDataset tars (a tar, a directory of tars, a glob / ``{000..099}`` pattern, or a list).

    Columns: ``__key__`` (str) and one per field extension (``jpg``, ``cls``, ``json``...),
    decoded as described in the module doc.
    """
    tars = list_tars(src)
    samples = _samples(tars)
    first = next(samples, None)
    if first is None:
        raise ChuteError(f"found no samples in {', '.join(tars)}: no tar member has a name of the form KEY.FIELD")
    schema = {name: String() if name == KEY_COLUMN else field_type(name) for name in first[0]}
    return write_samples(
        itertools.chain([first], samples),
        dst,
        progress=Progress(None, "chute convert (webdataset)", enabled=progress, unit="samples"),
        schema=schema,
        metadata={"source": {"kind": "webdataset", "tars": [os.path.basename(t) for t in tars]}},
        shard_size=shard_size,
        overwrite=overwrite,
    )


def _samples(tars: list[str]) -> Iterator[tuple[dict[str, Any], str]]:
    first: tuple[str, str, list[str]] | None = None  # tar, key and fields of the first sample
    for path in tars:
        for key, fields in tar_samples(path):
            where = f"{path}, sample {key!r}"
            if first is None:
                first = (path, key, list(fields))
            elif fields.keys() != set(first[2]):
                raise _field_mismatch(where, list(fields), first)
            sample: dict[str, Any] = {KEY_COLUMN: key}
            for field in first[2]:
                sample[field] = decode(field, fields[field], where)
            yield sample, where


def _field_mismatch(where: str, fields: list[str], first: tuple[str, str, list[str]]) -> ChuteError:
    tar, key, expected = first
    missing = [f for f in expected if f not in fields]
    extra = [f for f in fields if f not in expected]
    parts = ([f"lacks {missing}"] if missing else []) + ([f"has extra {extra}"] if extra else [])
    return ChuteError(
        f"{where} {' and '.join(parts)}: its fields are {sorted(fields)} but the first sample ({key!r} in "
        f"{tar}) has {sorted(expected)}; every sample must have the same fields"
    )
