"""The host staging ring: reused pinned buffers for batches that arrive in pageable memory.

Only a copy *from pinned memory* is asynchronous. A tensor that is not pinned
is copied into one of these buffers first; a buffer is rewritten only after the
device copy that last read it is done (it waits on that copy's event).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from typing import Protocol

import torch

class _Guard(Protocol):
    """What the ring needs from an event: block until the work it marks is done."""

    def synchronize(self) -> None: ...


@dataclasses.dataclass
class _Pool:
    """The staging buffers of one ``(shape, dtype)``."""

    free: deque[tuple[torch.Tensor, _Guard | None]] = dataclasses.field(default_factory=deque)
    in_batch: list[torch.Tensor] = dataclasses.field(default_factory=list)
    size: int = 0  # buffers owned, free or in the current batch
    peak: int = 0  # most buffers one batch has needed


class StagingRing:
    """Reused host staging buffers, keyed by ``(shape, dtype)``, pinned by default.

    ``stage(t)`` copies ``t`` into a buffer of its shape and dtype and returns
    the buffer; ``release(event)`` ends a batch: every buffer staged since the
    previous ``release`` may be rewritten once ``event`` has completed. Each key
    keeps ``slots`` batches' worth of buffers (``slots * peak``, where ``peak``
    is the most tensors of that key one batch has held), so staging batch
    ``n + 1`` never waits for the copy of batch ``n``. At most ``max_shapes``
    keys are kept; the least recently used one is dropped beyond that, so
    batches of ever-changing shapes do not pin memory without bound.

    ``allocations`` counts buffers ever allocated: with fixed shapes it stops
    at ``slots`` times the number of tensors per batch.

    Dropping a buffer (``clear``, eviction) while a copy may still read it is
    safe: PyTorch's pinned-memory allocator records an event for every
    asynchronous copy and does not hand the memory out again before it is done.
    Rewriting is what needs the ring's own events. Not thread-safe: one
    copying thread owns it.
    """

    def __init__(self, *, slots: int = 2, max_shapes: int = 16, pin_memory: bool = True) -> None:
        if slots < 1 or max_shapes < 1:
            raise ValueError(f"slots and max_shapes must be >= 1, got {slots}, {max_shapes}")
        self.slots = slots
        self.max_shapes = max_shapes
        self.pin_memory = pin_memory
        self.allocations = 0
        self._pools: OrderedDict[tuple[tuple[int, ...], torch.dtype], _Pool] = OrderedDict()
        self._touched: list[_Pool] = []

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        """Copy ``src`` (a CPU tensor) into a staging buffer and return the buffer."""
        key = (tuple(src.shape), src.dtype)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        self._pools.move_to_end(key)
        wanted = self.slots * max(pool.peak, len(pool.in_batch) + 1)
        if pool.free and pool.size >= wanted:
            buf, guard = pool.free.popleft()
            if guard is not None:
                guard.synchronize()  # the device copy that last read buf is done
        else:
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.pin_memory)
            pool.size += 1
            self.allocations += 1
        if not pool.in_batch:
            self._touched.append(pool)
        pool.in_batch.append(buf)
        buf.copy_(src)
        return buf

    def release(self, guard: _Guard | None) -> None:
        """End the batch: its buffers may be rewritten once ``guard`` completes."""
        for pool in self._touched:
            pool.peak = max(pool.peak, len(pool.in_batch))
            pool.free.extend((buf, guard) for buf in pool.in_batch)
            pool.in_batch.clear()
        self._touched.clear()
        while len(self._pools) > self.max_shapes:
            self._pools.popitem(last=False)

    @property
    def nbytes(self) -> int:
        """Bytes of host memory the ring holds."""
        total = 0
        for pool in self._pools.values():
            buffers = [buf for buf, _ in pool.free] + pool.in_batch
            total += sum(buf.numel() * buf.element_size() for buf in buffers)
        return total

    def clear(self) -> None:
        """Drop every buffer (returns the pinned memory to PyTorch's allocator)."""
        self._pools.clear()
        self._touched.clear()
