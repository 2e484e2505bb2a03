"""chute: keep the accelerator fed.

Stream a dataset from local disk or object storage into PyTorch as shuffled,
batched tensors, and find out when the data side is what slows training down.

The public names are resolved on first use (PEP 562), so ``import chute`` loads
neither torch, pyarrow nor fsspec: the command line answers ``chute --help``
at once, and a program pays for what it touches.
"""

from __future__ import annotations

import importlib
from typing import Any

from chute._version import __version__

# Public name -> the module that defines it ("module:attribute" when the name differs there).
# Adding a public name is one line here.
_EXPORTS = {
    "ChuteError": "chute.errors",
    "ManifestError": "chute.errors",
    "SchemaError": "chute.errors",
    "ShardError": "chute.errors",
    "PickleRefusedError": "chute.errors",
    "StallError": "chute.errors",
    "RemoteError": "chute.errors",
    "CacheFullError": "chute.errors",
    "WriteError": "chute.errors",
    "open": "chute.storage.open:open_dataset",
    "write": "chute.storage.write",
    "Writer": "chute.storage.write",
    "Dataset": "chute.format.reader",
    "Schema": "chute.format.schema",
    "Tensor": "chute.format.schema",
    "Ragged": "chute.format.schema",
    "Scalar": "chute.format.schema",
    "Bytes": "chute.format.schema",
    "String": "chute.format.schema",
    "Map": "chute.format.schema",
    "Json": "chute.format.schema",
    "Nullable": "chute.format.schema",
    "to_device": "chute.device",
    "DeviceLoader": "chute.device",
    "Loader": "chute.pipeline.loader",
    "TorchIterable": "chute.pipeline.torch_iterable",
    "Workers": "chute.pipeline.config",
    "Shuffle": "chute.pipeline.config",
    "Watchdog": "chute.pipeline.config",
    "observe": "chute.observe",  # a subpackage, callable: chute.observe(iterable) measures any loop
    "mix": "chute.mixture",
    "sample_rng": "chute.pipeline.randomness",
    "sample_seed": "chute.pipeline.randomness",
    "images": "chute.images",  # a subpackage: the name is the module itself
    "tokens": "chute.tokens",  # a subpackage: the name is the module itself
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import the module behind a public name the first time the name is used."""
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'chute' has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    imported = importlib.import_module(module)
    value = imported if module == f"{__name__}.{name}" else getattr(imported, attribute or name)
    globals()[name] = value  # later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
