"""``chute convert --ray ADDRESS``: a converter's source read and written by Ray tasks.

The source is cut into parts (:func:`chute.sources.parts.plan`: chunks of an
index or image folder, tars, Parquet files, row ranges); a Ray dataset of part
numbers goes through :class:`chute.ray.sink.ChuteDatasink`, whose write tasks
read their parts and write shards, and the driver writes the manifest. Rows are
in part order (parts keep the source's order; Ray keeps the parts' order).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import ray

import chute
from chute._sizes import parse_size
from chute.errors import ChuteError
from chute.format.schema import ColumnType, Schema, infer_schema
from chute.format.writer import DEFAULT_LOOKAHEAD, DEFAULT_SHARD_SIZE
from chute.ray.sink import ChuteDatasink, run
from chute.sources.parts import plan


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``, ``ray://host:port``; ``local``: start one here)."""
    if ray.is_initialized():
        return
    ray.init(address=None if address == "local" else address, log_to_driver=False, configure_logging=False)


def convert_on_ray(
    src: Any,
    dst: str | os.PathLike,
    *,
    address: str = "auto",
    kind: str | None = None,
    allow_pickle: bool = False,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    rows_per_part: int | None = None,
    **kind_specific: Any,
) -> chute.Dataset:
    """Convert ``src`` into a chute dataset at ``dst`` with Ray tasks on the cluster at ``address``.

    ``address``: ``"auto"`` (the cluster this process can find), ``"ray://host:10001"``,
    or ``"local"`` (start one here). The other arguments are those of
    :func:`chute.sources.convert` (``workers`` and ``progress`` do not apply); the
    dataset is the one the converter writes, its shards written in parallel.
    ``rows_per_part`` sets how many rows a Ray read task takes.
    """
    options = {} if rows_per_part is None else {"rows_per_part": rows_per_part}
    source = plan(src, kind, allow_pickle=allow_pickle, **options, **kind_specific)
    if not source.parts:
        raise ChuteError(f"{src} holds no samples to convert")
    first = [sample for sample, _ in source.read(source.parts[0])]  # the first part, read here
    schema: Schema | Mapping[str, ColumnType] | None = source.schema
    if schema is None:  # as the converter does: from the first samples
        schema = infer_schema(first[:DEFAULT_LOOKAHEAD], first_position=0)
    per_part = max(1, sum(sample_bytes(sample) for sample in first))
    parts_per_write = max(1, math.ceil(max(1, parse_size(shard_size)) / per_part))
    connect(address)
    parts = ray.data.from_items([{"part": i} for i in range(len(source.parts))], override_num_blocks=len(source.parts))
    parts.context.execution_options.preserve_order = True
    sink = ChuteDatasink(
        dst, schema=schema, shard_size=shard_size, overwrite=overwrite, metadata=source.metadata, plan=source,
        parts_per_write=parts_per_write,
    )
    return run(parts, sink)


def sample_bytes(sample: dict[str, Any]) -> int:
    """About the bytes a sample adds to a shard (arrays, bytes and strings by size, anything else 8)."""
    total = 0
    for value in sample.values():
        if hasattr(value, "nbytes"):
            total += int(value.nbytes)
        elif isinstance(value, (bytes, str)):
            total += len(value) + 8
        elif isinstance(value, dict):
            total += sum(len(str(k)) + len(str(v)) for k, v in value.items()) + 16
        else:
            total += 8
    return total
