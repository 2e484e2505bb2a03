"""The chute dataset format: schema, manifest, shard writer and reader (see docs/format.md)."""

from chute.format.manifest import FORMAT_VERSION, Manifest, ShardInfo
from chute.format.reader import Dataset
from chute.format.schema import Bytes, Json, Map, Ragged, Scalar, Schema, String, Tensor
from chute.format.writer import DEFAULT_SHARD_SIZE, Writer

__all__ = [
    "FORMAT_VERSION", "DEFAULT_SHARD_SIZE", "Manifest", "ShardInfo", "Dataset",
    "Schema", "Tensor", "Ragged", "Scalar", "Bytes", "String", "Map", "Json", "Writer",
]
