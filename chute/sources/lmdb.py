"""LMDB databases (the ``lmdb`` package): one sample per key, converted.

The database is a directory holding ``data.mdb`` (or, opened with
``subdir=False``, a single ``.mdb``/``.lmdb`` file). Every key of the main
database, in key order, is one row: the key is the column ``key`` (str when
every key is UTF-8, else bytes) and the value is decoded by what it starts
with, the first value deciding for all:

=================================  ======================================================
value                              decoded as
=================================  ======================================================
a pickle (protocol 2 and later)    the unpickled object, only with ``allow_pickle=True``
                                   (through the same function as ``.pkl`` files)
``.npy`` bytes (``\\x93NUMPY``)     the array (never unpickling)
anything else                      the raw bytes (an encoded image per key, say)
=================================  ======================================================

A pickled dict of record fields becomes one column per key (nested dicts
dotted), as the index converter's files do: the types come from every value
(:mod:`chute.format.infer`). Each value is read and decoded once: the first
range of keys is decoded in this process and its types are the plan; reader
processes (each opening the database read-only and walking its own range of
keys) then decode, summarise and build the rows of the other ranges in that
plan, and the dataset is committed only if the summary of every value gives
the same plan. If it does not (an array that grows in the last key, a key that
appears late), the dataset is written again with the plan of every value, a
second pass; so is it after any error, which that pass then reports as it
stands. Rows keep key order.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping
from typing import Any

import chute
from chute.errors import ChuteError, PickleRefusedError, SchemaError
from chute.format.infer import Column, InferenceError, Summary, extract, extract_columns
from chute.format.schema import Bytes, ColumnType, String
from chute.sources._blocks import Block, columns_block, rows_block, write_blocks
from chute.sources._dicts import plan_columns
from chute.sources._files import PICKLE_RISK, load_npy, unpickle
from chute.sources._hints import from_inference
from chute.sources._parallel import OrderedPool, chunk_size_for
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE
from chute.storage.write import StoreOptions

KEY_COLUMN = "key"
DATA_COLUMN = "data"
LMDB_FILES = (".mdb", ".lmdb")
API = "from_lmdb() / convert()"
NPY_MAGIC = b"\x93NUMPY"


def _lmdb() -> Any:
    try:
        import lmdb
    except ImportError:
        raise ChuteError("reading LMDB databases needs the lmdb package: pip install 'chute[lmdb]'") from None
    return lmdb


def is_lmdb_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "data.mdb"))


def _env(path: str) -> Any:
    lmdb = _lmdb()
    try:  # lock=False: a reader of a database nobody writes to now; readahead off: rows are read in key order anyway
        return lmdb.open(path, readonly=True, lock=False, subdir=os.path.isdir(path), readahead=False, max_readers=512)
    except lmdb.Error as exc:
        raise ChuteError(f"{path} cannot be opened as an LMDB database ({exc})") from None


def value_format(value: bytes) -> str:
    """``pickle``, ``npy`` or ``bytes``: how the values are decoded, from the first one."""
    if len(value) >= 2 and value[0] == 0x80 and 2 <= value[1] <= 5:
        return "pickle"
    if value.startswith(NPY_MAGIC):
        return "npy"
    return "bytes"


def decode(value: bytes, fmt: str, key: bytes, path: str) -> Any:
    """A value as ``fmt`` says (``key`` and ``path`` name it in errors)."""
    try:
        if fmt == "pickle":
            return unpickle(value)
        if fmt == "npy":
            return load_npy(value)
    except Exception as exc:  # a damaged value: any unpickling or npy error
        raise ChuteError(f"{_where(path, key)}: the value cannot be read as {fmt} ({type(exc).__name__}: {exc})") from None
    return bytes(value)


def _key_text(key: bytes, as_str: bool) -> Any:
    return key.decode("utf-8") if as_str else bytes(key)


def _where(path: str, key: bytes) -> str:
    return f"{os.path.basename(os.path.normpath(path))} key {key[:64]!r}"


def _records(path: str, part: tuple[bytes, int, int]) -> Any:
    """``(key, value)`` of ``count`` keys from ``first`` on (one reader's range, starting at row ``offset``)."""
    first, count, _ = part
    env = _env(path)
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(first):
                return
            for _ in range(count):
                yield cursor.key(), cursor.value()
                if not cursor.next():
                    return
    finally:
        env.close()


def summarise(path: str, fmt: str, part: tuple[bytes, int, int]) -> list[tuple[Summary, bool]]:
    """A reader task of the first pass: the summary of the values of one range, and whether every key is UTF-8."""
    summary, utf8 = Summary(), True
    position = part[2]
    for key, value in _records(path, part):
        summary.add({DATA_COLUMN: decode(value, fmt, key, path)}, position)
        position += 1
        if utf8:
            try:
                key.decode("utf-8")
            except UnicodeDecodeError:
                utf8 = False
    return [(summary, utf8)]


def read_part(path: str, fmt: str, columns: list[Column], schema: dict[str, ColumnType], keys_as_str: bool,
              part: tuple[bytes, int, int]) -> list[Block]:
    """A reader task of the write pass: one range of keys as a block of rows."""
    rows = []
    for key, value in _records(path, part):
        sample = {KEY_COLUMN: _key_text(key, keys_as_str)}
        sample.update(extract({DATA_COLUMN: decode(value, fmt, key, path)}, columns))
        rows.append(sample)
    where = _where(path, part[0])
    return [(rows_block(rows, schema, where), len(rows), where)]


#: A reader task's result in the one pass: the block in the plan (None: a value does not fit it), its rows, what
#: names it, the summary of its values and whether its keys are UTF-8.
_Read = tuple[dict[str, Any] | None, int, str, Summary, bool]


def _decoded(path: str, fmt: str, part: tuple[bytes, int, int]) -> tuple[list[bytes], list[dict[str, Any]], Summary, bool]:
    """The keys of a range, its values decoded (as ``{"data": value}``), their summary, and whether every key is UTF-8."""
    first, count, position = part
    env = _env(path)
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            pairs = list(itertools.islice(cursor.iternext(), count)) if cursor.set_range(first) else []
    finally:
        env.close()
    keys = [key for key, _ in pairs]
    samples = [{DATA_COLUMN: decode(value, fmt, key, path)} for key, value in pairs]
    del pairs
    summary = Summary()
    summary.add_many(samples, position)
    utf8 = b"".join(keys).isascii() or all(_is_utf8(k) for k in keys)  # (ASCII: each key is UTF-8)
    return keys, samples, summary, utf8


def _is_utf8(key: bytes) -> bool:
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _block(path: str, keys: list[bytes], samples: list[dict[str, Any]], columns: list[Column],
           schema: dict[str, ColumnType], keys_as_str: bool, first: bytes) -> dict[str, Any] | None:
    """Decoded values as a block of rows in the plan ``columns``; None if one does not fit it."""
    try:
        values = extract_columns(samples, columns)
        values[KEY_COLUMN] = list(map(bytes.decode, keys)) if keys_as_str else keys
        return columns_block(values, schema, _where(path, first))
    except (SchemaError, UnicodeDecodeError):
        return None


def read_once(path: str, fmt: str, columns: list[Column], schema: dict[str, ColumnType], keys_as_str: bool,
              part: tuple[bytes, int, int]) -> list[_Read]:
    """A reader task of the one pass: a range of keys decoded once, as a block in the plan and as a summary."""
    keys, samples, summary, utf8 = _decoded(path, fmt, part)
    block = _block(path, keys, samples, columns, schema, keys_as_str, part[0]) if utf8 or not keys_as_str else None
    return [(block, len(keys), _where(path, part[0]), summary, utf8)]


class _Replan(Exception):
    """The one pass cannot commit: the plan of every value differs from the first range's, or it failed."""

    def __init__(self, summary: Summary | None = None, keys_as_str: bool = True) -> None:
        super().__init__("the values' plan differs from the first range's")
        self.summary, self.keys_as_str = summary, keys_as_str


def _parts(path: str, size: int | None, workers: int) -> tuple[list[tuple[bytes, int, int]], int, bytes | None]:
    """The key ranges (first key, count, first row) of ``size`` keys (None: enough for ``workers`` readers to share)
    the readers take, the number of keys, and the first value."""
    env = _env(path)
    try:
        if size is None:  # a range per task: a few thousand small values
            size = chunk_size_for(int(env.stat()["entries"]), workers) * 16
        parts: list[tuple[bytes, int, int]] = []
        first_value = None
        count = 0
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            if cursor.first():
                first_value = cursor.value()
            for count, key in enumerate(cursor.iternext(keys=True, values=False), start=1):
                if (count - 1) % size == 0:
                    parts.append((key, size, count - 1))
    finally:
        env.close()
    return parts, count, first_value


def plan(path: str, allow_pickle: bool, size: int | None, workers: int = 1) -> tuple[list[tuple[bytes, int, int]], int, str]:
    """The key ranges of ``path`` (``size`` keys each, see :func:`_parts`), the number of keys and how values are decoded; a
    PickleRefusedError (before any value is decoded) if they are pickles and ``allow_pickle`` is False."""
    if not os.path.exists(path):
        raise ChuteError(f"LMDB database {path} does not exist")
    if os.path.isdir(path) and not is_lmdb_dir(path):
        raise ChuteError(f"{path} holds no data.mdb: it is not an LMDB database directory")
    parts, count, first = _parts(path, None if size is None else max(1, size), workers)
    if first is None:
        raise ChuteError(f"LMDB database {path} holds no keys; there is nothing to convert")
    fmt = value_format(first)
    if fmt == "pickle" and not allow_pickle:
        raise PickleRefusedError(
            f"LMDB database {_name(path)} holds pickled values ({count} keys); chute does not unpickle by default "
            f"because {PICKLE_RISK}. If you trust the database, opt in with allow_pickle=True (chute convert --allow-pickle)"
        )
    return parts, count, fmt


def columns_of(path: str, fmt: str, parts: list[tuple[bytes, int, int]], declared: dict[str, ColumnType],
               pool: OrderedPool | None = None, progress: Progress | None = None) -> tuple[list[Column], dict[str, ColumnType]]:
    """The columns of the values of ``parts`` (summarised by ``pool``'s readers) and the schema with ``key``."""
    summary, keys_as_str = Summary(), True
    results = (pool.map if pool is not None else OrderedPool(0).map)(functools.partial(summarise, path, fmt), parts)
    for part, utf8 in results:
        summary.merge(part)
        keys_as_str = keys_as_str and utf8
        if progress is not None:
            progress.update(part.samples)
    return planned(path, parts, summary, keys_as_str, declared)


def planned(path: str, parts: list[tuple[bytes, int, int]], summary: Summary, keys_as_str: bool,
            declared: dict[str, ColumnType]) -> tuple[list[Column], dict[str, ColumnType]]:
    """The columns of the values ``summary`` summarises, and the schema with ``key``."""
    places = _Places(_name(path), parts)
    columns = plan_columns(summary, declared, [KEY_COLUMN], places, API)  # type: ignore[arg-type]  # indexable by position
    schema: dict[str, ColumnType] = {KEY_COLUMN: String() if keys_as_str else Bytes()}
    schema.update((c.name, c.ctype) for c in columns)
    return columns, schema


def metadata(path: str, fmt: str) -> dict[str, Any]:
    return {"source": {"kind": "lmdb", "database": _name(path), "values": fmt}}


def _name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def from_lmdb(
    path: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    allow_pickle: bool = False,
    column_types: Mapping[str, ColumnType] | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert an LMDB database: a row per key (``key`` column), its value decoded as the module doc says.

    Pickled values need ``allow_pickle=True`` (they can run code: only databases you
    trust). ``column_types`` declares some columns' types as for the index converter.
    Values are read by ``workers`` processes (default: one per CPU; 0 reads in this
    process), once if the first range of keys has the types of all of them (else
    twice: see the module doc).
    """
    source = os.fspath(path)
    declared = dict(column_types or {})
    with OrderedPool(workers) as pool:
        parts, count, fmt = plan(source, allow_pickle, None, pool.workers)
        options: StoreOptions = {"metadata": metadata(source, fmt), "shard_size": shard_size, "overwrite": overwrite}
        try:
            return _one_pass(source, dst, fmt, parts, count, declared, pool, progress, options)
        except _Replan as replan:
            summary, keys_as_str = replan.summary, replan.keys_as_str
        if summary is None:  # the first range cannot be planned, or writing failed: as two passes would say it
            with Progress(count, "chute convert (lmdb): reading types", enabled=progress, unit="keys") as bar:
                columns, schema = columns_of(source, fmt, parts, declared, pool, bar)
        else:
            columns, schema = planned(source, parts, summary, keys_as_str, declared)
        read = functools.partial(read_part, source, fmt, columns, schema, isinstance(schema[KEY_COLUMN], String))
        options["schema"] = schema
        try:
            return write_blocks(
                pool.map(read, parts), dst,
                progress=Progress(count, "chute convert (lmdb): writing with every value's types", enabled=progress,
                                  unit="keys"),
                **options,
            )
        except InferenceError as exc:
            raise from_inference(exc, exc.detail, API, declared=declared) from None


def _one_pass(source: str, dst: str | os.PathLike, fmt: str, parts: list[tuple[bytes, int, int]], count: int,
              declared: dict[str, ColumnType], pool: OrderedPool, progress: bool, options: StoreOptions) -> chute.Dataset:
    """Write every value in the plan of the first range's, decoding each once; :class:`_Replan` (nothing written)
    if the plan of every value differs, or with no summary if the first range cannot be planned or writing fails."""
    keys, samples, summary, keys_as_str = _decoded(source, fmt, parts[0])
    try:
        columns, schema = planned(source, parts, summary, keys_as_str, declared)
    except SchemaError:
        raise _Replan() from None
    first = _block(source, keys, samples, columns, schema, keys_as_str, parts[0][0])
    del samples
    if first is None:
        raise _Replan()
    bar = Progress(count, "chute convert (lmdb)", enabled=progress, unit="keys")

    def blocks() -> Any:
        total, utf8, fits = summary, keys_as_str, True
        yield first, len(keys), _where(source, parts[0][0])
        read = functools.partial(read_once, source, fmt, columns, schema, keys_as_str)
        for block, rows, where, part, part_utf8 in pool.map(read, parts[1:]):
            total.merge(part)
            utf8 = utf8 and part_utf8
            fits = fits and block is not None
            if fits:
                yield block, rows, where
            else:
                bar.update(rows)  # read for its summary only
        try:
            same = fits and utf8 == keys_as_str and planned(source, parts, total, utf8, declared)[0] == columns
        except SchemaError:  # (the write pass's planning raises it again, as it stands)
            same = False
        if not same:
            raise _Replan(total, utf8)

    options["schema"] = schema
    try:
        return write_blocks(blocks(), dst, progress=bar, **options)
    except SchemaError:  # a value the writer refused: the two passes say it as it stands
        raise _Replan() from None


class _Places:
    """``places[i]``: "db key number i" for messages, without a list of every key."""

    def __init__(self, name: str, parts: list[tuple[bytes, int, int]]) -> None:
        self.name, self.parts = name, parts

    def __getitem__(self, i: int) -> str:
        first, size, _ = self.parts[i // self.parts[0][1]]
        return f"{self.name} key number {i} ({i % size} after key {first[:64]!r})"
