"""The chute dataset format: schema, manifest, shard writer and reader (see docs/format.md).

The names below are resolved on first use (PEP 562): a process that only reads
(``chute.open``, a Loader) never imports the writer and its schema inference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chute._lazy import exports

_EXPORTS = {
    "FORMAT_VERSION": "chute.format.manifest",
    "Manifest": "chute.format.manifest",
    "ShardInfo": "chute.format.manifest",
    "Dataset": "chute.format.reader",
    "Schema": "chute.format.schema",
    "Tensor": "chute.format.schema",
    "Ragged": "chute.format.schema",
    "Scalar": "chute.format.schema",
    "Bytes": "chute.format.schema",
    "String": "chute.format.schema",
    "Map": "chute.format.schema",
    "Json": "chute.format.schema",
    "DEFAULT_SHARD_SIZE": "chute.format.writer",
    "Writer": "chute.format.writer",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from chute.format.manifest import FORMAT_VERSION as FORMAT_VERSION, Manifest as Manifest, ShardInfo as ShardInfo
    from chute.format.reader import Dataset as Dataset
    from chute.format.schema import (
        Bytes as Bytes,
        Json as Json,
        Map as Map,
        Ragged as Ragged,
        Scalar as Scalar,
        Schema as Schema,
        String as String,
        Tensor as Tensor,
    )
    from chute.format.writer import DEFAULT_SHARD_SIZE as DEFAULT_SHARD_SIZE, Writer as Writer


__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
