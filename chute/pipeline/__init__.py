"""The pipeline: batch tasks on worker threads, delivered in the global order (see loader.py)."""

from chute.pipeline.loader import Loader
from chute.pipeline.torch_iterable import TorchIterable

__all__ = ["Loader", "TorchIterable"]
