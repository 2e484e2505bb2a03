"""The collate stage: transformed samples back into one batch, in the Loader's own memory.

What ``torch.utils.data.default_collate`` gives (tensors stacked along a new
first dimension, numbers as a tensor, strings and other values as lists,
dicts collated key by key), built into blocks of the Loader's
:class:`Arena` instead of fresh tensors:

* small samples (tensors under 64 KiB) are kept until the batch is complete and
  stacked with one ``torch.stack(..., out=block)`` per column;
* large samples (decoded images) are copied into their slot of the block as
  they come, so that one transformed sample is alive at a time, not the whole
  batch: keeping a whole batch of decoded images alive costs page faults on
  every image (docs/benchmarks.md, design figures).

Anything else (mixed shapes, nested containers, custom types) goes to
``default_collate`` with its usual results. When that fails, the error names
the sample and says what to do, instead of a traceback from deep inside torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from chute._arena import Arena
from chute.errors import ChuteError

#: Samples whose tensors reach this size are copied into the batch as they come.
STREAM_BYTES = 64 << 10


class CollateError(ChuteError):
    """Samples could not be put together into a batch; the message names the sample and what to do."""


def _stackable(value: Any) -> bool:
    return (
        type(value) is torch.Tensor and value.device.type == "cpu" and value.layout == torch.strided
        and not value.requires_grad and not value.is_quantized and value.dtype != torch.bfloat16
    )


class Collate:
    """Collects the samples of one batch (``add``), then makes the batch (``result``).

    ``origin(j)`` describes sample ``j`` for error messages (its dataset row and shard).
    """

    def __init__(self, n: int, pool: Arena | None, origin: Any) -> None:
        self.n, self.pool, self.origin = n, pool, origin
        self.samples: list[Any] = []
        self.count = 0
        self.stream: dict[Any, torch.Tensor] | None = None  # key (None for a bare tensor) -> block, when streaming
        self.add: Callable[[Any], None] = self._first

    # ------------------------------------------------------------------ collecting

    def _first(self, sample: Any) -> None:
        """The first sample decides how the batch is built."""
        self.add = self.samples.append
        tensors = {None: sample} if _stackable(sample) else (
            {k: v for k, v in sample.items() if _stackable(v)} if type(sample) is dict else {}
        )
        if self.pool is not None and tensors and max(t.nbytes for t in tensors.values()) >= STREAM_BYTES:
            self.stream = {}
            for key, t in tensors.items():
                array, block = self.pool.take((self.n, *t.shape), t.numpy().dtype)
                self.stream[key] = block
            self.add = self._streamed
            self._streamed(sample)
            return
        self.samples.append(sample)

    def _streamed(self, sample: Any) -> None:
        """Copy the sample's large tensors into their slot now; keep the rest of it for ``result``."""
        j = self.count
        stream = self.stream
        assert stream is not None  # set by _first before it makes this method the adder
        if None in stream:
            if not (_stackable(sample) and sample.shape == stream[None].shape[1:] and sample.dtype == stream[None].dtype):
                self._unstream(sample)
                return
            _copy_into(stream[None][j], sample)
            self.samples.append(None)
        else:
            if type(sample) is not dict:
                self._unstream(sample)
                return
            rest = dict(sample)
            for key, block in stream.items():
                value: Any = rest.get(key)
                if not (_stackable(value) and value.shape == block.shape[1:] and value.dtype == block.dtype):
                    self._unstream(sample)
                    return
                _copy_into(block[j], value)
                rest[key] = None
            self.samples.append(rest)
        self.count += 1

    def _unstream(self, sample: Any) -> None:
        """A sample that does not fit the blocks: go back to plain samples (the copied ones as views of their slot)."""
        stream, self.stream = self.stream, None
        assert stream is not None
        restored: list[Any] = []
        for j, kept in enumerate(self.samples):
            if None in stream:
                restored.append(stream[None][j])
            else:
                restored.append({k: stream[k][j] if k in stream else v for k, v in kept.items()})
        self.samples = restored
        self.samples.append(sample)
        self.add = self.samples.append

    # ------------------------------------------------------------------ the batch

    def result(self) -> Any:
        samples = self.samples
        stream = self.stream
        if stream is not None:
            count = self.count
            if None in stream:
                return stream[None][:count]
            out = {}
            for key in samples[0]:
                if key in stream:
                    out[key] = stream[key][:count]
                else:
                    out[key] = self._collate([s[key] for s in samples], key)
            return out
        first = samples[0]
        if _stackable(first):
            return self._stack(samples, None)
        if type(first) is dict:
            keys = first.keys()
            for j, sample in enumerate(samples):
                if type(sample) is not dict or sample.keys() != keys:
                    raise self._mismatch(j, sample, first)
            return {key: self._collate([s[key] for s in samples], key) for key in first}
        return self._collate(samples, None)

    def _collate(self, values: list[Any], key: Any) -> Any:
        if _stackable(values[0]):
            return self._stack(values, key)
        try:
            return default_collate(values)
        except Exception as exc:
            raise self._failed(values, key, exc) from exc

    def _stack(self, values: list[torch.Tensor], key: Any) -> Any:
        first = values[0]
        dtype = first.dtype
        for value in values:  # a cheap check per sample; torch.stack checks shapes, devices and grads itself
            if type(value) is not torch.Tensor or value.dtype is not dtype:
                return self._collate_plain(values, key)
        if self.pool is None:
            return self._collate_plain(values, key)
        _, block = self.pool.take((len(values), *first.shape), first.numpy().dtype)
        try:
            return torch.stack(values, out=block)
        except (RuntimeError, TypeError, ValueError):  # shapes differ, a tensor needs grad, lives elsewhere...
            return self._collate_plain(values, key)

    def _collate_plain(self, values: list[Any], key: Any) -> Any:
        try:
            return default_collate(values)
        except Exception as exc:
            raise self._failed(values, key, exc) from exc

    # ------------------------------------------------------------------ errors

    def _failed(self, values: list[Any], key: Any, exc: Exception) -> CollateError:
        what = "the samples" if key is None else f"the values of key {key!r}"
        for j, value in enumerate(values):
            if value is None:
                return CollateError(
                    f"the transform returned None for {self.origin(j)}{'' if key is None else f' (key {key!r})'}; "
                    "a transform must return the sample (return it, or raise to skip it with on_error='skip')"
                )
        first = values[0]
        for j, value in enumerate(values):
            if type(value) is not type(first) or (isinstance(value, torch.Tensor) and value.shape != first.shape):
                shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
                first_shape = f" of shape {tuple(first.shape)}" if isinstance(first, torch.Tensor) else ""
                return CollateError(
                    f"cannot collate {what}: {self.origin(j)} gives {type(value).__name__}{shape} where "
                    f"{self.origin(0)} gives {type(first).__name__}{first_shape} ({type(exc).__name__}: {exc}). "
                    "Make the transform return the same kind of value for every sample, or pass collate=list "
                    "to get the samples as a list"
                )
        return CollateError(
            f"cannot collate {what} ({type(exc).__name__}: {exc}); pass collate=list to get the samples as a "
            "list, or a collate function of your own"
        )

    def _mismatch(self, j: int, sample: Any, first: dict) -> CollateError:
        if sample is None:
            return CollateError(
                f"the transform returned None for {self.origin(j)}; a transform must return the sample "
                "(return it, or raise to skip it with on_error='skip')"
            )
        if type(sample) is not dict:
            return CollateError(
                f"cannot collate: {self.origin(j)} is a {type(sample).__name__} where {self.origin(0)} is a dict; "
                "make the transform return the same kind of value for every sample, or pass collate=list"
            )
        missing, extra = sorted(map(str, first.keys() - sample.keys())), sorted(map(str, sample.keys() - first.keys()))
        return CollateError(
            f"cannot collate dicts with different keys: {self.origin(j)} "
            + (f"lacks {missing}" if missing else "") + (" and " if missing and extra else "")
            + (f"has extra {extra}" if extra else "")
            + f" compared with {self.origin(0)}. Make every sample have the same keys, or pass collate=list"
        )


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` on this thread alone.

    torch splits a copy of more than 32K elements over its intra-op threads,
    whose OpenMP workers then spin after each one: called from loader threads,
    that took a core from the decoding (docs/benchmarks.md, design figures).
    numpy copies on the calling thread, without the GIL.
    """
    try:
        np.copyto(dst.numpy(), src.numpy(), casting="no")
    except (TypeError, RuntimeError, ValueError):
        dst.copy_(src)


copy_into = _copy_into
