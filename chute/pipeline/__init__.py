"""The pipeline: a pass's stages, the executors that run its batch tasks, and the Loader (see README.md here)."""

from chute.pipeline.config import Shuffle, Watchdog, Workers
from chute.pipeline.loader import Loader
from chute.pipeline.torch_iterable import TorchIterable

__all__ = ["Loader", "TorchIterable", "Workers", "Shuffle", "Watchdog"]
