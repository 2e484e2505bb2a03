"""Reused output buffers for the batches the Loader gathers.

A fresh multi-megabyte tensor per batch costs a page fault per 4 KiB the first
time it is written (the allocator returns large blocks to the kernel), which
halved gather speed for 1 MiB records in a probe. So fixed-size columns are
gathered into buffers that are reused, but only once nothing outside this pool
refers to them: the Python reference count of the tensor and the use count of
its storage (which counts views, such as ``batch["x"][0]`` kept by the user)
must both be back to the pool's own. A batch the user keeps is never rewritten;
the pool just allocates another buffer.
"""

from __future__ import annotations

import sys
import threading

import torch

try:  # the storage use count (views included); without it, buffers are not reused
    from torch._C import _storage_Use_Count as _storage_use_count
except ImportError:  # pragma: no cover - older or newer torch
    _storage_use_count = None


def _counts(buffers: list[torch.Tensor], i: int) -> tuple[int, int]:
    """References to ``buffers[i]``: Python's, and its storage's (which counts views)."""
    return sys.getrefcount(buffers[i]), _storage_use_count(buffers[i].untyped_storage()._cdata)


def _baseline() -> tuple[int, int] | None:
    """``_counts`` of a buffer that only the pool's list refers to."""
    if _storage_use_count is None:
        return None
    probe = [torch.empty(1)]
    return _counts(probe, 0)


class BufferPool:
    """Tensors keyed by ``(shape, dtype)``, handed out again once nobody else holds them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep  # buffers remembered per key; more are left to the garbage collector
        self._buffers: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._free = _baseline()
        self.allocated = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        key = (shape, dtype)
        with self._lock:
            buffers = self._buffers.setdefault(key, [])
            if self._free is not None:
                for i in range(len(buffers)):
                    if _counts(buffers, i) == self._free:
                        buffers.append(buffers.pop(i))  # checked oldest first
                        return buffers[-1]
            buffers.append(torch.empty(shape, dtype=dtype))
            self.allocated += 1
            if len(buffers) > self.keep:
                buffers.pop(0)  # forget the oldest; whoever holds it keeps it
            return buffers[-1]
