"""Zarr groups (format v2 and v3), local or at an fsspec URL (``s3://``, ``gs://``, ``https://``), converted.

The arrays that share a first axis become columns, as for HDF5 (see
:mod:`chute.sources._arrays`): nested groups give dotted names, attributes go
to the metadata under ``"zarr"``, a store whose root is one array gives the
column ``data``. Rows are read a block of whole chunks (whole shards, for a
sharded v3 array) at a time; zarr fetches and decodes a block's chunks
concurrently (its own threads and event loop), and ``workers=N`` adds N reader
processes, each opening the store itself.

Over HTTP a store cannot be listed: the group needs consolidated metadata
(``zarr.consolidate_metadata``), which zarr reads when it is there. The
``zarr`` package (3.x, which reads v2 and v3 stores) is imported when a
function here runs (``pip install 'chute[zarr]'``).
"""

from __future__ import annotations

import functools
import os
import posixpath
from collections.abc import Mapping
from typing import Any

import numpy as np

import chute
from chute.errors import ChuteError
from chute.sources._arrays import ArrayInfo, Layout, attributes, block_values, choose, column_name
from chute.sources._blocks import Block, write_blocks
from chute.sources._parallel import OrderedPool
from chute.sources._progress import Progress
from chute.sources._remote import is_remote
from chute.sources._write import DEFAULT_SHARD_SIZE

ZARR_MARKERS = frozenset({".zgroup", ".zarray", ".zmetadata", "zarr.json"})
ROOT_COLUMN = "data"


def _zarr() -> Any:
    try:
        import zarr
    except ImportError:
        raise ChuteError("reading Zarr stores needs zarr 3: pip install 'chute[zarr]'") from None
    return zarr


def is_zarr_dir(path: str) -> bool:
    """A local directory that is a Zarr group or array (its metadata file is there)."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in ZARR_MARKERS)


def _open(src: str, storage_options: Mapping[str, Any] | None, path: str = "") -> Any:
    """The group (or array) at ``src`` (then ``path`` inside it), read-only."""
    zarr = _zarr()
    options = dict(storage_options or {}) if is_remote(src) else None
    try:
        node = zarr.open(src, mode="r", storage_options=options) if not path else zarr.open_array(
            src, mode="r", path=path, storage_options=options)
    except FileNotFoundError:
        raise ChuteError(f"{src} does not exist (or holds no Zarr metadata)") from None
    except (ValueError, KeyError, OSError) as exc:
        raise ChuteError(f"{src} cannot be opened as a Zarr store ({type(exc).__name__}: {exc})") from None
    return node


def _kind(dtype: np.dtype) -> str:
    if dtype.kind in "biuf":
        return "number"
    if dtype.kind in "UOT":  # fixed unicode, v2 object strings, v3 variable-length strings
        return "string"
    if dtype.kind in "SV":
        return "bytes"
    return "other"


def _info(name: str, path: str, array: Any) -> ArrayInfo:
    dtype = np.dtype(array.dtype)
    shape = tuple(int(n) for n in array.shape)
    shards = getattr(array, "shards", None)
    chunks = shards or array.chunks
    filters = tuple(getattr(array, "compressors", ()) or ()) + tuple(getattr(array, "filters", ()) or ())
    kind = _kind(dtype)
    return ArrayInfo(
        name=name, path=path, shape=shape, dtype=dtype, kind=kind, chunk_rows=int(chunks[0]) if shape else 1,
        compressed=bool(filters), why=f"dtype {dtype}, which chute cannot store" if kind == "other" else "",
    )


def scan(src: str, storage_options: Mapping[str, Any] | None = None, columns: list[str] | None = None) -> tuple[Layout, dict[str, Any]]:
    """The columns of the Zarr store at ``src`` and its attributes (by member path, ``/`` for the root's)."""
    zarr = _zarr()
    root = _open(src, storage_options)
    attrs: dict[str, Any] = {}
    if a := attributes(root.attrs):
        attrs["/"] = a
    if isinstance(root, zarr.Array):
        arrays = [_info(ROOT_COLUMN, "", root)]
    else:
        arrays = []
        try:
            members = root.members(max_depth=None)
        except (OSError, NotImplementedError, ValueError) as exc:
            raise ChuteError(
                f"{src}: the group's members cannot be listed ({type(exc).__name__}: {exc}); over HTTP, consolidate "
                "its metadata first (zarr.consolidate_metadata)"
            ) from None
        for path, node in sorted(members, key=lambda pair: pair[0]):
            if a := attributes(node.attrs):
                attrs["/" + path] = a
            if isinstance(node, zarr.Array):
                arrays.append(_info(column_name(path), path, node))
    if not arrays:
        raise ChuteError(f"{src} holds no arrays; there is nothing to convert")
    return choose(arrays, src, columns), attrs


def read_span(src: str, storage_options: Mapping[str, Any] | None, layout: Layout, span: tuple[int, int]) -> list[Block]:
    """Rows ``span`` of every column, as one block (a reader task: opens the arrays itself)."""
    a, b = span
    block: dict[str, Any] = {}
    for info in layout.arrays:
        array = _open(src, storage_options, info.path)
        try:
            raw = array[a:b]
        except Exception as exc:  # a missing or damaged chunk, a codec that is not installed: zarr raises many kinds
            raise ChuteError(f"{src}: array {info.path or '/'} rows {a}-{b - 1} cannot be read ({type(exc).__name__}: {exc})") from None
        block[info.name] = block_values(info, layout.types[info.name], raw, a, src)
    return [(block, b - a, f"{_name(src)} rows {a}-{b - 1}")]


def metadata(src: str, layout: Layout, attrs: dict[str, Any]) -> dict[str, Any]:
    """The dataset's metadata: the store (its URL, or a local directory's name), what was skipped and why, the attributes."""
    out: dict[str, Any] = {"source": {"kind": "zarr", "store": _name(src)}}
    if layout.skipped:
        out["source"]["skipped"] = layout.skipped
    if attrs:
        out["zarr"] = {"attributes": attrs}
    return out


def _name(src: str) -> str:
    return src if is_remote(src) else posixpath.basename(os.path.normpath(src))


def from_zarr(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    columns: list[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert a Zarr group (v2 or v3; a local path or an fsspec URL): arrays sharing a first axis become columns.

    ``columns`` picks the arrays (paths such as ``sim/u`` or column names ``sim.u``);
    ``storage_options`` go to fsspec. By default (``workers`` None or 0) the chunks are
    read in this process, where zarr fetches and decodes them concurrently itself;
    ``workers=N`` (N > 1) reads blocks of rows in N reader processes.
    """
    source = os.fspath(src).rstrip("/")
    if not is_remote(source) and not os.path.isdir(source):
        raise ChuteError(f"Zarr store {source} does not exist" if not os.path.exists(source) else f"{source} is not a Zarr directory")
    layout, attrs = scan(source, storage_options, columns)
    read = functools.partial(read_span, source, dict(storage_options or {}), layout)
    with OrderedPool(workers or 0) as pool:
        return write_blocks(
            pool.map(read, layout.spans()),
            dst,
            schema=layout.types,
            progress=Progress(layout.rows, "chute convert (zarr)", enabled=progress, unit="rows"),
            metadata=metadata(source, layout, attrs),
            shard_size=shard_size,
            overwrite=overwrite,
        )
