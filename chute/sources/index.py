"""Convert an index of per-sample files (a CSV or a list of paths) into a chute dataset.

The layout of the "why does my DataLoader hang?" write-up: a CSV index and one
small file per sample (``N.pkl.gz``: a gzipped pickle of a dict). Each file is
read and decoded by its extension (see :mod:`chute.sources._files`) in reader
processes; the main process writes one row per index entry, in index order:

* ``path``: the path as written in the index (``\\`` separators become ``/``);
* every other index column, typed by its first row: int if it parses as int, else
  float if it parses as float, else str; a later row that does not parse the same
  way is an error naming it (never a silent change of type);
* the file's content: a dict whose keys are record fields (the usual
  ``{"x": array, "label": int, "id": str}``) becomes one column per key, nested
  dicts ``meta.width``; anything else (and a dict whose keys vary from file to
  file) is the column ``data``.

The column types come from every file (a first pass reads them all and keeps
only a summary, see :mod:`chute.format.infer`), so a shape that changes in the
last file makes a ragged column and a key that some files lack a nullable one.

An unnamed first column (what pandas' ``DataFrame.to_csv`` writes for the row
index) is skipped. Pickles are refused unless the caller opts in, before any file
is read.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import os
import posixpath
from collections.abc import Iterator, Mapping
from typing import Any

import chute
from chute.errors import ChuteError
from chute.format.infer import Column, InferenceError, Summary, extract
from chute.format.schema import ColumnType, Scalar, String
from chute.sources._dicts import plan_columns, rounded, rounding
from chute.sources._files import is_pickle, load_indexed_file, pickle_refused
from chute.sources._hints import FixableError, from_inference
from chute.sources._parallel import OrderedPool, call_chunk, chunk_size_for, chunked
from chute.sources._progress import Progress
from chute.sources._remote import is_remote, join_url, read_url, split_url, url_exists
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

DATA_COLUMN = "data"
PATH_COLUMN = "path"
ROOT_HINT = "if the index's paths are relative to another folder, pass root= (chute convert --root FOLDER)"
API = "from_index() / convert()"


@dataclasses.dataclass
class Index:
    """The parsed index: one entry per sample, in file order."""

    source: str  # the index file, for messages
    paths: list[str]  # as written, "/"-separated
    places: list[str]  # "index.csv row 3" per entry
    extras: dict[str, list[Any]]  # other columns, typed

    def base(self, root: str | os.PathLike | None = None) -> str:
        """The folder relative paths start from: ``root`` if given, else the index file's folder (a URL's too)."""
        if root is not None and is_remote(os.fspath(root)):
            return os.fspath(root).rstrip("/")
        if root is None and is_remote(self.source):
            return split_url(self.source)[0]
        folder = os.path.expanduser(os.fspath(root)) if root is not None else os.path.dirname(self.source)
        return os.path.abspath(folder)

    def resolve(self, root: str | os.PathLike | None = None) -> list[str]:
        """The paths made absolute (relative ones are relative to :meth:`base`); URLs under a URL base."""
        base = self.base(root)
        if is_remote(base):
            return [join_url(base, p) for p in self.paths]
        return [p if is_remote(p) else os.path.normpath(os.path.join(base, p)) for p in self.paths]


def source_metadata(index: Index, root: str | os.PathLike | None) -> dict[str, str]:
    """What the dataset's metadata says of its source: the index's file name and the folder its paths start
    from, relative to the index's folder (a URL stays a URL): no absolute path of this machine."""
    base = index.base(root)
    if is_remote(index.source):
        return {"kind": "index", "index": index.source, "root": base}
    if not is_remote(base):
        base = os.path.relpath(base, os.path.dirname(os.path.abspath(index.source))).replace(os.sep, "/")
    return {"kind": "index", "index": os.path.basename(index.source), "root": base}


def normalise_path(path: str) -> str:
    """``path`` with Windows separators (``\\``) turned into ``/``, so an index written on Windows works here."""
    return path.replace("\\", "/")


def read_index(index_path: str | os.PathLike, *, path_column: str | None = None,
               column_types: Mapping[str, ColumnType] | None = None, storage_options: Mapping[str, Any] | None = None) -> Index:
    """Parse an index (a local file or a URL): ``.csv``/``.tsv`` with a header row, anything else one path per line."""
    source = os.fspath(index_path)
    if is_remote(source):
        try:
            text = read_url(source, storage_options).decode("utf-8-sig")
        except FileNotFoundError:
            raise ChuteError(f"index file {source} does not exist") from None
    else:
        if os.path.isdir(source):
            raise ChuteError(f"{source} is a folder; an index source is a .csv/.tsv file or a text file of paths")
        if not os.path.isfile(source):
            raise ChuteError(f"index file {source} does not exist")
        with open(source, encoding="utf-8-sig", newline="") as f:
            text = f.read()
    if source.lower().endswith((".csv", ".tsv")):
        return _read_csv(source, text, "\t" if source.lower().endswith(".tsv") else ",", path_column, column_types or {})
    if path_column is not None:
        raise ChuteError(f"path_column={path_column!r} needs a CSV index with a header row; {source} is a list of paths")
    return _read_lines(source, text)


def _read_lines(source: str, text: str) -> Index:
    paths, places = [], []
    name = posixpath.basename(source)
    for line_number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            paths.append(normalise_path(line.strip()))
            places.append(f"{name} line {line_number}")
    return Index(source, paths, places, {})


def _read_csv(source: str, text: str, delimiter: str, path_column: str | None, column_types: Mapping[str, ColumnType]) -> Index:
    name = posixpath.basename(source)
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if not header:
            raise ChuteError(f"index {source} is empty; a CSV index needs a header row naming its columns")
        kept = _columns_to_read(header, source)
        names = [header[i] for i in kept]
        if path_column is None:
            path_column = PATH_COLUMN if PATH_COLUMN in names else names[0]
        elif path_column not in names:
            raise ChuteError(
                f"index {source} has no column {path_column!r}; its columns are {names}: "
                "pass the one that holds the file paths as path_column= (chute convert --path-column)"
            )
        rows: list[list[str]] = []
        places: list[str] = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # blank line
            place = f"{name} row {len(rows) + 1}, line {reader.line_num}"
            if len(row) != len(header):
                raise ChuteError(f"{place} has {len(row)} fields, the header has {len(header)}; fix the index")
            rows.append(row)
            places.append(place)
    columns = {header[i]: [row[i] for row in rows] for i in kept}
    paths = [normalise_path(path) for path in columns.pop(path_column)]
    for place, path in zip(places, paths):
        if not path.strip():
            raise ChuteError(f"{place}: the path column {path_column!r} is empty")
    for clash in (PATH_COLUMN, DATA_COLUMN):
        if clash in columns:
            raise ChuteError(
                f"index {source} has a column {clash!r} besides the path column {path_column!r}; the "
                f"output uses {clash!r} for the file's path/content: rename that column"
            )
    return Index(source, paths, places, {column: _typed(values, column, places, column_types.get(column))
                                         for column, values in columns.items()})


def _typed(values: list[str], name: str, places: list[str], declared: ColumnType | None) -> list[Any]:
    """An index column's values: as declared (str, or numbers of a scalar type), else typed by :func:`parse_column`."""
    if declared is None:
        return parse_column(values, name, places)
    if isinstance(declared, String):
        return values
    if isinstance(declared, Scalar):
        parse = float if declared.dtype.startswith(("float", "bfloat")) else int
        for k, value in enumerate(values):
            try:
                parse(value)
            except ValueError:
                raise ChuteError(f"{places[k]}: column {name!r} holds {value!r}, not a {declared.dtype} number") from None
        return [parse(v) for v in values]
    raise ChuteError(f"index column {name!r} can be declared string or scalar(...), not {declared.describe()}")


def _columns_to_read(header: list[str], source: str) -> list[int]:
    """Positions of the header's columns to read: all but an unnamed first one (pandas' row index)."""
    kept = list(range(len(header)))
    if len(header) > 1 and not header[0].strip():
        kept = kept[1:]  # DataFrame.to_csv writes the row index first, under an empty name
    if any(not header[i].strip() for i in kept):
        raise ChuteError(f"index {source}: the header {header} has an empty column name; name every column")
    names = [header[i] for i in kept]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ChuteError(f"index {source}: the header repeats column(s) {duplicates}; column names must be unique")
    return kept


def parse_column(values: list[str], name: str = "", places: list[str] | None = None) -> list[int] | list[float] | list[str]:
    """The values typed by the first one: ints if it parses as int, floats if as float, else strs.

    A later value that does not parse like the first (``"7"`` then ``"cat"``) is an
    error naming its row: a label column never turns into strings silently. An int
    column with a float value becomes float (every int is a float).
    """
    if not values:
        return values
    first = _parse_kind(values[0])
    if first is str:
        return values
    kinds = [int, float] if first is int else [float]
    for kind in kinds:
        try:
            return [kind(v) for v in values]
        except ValueError:
            continue
    for k, value in enumerate(values):
        if _parse_kind(value) is str:
            where = places[k] if places else f"row {k + 1}"
            raise FixableError(
                f"{where}: column {name!r} holds {value!r}, but its first row holds the number {values[0]!r}; "
                "a column keeps one type",
                {"column_types": {name: String()}}, API,
            )
    return values


def _parse_kind(text: str) -> type:
    for kind in (int, float):
        try:
            kind(text)
            return kind
        except ValueError:
            pass
    return str


def check_pickles(index: Index, allow_pickle: bool) -> None:
    """Raise PickleRefusedError naming the first pickle file unless ``allow_pickle``."""
    if allow_pickle:
        return
    pickles = [i for i, path in enumerate(index.paths) if is_pickle(path)]
    if pickles:
        first = pickles[0]
        raise pickle_refused(f"{index.paths[first]} ({index.places[first]})", len(pickles), f"index {index.source}")


def from_index(
    index_path: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    allow_pickle: bool = False,
    path_column: str | None = None,
    root: str | os.PathLike | None = None,
    data_type: ColumnType | None = None,
    column_types: Mapping[str, ColumnType] | None = None,
    cast: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    start_method: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert the files listed in ``index_path`` (CSV/TSV with a header, or one path per line).

    Columns: ``path``, the index's other columns, and each file's content (by
    extension: ``.pkl``/``.pickle`` unpickled (only with ``allow_pickle=True``),
    ``.json`` parsed, ``.npy`` loaded, images and anything else as bytes; ``.gz`` is
    gunzipped first): a dict of record fields is one column per key (nested dicts
    ``meta.width``), anything else the column ``data``. The path column is
    ``path_column``, else ``path`` if present, else the first named one. Relative
    paths start from ``root``, by default the index file's folder; ``\\``
    separators are read as ``/``. Column types are inferred from every file;
    ``column_types`` (``{"x": chute.Ragged("float32", ndim=3)}``; ``data_type``
    for ``data``) declares some. Values cast into a declared type when exact;
    ``cast=True`` also rounds floats (float64 into float32). Files are read by
    ``workers`` processes (default: one per CPU; 0 reads in this process), twice:
    once for the types, once to write. The index may be a URL (``s3://``,
    ``gs://``, ``https://``; ``storage_options`` go to fsspec): relative paths
    then start from its folder's URL.
    """
    declared = dict(column_types or {})
    if data_type is not None:
        declared[DATA_COLUMN] = data_type
    options = dict(storage_options or {})
    index = read_index(index_path, path_column=path_column, column_types=declared, storage_options=options)
    check_pickles(index, allow_pickle)  # before anything is read or written
    if not index.paths:
        raise ChuteError(f"index {index.source} lists no files; there is nothing to convert")
    remote = is_remote(index.base(root))
    if root is not None and not remote and not os.path.isdir(index.base(root)):
        raise ChuteError(f"root={os.fspath(root)!r}: {index.base(root)} is not a folder; pass the folder the index's paths start from")
    resolved = index.resolve(root)
    if not (url_exists(resolved[0], options) if is_remote(resolved[0]) else os.path.exists(resolved[0])):
        raise _first_file_missing(index, root, resolved[0], options)  # most likely every path starts from another folder
    items = list(zip(index.places, index.paths, resolved))
    reserved = [PATH_COLUMN, *index.extras]
    with OrderedPool(workers, start_method=start_method) as pool:
        size = chunk_size_for(len(items), pool.workers)
        with Progress(len(items), "chute convert (index): reading types", enabled=progress, unit="files") as bar:
            summary = Summary()
            summarise = functools.partial(summarise_files, allow_pickle=allow_pickle, storage_options=options)
            for part in pool.map(summarise, chunked(list(enumerate(items)), size)):
                summary.merge(part)
                bar.update(part.samples)
        places = [f"{place} ({path})" for place, path in zip(index.places, index.paths)]
        columns = plan_columns(summary, declared, reserved, places, API)
        schema = {PATH_COLUMN: String(), **{k: _extra_type(v, declared.get(k)) for k, v in index.extras.items()}}
        schema.update((c.name, c.ctype) for c in columns)
        read = functools.partial(call_chunk, load_indexed_file, {"allow_pickle": allow_pickle, "storage_options": options})
        contents = pool.map(read, chunked(items, size))
        try:
            return write_samples(
                _samples(index, contents, columns, rounding(schema) if cast else None),
                dst,
                progress=Progress(len(items), "chute convert (index)", enabled=progress, unit="files"),
                schema=schema,
                metadata={"source": source_metadata(index, root)},
                shard_size=shard_size,
                overwrite=overwrite,
                storage_options=options,
            )
        except InferenceError as exc:
            raise from_inference(exc, str(exc.detail), API, declared=declared) from None


def summarise_files(chunk: list[tuple[int, tuple[str, str, str]]], *, allow_pickle: bool,
                    storage_options: dict[str, Any] | None = None) -> list[Summary]:
    """One reader task of the first pass: load a chunk of files, keep only the summary of their contents."""
    summary = Summary()
    for position, item in chunk:
        summary.add({DATA_COLUMN: load_indexed_file(item, allow_pickle=allow_pickle, storage_options=storage_options)}, position)
    return [summary]


def _first_file_missing(index: Index, root: str | os.PathLike | None, looked: str, options: dict[str, Any]) -> ChuteError:
    """The first file does not exist: another index column may hold the paths, or they start elsewhere."""
    detail = f"{index.places[0]}: file {index.paths[0]} does not exist (looked for {looked})"
    base = index.base(root)

    def exists(path: str) -> bool:
        if is_remote(base):
            return url_exists(join_url(base, path), options)
        return os.path.isfile(os.path.join(base, path))

    for column, values in index.extras.items():
        value = values[0]
        if isinstance(value, str) and value and exists(normalise_path(value)):
            return FixableError(f"{detail}; column {column!r} holds existing files: it is the path column", {"path_column": column}, API)
    return ChuteError(f"{detail}; relative paths start from {base}: {ROOT_HINT}")


def _samples(index: Index, contents: Iterator[Any], columns: list[Column], rounds: dict[str, str] | None) -> Iterator[tuple[dict[str, Any], str]]:
    for i, data in enumerate(contents):
        sample = {PATH_COLUMN: index.paths[i]}
        for column, values in index.extras.items():
            sample[column] = values[i]
        sample.update(extract({DATA_COLUMN: data}, columns))
        rounded(sample, rounds)
        yield sample, f"{index.places[i]} ({index.paths[i]})"


def _extra_type(values: list[Any], declared: ColumnType | None = None) -> ColumnType:
    if declared is not None:
        return declared
    if values and isinstance(values[0], int):
        return Scalar("int64")
    if values and isinstance(values[0], float):
        return Scalar("float64")
    return String()
