"""The pipeline: a pass as one chain of stages, the runtime that runs and measures it, and the Loader (README.md here).

The names below are resolved on first use (chute/_lazy.py): ``chute.Loader``
loads the Loader's modules, not ``TorchIterable``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chute._lazy import exports

_EXPORTS = {
    "Loader": "chute.pipeline.loader",
    "TorchIterable": "chute.pipeline.torch_iterable",
    "Workers": "chute.pipeline.config",
    "Shuffle": "chute.pipeline.config",
    "Watchdog": "chute.pipeline.config",
    "Stage": "chute.pipeline.stage",
    "BatchStage": "chute.pipeline.stage",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from chute.pipeline.config import Shuffle as Shuffle, Watchdog as Watchdog, Workers as Workers
    from chute.pipeline.loader import Loader as Loader
    from chute.pipeline.stage import BatchStage as BatchStage, Stage as Stage
    from chute.pipeline.torch_iterable import TorchIterable as TorchIterable


__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
