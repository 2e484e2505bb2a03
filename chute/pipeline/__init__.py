"""The pipeline: batch tasks on worker threads, delivered in the global order (see loader.py)."""

from chute.pipeline.loader import Loader

__all__ = ["Loader"]
