"""How the columns of Ray Data blocks become chute columns.

Ray stores arrays as its own Arrow extension types: a fixed-shape tensor column
becomes a chute ``Tensor``, a variable-shaped one a ``Ragged``. Every other
Arrow type maps as in ``chute convert`` from Parquet (:mod:`chute.sources._arrow`),
except that a nested list column whose shape the type does not fix becomes
``Ragged`` (a Ray write cannot scan the data first; declare ``schema=`` to make
it a ``Tensor``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from chute.errors import ChuteError
from chute.format.schema import ColumnType, Ragged, Schema, Tensor
from chute.sources._arrow import Column, ShapeScan, batch_samples, needs_shape_scan, plan_columns

_RAY_TENSOR = "ray.data.arrow_tensor"  # ray.data.arrow_tensor, ..._v2
_RAY_RAGGED = "ray.data.arrow_variable_shaped_tensor"


def _ray_tensor_column(field: pa.Field) -> Column | None:
    """The chute column of a field of one of Ray's tensor types, else None."""
    t = field.type
    name = getattr(t, "extension_name", "")
    if not name.startswith(_RAY_TENSOR) and not name.startswith(_RAY_RAGGED):
        return None
    value = t.value_type
    dtype = "bool" if pa.types.is_boolean(value) else np.dtype(value.to_pandas_dtype()).name
    if name.startswith(_RAY_RAGGED) or any(d is None for d in t.shape):
        return Column(field.name, Ragged(dtype, len(t.shape)), lambda a: list(a.to_numpy(zero_copy_only=False)))
    return Column(field.name, Tensor(dtype, tuple(t.shape)), lambda a: a.to_numpy(zero_copy_only=False))


def plan_block_columns(schema: pa.Schema, declared: Schema | None, where: str) -> list[Column]:
    """How each column of blocks of ``schema`` is converted; with ``declared``, its types win.

    Raises naming the columns when ``declared`` and the blocks do not have the same names.
    """
    if declared is not None and set(declared.names) != set(schema.names):
        missing, extra = sorted(set(declared.names) - set(schema.names)), sorted(set(schema.names) - set(declared.names))
        raise ChuteError(
            f"{where}: the Ray dataset's columns {schema.names} do not match the declared schema's "
            f"{declared.names} (missing: {missing}, not declared: {extra}); select or rename columns first"
        )
    others = pa.schema([f for f in schema if _ray_tensor_column(f) is None])
    scans = {f.name: ShapeScan() for f in others if needs_shape_scan(f.type)}  # no scan: an unfixed shape is ragged
    planned = {c.name: c for c in plan_columns(others, scans, where=where)} if len(others) else {}
    columns = []
    for field in schema:
        column = _ray_tensor_column(field) or planned[field.name]
        if declared is not None:
            column = Column(field.name, declared[field.name], column.convert, column.nullable)
        columns.append(column)
    if declared is not None:
        columns.sort(key=lambda c: declared.names.index(c.name))
    return columns


def chute_schema(columns: list[Column]) -> Schema:
    types: dict[str, ColumnType] = {c.name: c.ctype for c in columns}
    return Schema.from_dict(types)


def block_samples(table: pa.Table, columns: list[Column], where: str) -> Iterator[dict[str, Any]]:
    """The rows of one block as samples for chute's writer, converted a slice at a time."""
    first = 0
    for batch in table.select([c.name for c in columns]).to_batches():
        for sample, _ in batch_samples(batch, columns, where=where, first_row=first):
            yield sample
        first += batch.num_rows
