"""HDF5 files (and NetCDF4 files, which are HDF5): converted, or read in place.

:func:`from_hdf5` converts the datasets that share a first axis into columns
(see :mod:`chute.sources._arrays` for the rules; nested groups give dotted
names, attributes go to the metadata under ``"hdf5"``). Chunked and
compressed datasets are read a block of whole chunks at a time by reader
processes (each opens the file itself), so their decompression runs in
parallel; uncompressed ones are read in this process, where the copy through
a pipe would cost more than the read.

:func:`open_hdf5` reads the file in place: the contiguous, uncompressed
datasets are arrays at byte offsets in the file, mapped where they lie
(:class:`chute.sources.inplace.InPlaceArrays`); no copy, no conversion, the
Loader's order, resume, ranks and gather kernel. A chunked or compressed
dataset cannot be mapped; the error says to convert.

NetCDF4's dimensions without values (``This is a netCDF dimension but not a
netCDF variable``) are left out; coordinate variables of another length (a
``lat`` beside ``time``-indexed fields) are skipped as any array of another
length. h5py is imported when a function here runs (``pip install 'chute[hdf5]'``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

import chute
from chute.errors import ChuteError
from chute.format.schema import Scalar, Tensor
from chute.sources._arrays import ArrayInfo, Layout, attributes, block_values, choose, column_name
from chute.sources._blocks import Block, write_blocks
from chute.sources._parallel import OrderedPool
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE
from chute.sources.inplace import InPlaceArrays, Mapped

HDF5_EXTENSIONS = (".h5", ".hdf5", ".he5", ".hdf", ".nc", ".nc4", ".cdf")
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
NETCDF_DIMENSION = b"This is a netCDF dimension but not a netCDF variable"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ChuteError("reading HDF5 files needs h5py: pip install 'chute[hdf5]'") from None
    return h5py


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise ChuteError(f"HDF5 file {path} does not exist" if not os.path.exists(path) else f"{path} is not a file")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:3] == b"CDF":
        raise ChuteError(
            f"{path} is a NetCDF classic (version 3) file, not NetCDF4/HDF5; convert it to NetCDF4 first "
            f"(nccopy -k nc4 {os.path.basename(path)} out.nc) or save it with xarray's to_netcdf(engine='h5netcdf')"
        )
    # the signature may sit at 0, 512, 1024, ... (a user block); h5py knows where to look
    if not _h5py().is_hdf5(path):
        raise ChuteError(f"{path} is not an HDF5 file (no HDF5 signature)")


def _info(h5py: Any, name: str, ds: Any) -> ArrayInfo | None:
    """What chute needs to know of one dataset (None: a NetCDF dimension without values)."""
    label = ds.attrs.get("NAME") if ds.attrs.get("CLASS") == b"DIMENSION_SCALE" else None
    if isinstance(label, bytes) and label.startswith(NETCDF_DIMENSION):
        return None
    dtype = ds.dtype
    shape = tuple(int(n) for n in ds.shape) if ds.shape is not None else ()
    chunks = ds.chunks
    chunk_rows = int(chunks[0]) if chunks else max(1, shape[0] if shape else 1)
    compressed = ds.id.get_create_plist().get_nfilters() > 0
    common = {"name": column_name(name), "path": "/" + name.lstrip("/"), "shape": shape, "dtype": dtype,
              "chunk_rows": chunk_rows, "compressed": compressed}
    string = h5py.check_string_dtype(dtype)
    if string is not None:
        return ArrayInfo(kind="string", **common)
    vlen = h5py.check_vlen_dtype(dtype)
    if vlen is not None:
        return ArrayInfo(kind="vlen", base=np.dtype(vlen), **common)
    if h5py.check_ref_dtype(dtype) is not None:
        return ArrayInfo(kind="other", why="object references", **common)
    if dtype.names:
        return ArrayInfo(kind="other", why=f"a compound type {dtype} (store its fields as separate datasets)", **common)
    if dtype.kind in "SV":
        return ArrayInfo(kind="bytes", **common)
    if dtype.kind in "biuf":
        return ArrayInfo(kind="number", **common)
    return ArrayInfo(kind="other", why=f"dtype {dtype}, which chute cannot store", **common)


def scan(path: str, columns: list[str] | None = None) -> tuple[Layout, dict[str, Any]]:
    """The columns of the HDF5 file at ``path`` and its attributes (by group/dataset path, ``/`` for the file's)."""
    h5py = _h5py()
    _check_file(path)
    arrays: list[ArrayInfo] = []
    attrs: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        if a := attributes(f.attrs):
            attrs["/"] = a

        def visit(name: str, obj: Any) -> None:
            if a := attributes(obj.attrs):
                attrs["/" + name] = a
            if isinstance(obj, h5py.Dataset):
                info = _info(h5py, name, obj)
                if info is not None:
                    arrays.append(info)

        f.visititems(visit)
    if not arrays:
        raise ChuteError(f"{path} holds no datasets; there is nothing to convert")
    return choose(arrays, path, columns), attrs


def metadata(path: str, layout: Layout, attrs: dict[str, Any]) -> dict[str, Any]:
    """The dataset's metadata: the file's name, what was skipped and why, the attributes."""
    source: dict[str, Any] = {"kind": "hdf5", "file": os.path.basename(path)}
    if layout.skipped:
        source["skipped"] = layout.skipped
    return {"source": source, "hdf5": {"attributes": attrs}} if attrs else {"source": source}


def read_span(path: str, layout: Layout, span: tuple[int, int]) -> list[Block]:
    """Rows ``span`` of every column, as one block (a reader task: opens the file itself)."""
    h5py = _h5py()
    a, b = span
    where = f"{os.path.basename(path)} rows {a}-{b - 1}"
    block: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        for info in layout.arrays:
            ctype = layout.types[info.name]
            try:
                raw = f[info.path][a:b]
            except OSError as exc:  # a damaged chunk, a filter that is not available
                raise ChuteError(f"{path}: dataset {info.path} rows {a}-{b - 1} cannot be read ({exc})") from None
            block[info.name] = block_values(info, ctype, raw, a, f"{path}")
    return [(block, b - a, where)]


def from_hdf5(
    path: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    columns: list[str] | None = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert an HDF5 (or NetCDF4) file: the datasets sharing a first axis become columns (see the module doc).

    ``columns`` picks the datasets (paths such as ``/sim/u`` or column names ``sim.u``).
    Compressed datasets are decoded by ``workers`` processes (default: one per CPU;
    0 reads in this process).
    """
    source = os.fspath(path)
    layout, attrs = scan(source, columns)
    spans = layout.spans()
    read = functools.partial(read_span, source, layout)
    with OrderedPool(workers if layout.compressed else 0) as pool:
        return write_blocks(
            pool.map(read, spans),
            dst,
            schema=layout.types,
            progress=Progress(layout.rows, "chute convert (hdf5)", enabled=progress, unit="rows"),
            metadata=metadata(source, layout, attrs),
            shard_size=shard_size,
            overwrite=overwrite,
        )


def in_place(path: str, columns: list[str] | None = None) -> tuple[Layout, list[Mapped], dict[str, Any]]:
    """The columns of ``path`` as arrays at file offsets, or a ChuteError naming the first that is not one."""
    layout, attrs = scan(path, columns)
    h5py = _h5py()
    mapped = []
    with h5py.File(path, "r") as f:
        for info in layout.arrays:
            ds = f[info.path]
            ctype = layout.types[info.name]
            why = _not_mappable(h5py, ds, info, ctype)
            if why:
                raise ChuteError(
                    f"{path}: dataset {info.path} cannot be read in place: it is {why}; convert the file "
                    f"(chute convert {os.path.basename(path)} OUT), or leave the dataset out with columns="
                )
            assert isinstance(ctype, (Tensor, Scalar))  # numbers (_not_mappable)
            mapped.append(Mapped(info.name, path, int(ds.id.get_offset()), ctype))
    return layout, mapped, attrs


def _not_mappable(h5py: Any, ds: Any, info: ArrayInfo, ctype: Any) -> str:
    """Why dataset ``ds`` is not one array at a file offset ("" when it is)."""
    if info.kind != "number":
        return f"{info.kind} data (only numbers are read in place)"
    plist = ds.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.CHUNKED:
        return "chunked" + (" and compressed" if info.compressed else "")
    if layout == h5py.h5d.COMPACT:
        return "stored in the file's metadata (compact layout)"
    if layout != h5py.h5d.CONTIGUOUS:
        return "a virtual dataset"
    if ds.external:
        return "stored in external files"
    if info.dtype.byteorder == ">":
        return f"big-endian ({info.dtype})"
    if ds.id.get_offset() is None:
        return "never written (its storage is not allocated)"
    return ""


def open_hdf5(
    path: str | os.PathLike, *, columns: list[str] | None = None, shard_size: int | str = DEFAULT_SHARD_SIZE,
) -> InPlaceArrays:
    """An HDF5 (or NetCDF4) file read in place, as a dataset for :class:`chute.Loader` (and ``get_batch``, ``ds[i]``).

    The columns are those :func:`from_hdf5` would write (or ``columns``); each must be
    contiguous and uncompressed. Rows are cut into shards as the converter cuts them
    (``shard_size``), so a shuffled Loader gives the same batches over this view as
    over the converted dataset.
    """
    source = os.fspath(path)
    layout, mapped, attrs = in_place(source, columns)
    return InPlaceArrays(source, mapped, layout.rows, shard_size=shard_size, metadata=metadata(source, layout, attrs))
