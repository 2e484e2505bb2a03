"""chute: keep the accelerator fed.

Stream a dataset from local disk or object storage into PyTorch as shuffled,
batched tensors, and find out when the data side is what slows training down.
"""

__version__ = "0.1.0"

from chute.device import DeviceLoader, to_device
from chute.errors import (
    CacheFullError,
    ChuteError,
    ManifestError,
    PickleRefusedError,
    RemoteError,
    SchemaError,
    ShardError,
    StallError,
    WriteError,
)
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

# Last, so that ``chute.observe`` is the function, not the subpackage of the same name
# (import submodules as ``from chute.observe.report import Report``).
from chute.observe.consumer import observe  # noqa: E402

__all__ = [
    "__version__",
    "ChuteError", "ManifestError", "SchemaError", "ShardError", "PickleRefusedError", "StallError",
    "RemoteError", "CacheFullError", "WriteError",
    "open", "write", "Writer", "Dataset", "Schema",
    "Tensor", "Ragged", "Scalar", "Bytes", "String", "Map", "Json",
    "to_device", "DeviceLoader", "Loader", "TorchIterable", "observe",
]
