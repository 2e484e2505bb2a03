"""Convert Parquet, Arrow IPC (file or stream) and Feather files into a chute dataset.

Each file is read one record batch at a time (Parquet by row group; Arrow files
memory-mapped), so a source larger than memory converts in bounded memory. Rows
keep their order: files in the order given (a directory's files sorted by name),
then row order within each file. Column types follow :mod:`chute.sources._arrow`.
The format is recognised by the file's magic bytes, not its extension.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Iterator, Sequence
from typing import cast

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

import chute
from chute.errors import ChuteError
from chute.sources._arrow import (
    ROWS_PER_SLICE,
    batch_samples,
    check_same_schema,
    needs_shape_scan,
    number_batches,
    plan_columns,
    scan_shapes,
)
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

ARROW_EXTENSIONS = (".parquet", ".pq", ".arrow", ".feather", ".ipc")
_GLOB_CHARS = "*?["


def list_arrow_files(src: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The files to convert: a file, a directory's Arrow/Parquet files (sorted), a glob, or a list."""
    if isinstance(src, (list, tuple)):
        files = [f for part in src for f in list_arrow_files(part)]
        if not files:
            raise ChuteError("no files to convert: the list of sources is empty")
        return files
    path = os.fspath(cast("str | os.PathLike", src))  # not a list or tuple here
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name) for name in os.listdir(path) if name.lower().endswith(ARROW_EXTENSIONS)
        )
        if not files:
            raise ChuteError(f"directory {path} holds no {'/'.join(ARROW_EXTENSIONS)} files")
        return files
    if os.path.isfile(path):
        return [path]
    if any(c in path for c in _GLOB_CHARS):
        files = sorted(glob.glob(path))
        if files:
            return files
    raise ChuteError(f"{path} does not exist")


@dataclasses.dataclass
class ArrowFile:
    """One Parquet / Arrow IPC / Feather file: its schema, row count and record batches."""

    path: str
    format: str  # "parquet", "ipc-file", "ipc-stream" or "feather-v1"
    schema: pa.Schema
    rows: int

    @classmethod
    def open(cls, path: str) -> ArrowFile:
        with open(path, "rb") as f:
            magic = f.read(6)
        try:
            if magic[:4] == b"PAR1":
                with pq.ParquetFile(path) as reader:
                    return cls(path, "parquet", reader.schema_arrow, reader.metadata.num_rows)
            if magic == b"ARROW1":
                with pa.memory_map(path) as source:
                    reader = pa.ipc.open_file(source)
                    rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
                    return cls(path, "ipc-file", reader.schema, rows)
            if magic[:4] == b"FEA1":  # Feather v1 has no batches: read whole (it is a legacy format)
                table = feather.read_table(path)
                return cls(path, "feather-v1", table.schema, table.num_rows)
            with pa.memory_map(path) as source:  # batches are views of the mapping: counting is cheap
                reader = pa.ipc.open_stream(source)
                return cls(path, "ipc-stream", reader.schema, sum(b.num_rows for b in reader))
        except (pa.ArrowInvalid, OSError) as exc:
            raise ChuteError(f"{path} is not a readable Parquet, Arrow or Feather file ({exc})") from None

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The file's record batches (only ``columns``, if given), in order."""
        if self.format == "parquet":
            with pq.ParquetFile(self.path) as reader:
                yield from reader.iter_batches(batch_size=ROWS_PER_SLICE, columns=columns)
            return
        if self.format == "feather-v1":
            yield from feather.read_table(self.path, columns=columns).to_batches()
            return
        with pa.memory_map(self.path) as source:
            if self.format == "ipc-file":
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                batches = pa.ipc.open_stream(source)
            for batch in batches:
                yield batch.select(columns) if columns is not None else batch

def select_schema(schema: pa.Schema, columns: Sequence[str] | None, where: str) -> pa.Schema:
    """``schema`` restricted to ``columns`` (in that order), naming unknown ones."""
    if columns is None:
        return schema
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ChuteError(f"{where} has no column(s) {missing}; its columns are {schema.names}")
    return pa.schema([schema.field(c) for c in columns])


def plan_arrow_files(src: str | os.PathLike | Sequence[str | os.PathLike], columns: Sequence[str] | None) -> tuple[list[ArrowFile], pa.Schema, list]:
    """The files, their (selected) schema, and how each column converts (shapes scanned where needed)."""
    files = [ArrowFile.open(path) for path in list_arrow_files(src)]
    schema = select_schema(files[0].schema, columns, files[0].path)
    for other in files[1:]:
        check_same_schema(schema, select_schema(other.schema, columns, other.path), files[0].path, other.path)
    scan_names = [f.name for f in schema if needs_shape_scan(f.type)]
    scans = scan_shapes(schema, ((b, f.path) for f in files for b in f.batches(scan_names))) if scan_names else {}
    return files, schema, plan_columns(schema, scans, where=files[0].path)


def from_arrow_files(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    columns: Sequence[str] | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert Parquet / Arrow / Feather files: one file, a directory of them, a glob or a list.

    All files must have the same columns and types. ``columns`` keeps only those columns.
    Numbers become scalar columns, strings str, binary bytes, nested lists of numbers
    tensors (one shape) or ragged arrays (shapes vary), Hugging Face image structs the
    image's bytes, and anything else JSON. Null values are an error naming the file,
    row and column.
    """
    files, schema, plan = plan_arrow_files(src, columns)
    samples = (
        sample
        for f in files
        for first_row, batch in number_batches(f.batches(schema.names))
        for sample in batch_samples(batch, plan, where=f.path, first_row=first_row)
    )
    return write_samples(
        samples,
        dst,
        progress=Progress(sum(f.rows for f in files), "chute convert (arrow)", enabled=progress, unit="rows"),
        schema={c.name: c.ctype for c in plan},
        metadata={"source": {"kind": "arrow", "files": [os.path.basename(f.path) for f in files]}},
        shard_size=shard_size,
        overwrite=overwrite,
    )
