"""A converter's source cut into independent parts, for reading them in parallel (``chute convert --ray``).

:func:`plan` describes a source the way the converters read it (same columns,
same schema rules, same metadata) as a list of picklable **parts** (chunks of
an index, of an image folder, one tar, one Parquet/Arrow file, a range of
rows) and a module-level function that reads one part into ``(sample,
origin)`` pairs. Whoever runs the parts (Ray tasks: :mod:`chute.ray.convert`)
writes each part's samples; the dataset's rows are the parts' rows in order.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chute.errors import ChuteError
from chute.format.schema import ColumnType, String
from chute.sources._arrow import batch_samples, number_batches
from chute.sources._remote import is_remote
from chute.sources.detect import detect_kind

ROWS_PER_PART = 4096
"""Rows per part for sources that are one sequence of rows (an index, an image folder, arrays, HF)."""


@dataclasses.dataclass
class SourcePlan:
    """A source as parts: ``read(part)`` yields the part's ``(sample, origin)`` pairs."""

    kind: str
    parts: list[Any]
    read: Callable[[Any], Iterator[tuple[dict[str, Any], str]]]
    schema: dict[str, ColumnType] | None  # None: inferred from the first samples
    metadata: dict[str, Any]


def plan(src: Any, kind: str | None = None, *, allow_pickle: bool = False, rows_per_part: int = ROWS_PER_PART, **options: Any) -> SourcePlan:
    """``src`` (of ``kind``, detected when None) as a :class:`SourcePlan`; ``options`` as for the converter."""
    kind = kind or detect_kind(src)
    planners: dict[str, Callable[..., SourcePlan]] = {
        "index": _index, "images": _images, "webdataset": _webdataset, "arrow": _arrow, "numpy": _numpy, "hf": _hf,
        "hdf5": _hdf5, "zarr": _zarr, "lmdb": _lmdb, "tfrecord": _tfrecord,
    }
    if kind not in planners:
        raise ChuteError(f"unknown source kind {kind!r}; use one of {', '.join(planners)}")
    if kind in ("index", "lmdb"):
        options["allow_pickle"] = allow_pickle
    return planners[kind](src, max(1, int(rows_per_part)), **options)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[a : a + size] for a in range(0, len(items), size)]


# --------------------------------------------------------------------------- index of files


def _index(
    src: Any, rows: int, *, allow_pickle: bool, path_column: str | None = None, data_type: ColumnType | None = None,
    root: Any = None,
) -> SourcePlan:
    from chute.sources.index import DATA_COLUMN, PATH_COLUMN, _extra_type, check_pickles, read_index, source_metadata

    index = read_index(src, path_column=path_column)
    check_pickles(index, allow_pickle)
    if not index.paths:
        raise ChuteError(f"index {index.source} lists no files; there is nothing to convert")
    schema = None
    if data_type is not None:
        schema = {PATH_COLUMN: String(), **{k: _extra_type(v) for k, v in index.extras.items()}, DATA_COLUMN: data_type}
    resolved = index.resolve(root)
    entries = [
        (index.places[i], index.paths[i], resolved[i], {c: v[i] for c, v in index.extras.items()}) for i in range(len(index.paths))
    ]
    return SourcePlan(
        "index", _chunks(entries, rows), functools.partial(_read_index_part, allow_pickle), schema,
        {"source": source_metadata(index, root)},
    )


def _read_index_part(allow_pickle: bool, part: list[tuple[str, str, str, dict[str, Any]]]) -> Iterator[tuple[dict[str, Any], str]]:
    from chute.sources._files import load_indexed_file
    from chute.sources.index import DATA_COLUMN, PATH_COLUMN

    for place, written, path, extras in part:
        data = load_indexed_file((place, written, path), allow_pickle=allow_pickle)
        yield {PATH_COLUMN: written, **extras, DATA_COLUMN: data}, f"{place} ({written})"


# --------------------------------------------------------------------------- image folder


def _images(src: Any, rows: int, *, extensions: frozenset[str] | None = None) -> SourcePlan:
    from chute.sources.images import SCHEMA, scan_image_folder

    top = os.fspath(src)
    classes, images, skipped = scan_image_folder(top, extensions)  # the same checks as chute convert
    parts = _chunks([(os.path.join(top, rel), rel, label) for rel, label in images], rows)
    metadata = {"class_names": classes, "source": {"kind": "images", "skipped_files": len(skipped)}}
    return SourcePlan("images", parts, _read_images_part, dict(SCHEMA), metadata)


def _read_images_part(part: list[tuple[str, str, int]]) -> Iterator[tuple[dict[str, Any], str]]:
    from chute.sources.images import read_image_bytes

    for path, relative, label in part:
        yield {"image": read_image_bytes(path), "label": label, "path": relative}, f"image {relative}"


# --------------------------------------------------------------------------- WebDataset tars


def _webdataset(src: Any, rows: int) -> SourcePlan:
    from chute.sources.webdataset import KEY_COLUMN, _samples, field_type, list_tars

    tars = list_tars(src)
    first = next(_samples(tars), None)  # reads the first sample only: the columns
    if first is None:
        raise ChuteError(f"found no samples in {', '.join(tars)}: no tar member has a name of the form KEY.FIELD")
    schema = {name: String() if name == KEY_COLUMN else field_type(name) for name in first[0]}
    metadata = {"source": {"kind": "webdataset", "tars": [os.path.basename(t) for t in tars]}}
    return SourcePlan("webdataset", tars, _read_tar, schema, metadata)


def _read_tar(tar: str) -> Iterator[tuple[dict[str, Any], str]]:
    from chute.sources.webdataset import _samples

    yield from _samples([tar])  # samples of other tars must have the same fields: the writer checks them


# --------------------------------------------------------------------------- Parquet / Arrow / Feather


def _arrow(src: Any, rows: int, *, columns: list[str] | None = None) -> SourcePlan:
    from chute.sources.arrow import plan_arrow_files

    files, schema, columns_plan = plan_arrow_files(src, columns)
    metadata = {"source": {"kind": "arrow", "files": [os.path.basename(f.path) for f in files]}}
    read = functools.partial(_read_arrow_file, columns_plan, schema.names)
    return SourcePlan("arrow", files, read, {c.name: c.ctype for c in columns_plan}, metadata)


def _read_arrow_file(columns_plan: list, names: list[str], file: Any) -> Iterator[tuple[dict[str, Any], str]]:
    for first_row, batch in number_batches(file.batches(names)):
        yield from batch_samples(batch, columns_plan, where=file.path, first_row=first_row)


# --------------------------------------------------------------------------- NumPy


def _numpy(src: Any, rows: int, *, column: str = "data") -> SourcePlan:
    from chute.sources.npy import _load_npy, column_type

    source = os.fspath(src)
    if not source.lower().endswith(".npy") or not os.path.isfile(source):
        raise ChuteError(
            f"{source}: chute convert --ray reads .npy files (memory-mapped, cut into row ranges); "
            "convert a .npz without --ray, or save its arrays as .npy files"
        )
    array = _load_npy(source)
    schema = {column: column_type(column, array.shape, array.dtype, source)}
    parts = [(source, column, a, min(a + rows, len(array))) for a in range(0, len(array), rows)]
    return SourcePlan("numpy", parts, _read_npy_rows, schema, {"source": {"kind": "numpy", "file": os.path.basename(source)}})


def _read_npy_rows(part: tuple[str, str, int, int]) -> Iterator[tuple[dict[str, Any], str]]:
    from chute.sources.npy import _block_rows, _load_npy

    source, column, a, b = part
    for offset, value in enumerate(_block_rows(np.asarray(_load_npy(source)[a:b]))):
        yield {column: value}, f"{source} row {a + offset}"


# --------------------------------------------------------------------------- Hugging Face


def _hf(src: Any, rows: int, *, split: str | None = None, columns: list[str] | None = None) -> SourcePlan:
    from chute.sources.hf import _metadata, plan_hf

    dataset, where, split, names, columns_plan = plan_hf(src, split, columns)
    view = dataset.select_columns(names)
    parts = [(a, min(a + rows, len(view))) for a in range(0, len(view), rows)]
    read = functools.partial(_read_hf_rows, view, columns_plan, where)
    return SourcePlan("hf", parts, read, {c.name: c.ctype for c in columns_plan}, _metadata(view, split))


def _read_hf_rows(dataset: Any, columns_plan: list, where: str, part: tuple[int, int]) -> Iterator[tuple[dict[str, Any], str]]:
    from chute.sources.hf import _batches

    a, b = part
    names = [c.name for c in columns_plan]
    for first_row, batch in number_batches(_batches(dataset.select(range(a, b)), names)):
        yield from batch_samples(batch, columns_plan, where=where, first_row=a + first_row)


# --------------------------------------------------------------------------- blocks: HDF5, Zarr, LMDB, TFRecord


def _rows_of(read: Callable[[Any], list[Any]], part: Any) -> Iterator[tuple[dict[str, Any], str]]:
    """A block reader's part as ``(sample, origin)`` pairs (the Ray sink writes samples)."""
    for block, rows, where in read(part):
        for i in range(rows):
            yield {name: values[i] for name, values in block.items()}, f"{where}, row {i}"


def _hdf5(src: Any, rows: int, *, columns: list[str] | None = None) -> SourcePlan:
    from chute.sources import hdf5

    path = os.fspath(src)
    layout, attrs = hdf5.scan(path, columns)
    read = functools.partial(_rows_of, functools.partial(hdf5.read_span, path, layout))
    return SourcePlan("hdf5", layout.spans(), read, dict(layout.types), hdf5.metadata(path, layout, attrs))


def _zarr(src: Any, rows: int, *, columns: list[str] | None = None, storage_options: dict[str, Any] | None = None) -> SourcePlan:
    from chute.sources import zarr

    source = os.fspath(src).rstrip("/")
    layout, attrs = zarr.scan(source, storage_options, columns)
    read = functools.partial(_rows_of, functools.partial(zarr.read_span, source, dict(storage_options or {}), layout))
    return SourcePlan("zarr", layout.spans(), read, dict(layout.types), zarr.metadata(source, layout, attrs))


def _lmdb(src: Any, rows: int, *, allow_pickle: bool, column_types: dict[str, ColumnType] | None = None) -> SourcePlan:
    """Key ranges of ``rows`` keys; the columns from the first range's values (as ``--ray`` does for an index)."""
    from chute.sources import lmdb

    path = os.fspath(src)
    parts, count, fmt = lmdb.plan(path, allow_pickle, rows)
    columns, schema = lmdb.columns_of(path, fmt, parts[:1], dict(column_types or {}))
    read = functools.partial(_rows_of, functools.partial(lmdb.read_part, path, fmt, columns, schema, isinstance(schema["key"], String)))
    return SourcePlan("lmdb", parts, read, schema, lmdb.metadata(path, fmt))


def _tfrecord(src: Any, rows: int, *, column_types: dict[str, ColumnType] | None = None,
              storage_options: dict[str, Any] | None = None) -> SourcePlan:
    """Parts of a few MB of records (a URL or a gzipped file: one part, read by the task where it runs); the
    columns from the first part's records."""
    from chute.sources import tfrecord

    options = dict(storage_options or {})
    names = tfrecord.list_files(src, options)
    local = [(n, os.path.basename(n)) for n in names if not is_remote(n)]
    parts, _ = tfrecord.plan_parts(local)
    parts += [tfrecord.Part(n, n, 0, 0, -1, options) for n in names if is_remote(n)]
    order = {n: k for k, n in enumerate(names)}
    parts.sort(key=lambda p: (order[p.path], p.first))
    schema = tfrecord.schema_of(tfrecord.summarise(parts[0])[0], dict(column_types or {}))
    read = functools.partial(_rows_of, functools.partial(tfrecord.read_part, schema))
    return SourcePlan("tfrecord", parts, read, schema, tfrecord.metadata([n if is_remote(n) else os.path.basename(n) for n in names]))
