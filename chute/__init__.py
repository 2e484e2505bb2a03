"""chute: keep the accelerator fed.

Stream a dataset from local disk or object storage into PyTorch as shuffled,
batched tensors, and find out when the data side is what slows training down.
"""

__version__ = "0.1.0"

from chute.device import DeviceLoader, to_device
from chute.errors import ChuteError, ManifestError, PickleRefusedError, SchemaError, ShardError
from chute.format import (
    Bytes,
    Dataset,
    Json,
    Map,
    Ragged,
    Scalar,
    Schema,
    String,
    Tensor,
    Writer,
    write,
)
from chute.format import open_dataset as open
from chute.pipeline import Loader, TorchIterable

__all__ = [
    "__version__",
    "ChuteError", "ManifestError", "SchemaError", "ShardError", "PickleRefusedError",
    "open", "write", "Writer", "Dataset", "Schema",
    "Tensor", "Ragged", "Scalar", "Bytes", "String", "Map", "Json",
    "to_device", "DeviceLoader", "Loader", "TorchIterable",
]
