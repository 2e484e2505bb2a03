"""The pipeline: a pass as one chain of stages, the runtime that runs and measures it, and the Loader (README.md here).

``TorchIterable`` is resolved on first use (chute/_lazy.py): ``chute.Loader``
does not load its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chute._lazy import exports
from chute.pipeline.config import Shuffle, Watchdog, Workers
from chute.pipeline.loader import Loader
from chute.pipeline.stage import BatchStage, Stage

__all__ = ["Loader", "TorchIterable", "Workers", "Shuffle", "Watchdog", "Stage", "BatchStage"]

if TYPE_CHECKING:
    from chute.pipeline.torch_iterable import TorchIterable as TorchIterable

__getattr__, __dir__ = exports(__name__, {"TorchIterable": "chute.pipeline.torch_iterable"}, globals())
