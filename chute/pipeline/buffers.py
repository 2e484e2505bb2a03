"""Output blocks: the memory batches are built in, reused once nobody holds them.

A fresh multi-megabyte tensor per batch costs a page fault for every 4 KiB the
first time it is written (the allocator gives large blocks back to the
kernel); that halved gather speed for 1 MiB rows in a probe. So the Loader
builds every fixed-size column of a batch in a *block* taken from this pool,
and the block comes back when the batch is dropped.

Ownership uses only public mechanisms. A block is a numpy array owned by the
pool. Handing it out makes a fresh numpy view of it and a tensor with
``torch.from_numpy(view)``: the tensor's storage keeps ``view`` alive for as
long as the tensor, or any view or slice of it (``batch["x"][0]`` kept for
logging), exists. A weak reference to ``view`` (a :class:`Lease`) has the
pool's free list as its callback, so when the last tensor using the storage is
freed, the lease lands in the free list, by the garbage collector's own
bookkeeping, on whatever thread dropped the batch. A batch the user keeps is
never rewritten; the pool allocates another block meanwhile.

Pinned blocks (``pin=True``, for a CUDA device) are read by an asynchronous
copy after the host batch is dropped; the device stage keeps the host batch
alive until the copy's event has completed (``chute.device``), so the same
rule covers them.

Taking a block costs two C calls and no Python-level call; returning one costs
nothing on the consumer's side.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch


class Lease(weakref.ref):
    """A weak reference to the view a tensor was made from; ``block`` goes back to the pool when it dies.

    Hashed by identity (the view it refers to is not hashable), so the pool can
    keep its leases in a dict without a Python call per batch.
    """

    __slots__ = ("block",)
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class BlockPool:
    """Numpy blocks keyed by ``(shape, numpy dtype)``, handed out as tensors and reused when dropped.

    Safe to use from several threads (list appends and pops are atomic, and
    each free list is only ever popped by :meth:`take`).
    """

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._free: dict[tuple[tuple[int, ...], np.dtype], list[Lease]] = {}
        self._leases: dict[Lease, None] = {}  # leases out: a weakref's callback fires only while the weakref lives
        self.allocated = 0  # blocks ever allocated (stays flat once the pool is warm)

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Any]:
        """``(array, tensor)``: a writable block of ``shape`` and ``dtype``, as numpy and as torch (one memory)."""
        arrays, tensors = self.take_all(((shape, dtype),), 1)
        return arrays[0], tensors[0]

    def take_all(self, keys: tuple[tuple[tuple[int, ...], np.dtype], ...], count: int) -> tuple[list[np.ndarray], list[Any]]:
        """:meth:`take` for ``count`` blocks at once, one per ``(shape, dtype)`` key: ``(arrays, tensors)``.

        The Loader's per-batch call (a batch's fixed-size columns): two C calls per block.
        """
        arrays: list[Any] = [None] * count
        tensors: list[Any] = [None] * count
        free_lists = self._free
        leases = self._leases
        j = 0
        for key in keys:
            try:
                free = free_lists[key]
            except KeyError:
                free = free_lists[key] = []
            if free:
                old = free.pop()
                block = old.block
                del leases[old]
            else:
                block = self._allocate(*key)
            view = block[...]
            lease = Lease(view, free.append)
            lease.block = block
            leases[lease] = None
            arrays[j] = view
            tensors[j] = torch.from_numpy(view)
            j += 1
        return arrays, tensors

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        self.allocated += 1
        if self.pin:
            return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True).numpy()
        return np.empty(shape, dtype)

    def trim(self, keep: int) -> None:
        """Forget all but ``keep`` free blocks of each shape (after a burst of batches the user held)."""
        for free in self._free.values():
            while len(free) > keep:
                del self._leases[free.pop(0)]

    @property
    def free(self) -> int:
        """Blocks waiting to be reused."""
        return sum(len(free) for free in self._free.values())

    @property
    def out(self) -> int:
        """Blocks handed out and still held somewhere."""
        return len(self._leases) - self.free
