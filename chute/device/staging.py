"""The host staging ring: reused pinned buffers for batches that arrive in pageable memory.

Only a copy *from pinned memory* is asynchronous. A tensor that is not pinned
is copied into one of these buffers first; a buffer is rewritten only after the
device copy that last read it is done. The buffers are guarded blocks of an
arena (``chute._arena``), which keeps the bounds and waits on the events.
"""

from __future__ import annotations

import torch

from chute._arena import Arena


class StagingRing(Arena):
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
        super().__init__(pin=pin_memory, slots=slots, max_keys=max_shapes)

    @property
    def allocations(self) -> int:
        """Buffers ever allocated."""
        return self.allocated

    @property
    def max_shapes(self) -> int | None:
        return self.max_keys

    @property
    def pin_memory(self) -> bool:
        return self.pin

    def stage(self, src: torch.Tensor) -> torch.Tensor:
        """Copy ``src`` (a CPU tensor) into a staging buffer and return the buffer."""
        buf = self.borrow(tuple(src.shape), src.dtype)
        buf.copy_(src)
        return buf
