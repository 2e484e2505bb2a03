"""chute: keep the accelerator fed.

Stream a dataset from local disk or object storage into PyTorch as shuffled,
batched tensors, and find out when the data side is what slows training down.

The public names are resolved on first use (PEP 562), so ``import chute`` loads
neither torch, pyarrow nor fsspec: the command line answers ``chute --help``
at once, and a program pays for what it touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chute._lazy import exports
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
    "TextError": "chute.errors",
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
    "Stage": "chute.pipeline.stage",
    "BatchStage": "chute.pipeline.stage",
    "observe": "chute.observe",  # a subpackage, callable: chute.observe(iterable) measures any loop
    "mix": "chute.mixture",
    "sample_rng": "chute.pipeline.randomness",
    "sample_seed": "chute.pipeline.randomness",
    "images": "chute.images",  # a subpackage: the name is the module itself
    "tokens": "chute.tokens",  # a subpackage: the name is the module itself
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # what type checkers see of the lazy names above (tests/test_import.py checks both lists agree)
    from chute import images as images, tokens as tokens
    from chute.device import DeviceLoader as DeviceLoader, to_device as to_device
    from chute.errors import (
        CacheFullError as CacheFullError,
        ChuteError as ChuteError,
        ManifestError as ManifestError,
        PickleRefusedError as PickleRefusedError,
        RemoteError as RemoteError,
        SchemaError as SchemaError,
        ShardError as ShardError,
        StallError as StallError,
        TextError as TextError,
        WriteError as WriteError,
    )
    from chute.format.reader import Dataset as Dataset
    from chute.format.schema import (
        Bytes as Bytes,
        Json as Json,
        Map as Map,
        Nullable as Nullable,
        Ragged as Ragged,
        Scalar as Scalar,
        Schema as Schema,
        String as String,
        Tensor as Tensor,
    )
    from chute.mixture import mix as mix
    from chute.observe import observe as observe
    from chute.pipeline.config import Shuffle as Shuffle, Watchdog as Watchdog, Workers as Workers
    from chute.pipeline.loader import Loader as Loader
    from chute.pipeline.randomness import sample_rng as sample_rng, sample_seed as sample_seed
    from chute.pipeline.stage import BatchStage as BatchStage, Stage as Stage
    from chute.pipeline.torch_iterable import TorchIterable as TorchIterable
    from chute.storage.open import open_dataset as open  # noqa: F401  (in __all__ through _EXPORTS)
    from chute.storage.write import Writer as Writer, write as write


__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
