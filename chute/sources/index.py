"""Convert an index of per-sample files (a CSV or a list of paths) into a chute dataset.

The layout of the "why does my DataLoader hang?" write-up: a CSV index and one
small file per sample (``N.pkl.gz``: a gzipped pickle of a dict). Each file is
read and decoded by its extension (see :mod:`chute.sources._files`) in reader
processes; the main process writes one row per index entry, in index order:

* ``path``: the path as written in the index (``\\`` separators become ``/``);
* every other index column, typed int if all its values parse as int, else float
  if they all parse as float, else str;
* ``data``: the file's content (a dict becomes a map column, so keys that differ
  from file to file are all kept).

An unnamed first column (what pandas' ``DataFrame.to_csv`` writes for the row
index) is skipped. Pickles are refused unless the caller opts in, before any file
is read.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import Any

import chute
from chute.errors import ChuteError
from chute.format.schema import ColumnType, Scalar, String
from chute.sources._files import is_pickle, load_indexed_file, pickle_refused
from chute.sources._parallel import OrderedPool, call_chunk, chunk_size_for, chunked
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

DATA_COLUMN = "data"
PATH_COLUMN = "path"
DATA_TYPE_HINT = (
    "declare the data column's type with from_index(..., data_type=...) or chute convert --data-type TYPE, "
    "e.g. data_type=chute.Ragged(\"float32\", 2) or --data-type 'ragged(float32, 2)'"
)
ROOT_HINT = "if the index's paths are relative to another folder, pass root= (chute convert --root FOLDER)"


@dataclasses.dataclass
class Index:
    """The parsed index: one entry per sample, in file order."""

    source: str  # the index file, for messages
    paths: list[str]  # as written, "/"-separated
    places: list[str]  # "index.csv row 3" per entry
    extras: dict[str, list[Any]]  # other columns, typed

    def base(self, root: str | os.PathLike | None = None) -> str:
        """The folder relative paths start from: ``root`` if given, else the index file's folder."""
        folder = os.path.expanduser(os.fspath(root)) if root is not None else os.path.dirname(self.source)
        return os.path.abspath(folder)

    def resolve(self, root: str | os.PathLike | None = None) -> list[str]:
        """The paths made absolute (relative ones are relative to :meth:`base`)."""
        base = self.base(root)
        return [os.path.normpath(os.path.join(base, p)) for p in self.paths]


def normalise_path(path: str) -> str:
    """``path`` with Windows separators (``\\``) turned into ``/``, so an index written on Windows works here."""
    return path.replace("\\", "/")


def read_index(index_path: str | os.PathLike, *, path_column: str | None = None) -> Index:
    """Parse an index: ``.csv``/``.tsv`` with a header row, anything else one path per line."""
    source = os.fspath(index_path)
    if os.path.isdir(source):
        raise ChuteError(f"{source} is a folder; an index source is a .csv/.tsv file or a text file of paths")
    if not os.path.isfile(source):
        raise ChuteError(f"index file {source} does not exist")
    if source.lower().endswith((".csv", ".tsv")):
        return _read_csv(source, "\t" if source.lower().endswith(".tsv") else ",", path_column)
    if path_column is not None:
        raise ChuteError(f"path_column={path_column!r} needs a CSV index with a header row; {source} is a list of paths")
    return _read_lines(source)


def _read_lines(source: str) -> Index:
    paths, places = [], []
    name = os.path.basename(source)
    with open(source, encoding="utf-8-sig") as f:
        for line_number, line in enumerate(f, start=1):
            if line.strip():
                paths.append(normalise_path(line.strip()))
                places.append(f"{name} line {line_number}")
    return Index(source, paths, places, {})


def _read_csv(source: str, delimiter: str, path_column: str | None) -> Index:
    name = os.path.basename(source)
    with open(source, newline="", encoding="utf-8-sig") as f:
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
        rows, places = [], []
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
    return Index(source, paths, places, {column: parse_column(values) for column, values in columns.items()})


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


def parse_column(values: list[str]) -> list[int] | list[float] | list[str]:
    """The values as ints if all parse as int, else floats if all parse as float, else as they are."""
    for parse in (int, float):
        try:
            return [parse(v) for v in values]
        except ValueError:
            pass
    return values


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
    workers: int | None = None,
    start_method: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert the files listed in ``index_path`` (CSV/TSV with a header, or one path per line).

    Columns: ``path``, the index's other columns, and ``data`` (each file's content by
    extension: ``.pkl``/``.pickle`` unpickled (only with ``allow_pickle=True``), ``.json``
    parsed, ``.npy`` loaded, images and anything else as bytes; ``.gz`` is gunzipped
    first). The path column is ``path_column``, else ``path`` if present, else the first
    named one. Relative paths start from ``root``, by default the index file's folder;
    ``\\`` separators are read as ``/``. ``data``'s type is inferred from the
    first files unless ``data_type`` declares it (e.g. ``chute.Ragged("float32", 2)`` when
    ``.npy`` shapes vary beyond the first files). Files are read by ``workers``
    processes (default: one per CPU; 0 reads in this process).
    """
    index = read_index(index_path, path_column=path_column)
    check_pickles(index, allow_pickle)  # before anything is read or written
    if not index.paths:
        raise ChuteError(f"index {index.source} lists no files; there is nothing to convert")
    schema = None
    if data_type is not None:
        schema = {PATH_COLUMN: String(), **{k: _extra_type(v) for k, v in index.extras.items()}, DATA_COLUMN: data_type}
    if root is not None and not os.path.isdir(index.base(root)):
        raise ChuteError(f"root={os.fspath(root)!r}: {index.base(root)} is not a folder; pass the folder the index's paths start from")
    resolved = index.resolve(root)
    if not os.path.exists(resolved[0]):  # most likely every path starts from another folder
        raise ChuteError(
            f"{index.places[0]}: file {index.paths[0]} does not exist (looked for {resolved[0]}); "
            f"relative paths start from {index.base(root)}: {ROOT_HINT}"
        )
    items = list(zip(index.places, index.paths, resolved))
    with OrderedPool(workers, start_method=start_method) as pool:
        read = functools.partial(call_chunk, load_indexed_file, {"allow_pickle": allow_pickle})
        contents = pool.map(read, chunked(items, chunk_size_for(len(items), pool.workers)))
        return write_samples(
            _samples(index, contents),
            dst,
            progress=Progress(len(items), "chute convert (index)", enabled=progress, unit="files"),
            schema=schema,
            schema_hint=DATA_TYPE_HINT,
            metadata={"source": {"kind": "index", "index": os.path.abspath(index.source), "root": index.base(root)}},
            shard_size=shard_size,
            overwrite=overwrite,
        )


def _samples(index: Index, contents: Iterator[Any]) -> Iterator[tuple[dict[str, Any], str]]:
    for i, data in enumerate(contents):
        sample = {PATH_COLUMN: index.paths[i]}
        for column, values in index.extras.items():
            sample[column] = values[i]
        sample[DATA_COLUMN] = data
        yield sample, f"{index.places[i]} ({index.paths[i]})"


def _extra_type(values: list[Any]) -> ColumnType:
    if values and isinstance(values[0], int):
        return Scalar("int64")
    if values and isinstance(values[0], float):
        return Scalar("float64")
    return String()
