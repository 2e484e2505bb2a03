"""Convert NumPy ``.npy`` / ``.npz`` files into a chute dataset; the first axis indexes samples.

A ``.npy`` file becomes one column (``data`` unless named otherwise), read through
a memory map, so a file larger than memory converts in bounded memory. A ``.npz``
file becomes one column per array, named as in the archive; every array must have
the same first-axis length. Its members are streamed a block of rows at a time
(compressed or not) rather than loaded whole.

Per array: a 1-D numeric array gives a scalar column, an N-D one a tensor column
of shape ``shape[1:]``; a 1-D ``str`` array a str column and a 1-D ``bytes``
array a bytes column.
"""

from __future__ import annotations

import contextlib
import math
import os
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import numpy.lib.format as npformat

import chute
from chute.errors import ChuteError
from chute.format.schema import DTYPES, Bytes, ColumnType, Scalar, String, Tensor
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

BLOCK_BYTES = 4 * 2**20
"""Bytes of one array read at a time."""


def column_type(name: str, shape: tuple[int, ...], dtype: np.dtype, where: str) -> ColumnType:
    """The chute column for an array of ``shape`` and ``dtype`` whose first axis indexes samples."""
    if len(shape) == 0:
        raise ChuteError(f"{where}: array {name!r} is 0-dimensional; the first axis must index samples")
    if dtype.kind in "US":
        if len(shape) != 1:
            raise ChuteError(f"{where}: array {name!r} holds strings with shape {shape}; only 1-D string arrays convert")
        return String() if dtype.kind == "U" else Bytes()
    if dtype.name not in DTYPES or dtype.byteorder == ">":
        raise ChuteError(
            f"{where}: array {name!r} has dtype {dtype}, which chute cannot store; convert it to one of "
            f"{', '.join(DTYPES)} (native byte order)"
        )
    if len(shape) == 1:
        return Scalar(dtype.name)
    return Tensor(dtype.name, shape[1:])


def rows_per_block(arrays: list[tuple[tuple[int, ...], np.dtype]]) -> int:
    """Rows read at a time, the same for every array so their blocks line up."""
    row_bytes = max(max(1, math.prod(shape[1:]) * dtype.itemsize) for shape, dtype in arrays)
    return max(1, BLOCK_BYTES // row_bytes)


def _block_rows(block: np.ndarray) -> list[Any]:
    """One value per row: Python scalars/str/bytes for 1-D blocks, array views otherwise."""
    return block.tolist() if block.ndim == 1 else list(block)


# --------------------------------------------------------------------------- .npy


def _npy_blocks(array: np.ndarray, step: int) -> Iterator[list[Any]]:
    for start in range(0, len(array), step):
        yield _block_rows(np.asarray(array[start : start + step]))


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:  # object arrays need pickle
        raise ChuteError(f"{path} cannot be read without unpickling ({exc}); chute converts numeric and string arrays") from None


# --------------------------------------------------------------------------- .npz


class _Member:
    """One array of an ``.npz`` archive, read a block of rows at a time."""

    def __init__(self, archive: zipfile.ZipFile, member: str) -> None:
        self.member = member
        self.name = member[: -len(".npy")] if member.endswith(".npy") else member
        self.stream: IO[bytes] = archive.open(member)
        version = npformat.read_magic(self.stream)
        read_header = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        self.shape, self.fortran, self.dtype = read_header(self.stream)
        self.whole: np.ndarray | None = None
        if self.fortran or self.dtype.hasobject:  # not row-major on disk: read it whole
            with archive.open(member) as whole:
                self.whole = np.ascontiguousarray(npformat.read_array(whole, allow_pickle=False))

    def blocks(self, step: int) -> Iterator[list[Any]]:
        if self.whole is not None:
            yield from _npy_blocks(self.whole, step)
            return
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        for start in range(0, self.shape[0], step):
            rows = min(step, self.shape[0] - start)
            data = _read_exact(self.stream, rows * row_bytes, self.member)
            yield _block_rows(np.frombuffer(data, dtype=self.dtype).reshape(rows, *self.shape[1:]))


def _read_exact(stream: IO[bytes], size: int, member: str) -> bytes:
    parts, remaining = [], size
    while remaining:
        part = stream.read(remaining)
        if not part:
            raise ChuteError(f"array {member} ends early: the .npz file is truncated")
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)


@contextlib.contextmanager
def _open_npz(path: str) -> Iterator[list[_Member]]:
    """The arrays of an ``.npz``, open for streaming; every file is closed on leaving."""
    with contextlib.ExitStack() as stack:
        try:
            archive = stack.enter_context(zipfile.ZipFile(path))
            members = []
            for name in archive.namelist():
                if name.endswith(".npy"):
                    members.append(_Member(archive, name))
                    stack.callback(members[-1].stream.close)
        except (ValueError, zipfile.BadZipFile) as exc:
            raise ChuteError(f"{path} is not a valid .npz file ({exc})") from None
        if not members:
            raise ChuteError(f"{path} holds no arrays")
        yield members


def _check_lengths(path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    for name, shape in shapes.items():
        if len(shape) == 0:
            raise ChuteError(f"{path}: array {name!r} is 0-dimensional; the first axis must index samples")
    lengths = {name: shape[0] for name, shape in shapes.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in lengths.items())
        raise ChuteError(
            f"{path}: the arrays' first axes differ ({listed}); every array must have one entry per "
            "sample. Convert them separately or fix the arrays"
        )


# --------------------------------------------------------------------------- the converter


def from_numpy(
    path: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    column: str = "data",
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert a ``.npy`` (one column named ``column``) or ``.npz`` (one column per array).

    Sample ``i`` holds row ``i`` of each array (the first axis indexes samples).
    """
    source = os.fspath(path)
    if not os.path.isfile(source):
        raise ChuteError(f"{source} is not a file; the numpy source is one .npy or .npz file")
    if source.lower().endswith(".npz"):
        with _open_npz(source) as members:
            _check_lengths(source, {m.name: m.shape for m in members})
            names = [m.name for m in members]
            schema = {m.name: column_type(m.name, m.shape, m.dtype, source) for m in members}
            step = rows_per_block([(m.shape, m.dtype) for m in members])
            columns = [m.blocks(step) for m in members]
            return _write(source, dst, names, schema, columns, members[0].shape[0], shard_size, overwrite, progress)
    array = _load_npy(source)
    schema = {column: column_type(column, array.shape, array.dtype, source)}
    blocks = _npy_blocks(array, rows_per_block([(array.shape, array.dtype)]))
    return _write(source, dst, [column], schema, [blocks], len(array), shard_size, overwrite, progress)


def _write(
    source: str,
    dst: str | os.PathLike,
    names: list[str],
    schema: dict[str, ColumnType],
    columns: list[Iterator[list[Any]]],
    rows: int,
    shard_size: int | str,
    overwrite: bool,
    progress: bool,
) -> chute.Dataset:
    def samples() -> Iterator[tuple[dict[str, Any], str]]:
        row = 0
        for blocks in zip(*columns):
            for values in zip(*blocks):
                yield dict(zip(names, values)), f"{source} row {row}"
                row += 1

    return write_samples(
        samples(),
        dst,
        progress=Progress(rows, "chute convert (numpy)", enabled=progress, unit="rows"),
        schema=schema,
        metadata={"source": {"kind": "numpy", "file": os.path.basename(source)}},
        shard_size=shard_size,
        overwrite=overwrite,
    )
