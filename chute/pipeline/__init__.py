"""The pipeline: a pass as one chain of stages, the runtime that runs and measures it, and the Loader (README.md here)."""

from chute.pipeline.config import Shuffle, Watchdog, Workers
from chute.pipeline.loader import Loader
from chute.pipeline.stage import BatchStage, Stage
from chute.pipeline.torch_iterable import TorchIterable

__all__ = ["Loader", "TorchIterable", "Workers", "Shuffle", "Watchdog", "Stage", "BatchStage"]
