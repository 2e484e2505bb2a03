"""The arena: blocks of host memory by ``(shape, dtype)``, reused once nothing can still read them.

Both stages that keep host memory for reuse draw it from an :class:`Arena`:

* The Loader builds every fixed-size column of a batch in a block (the gather,
  the collate of a transform's output, the copy out of the worker processes'
  ring). A fresh multi-megabyte tensor per batch costs a page fault for every
  4 KiB the first time it is written (the allocator gives large blocks back to
  the kernel), which slows the gather of large rows (docs/benchmarks.md,
  design figures). With a CUDA
  device these blocks are pinned.
* The device stage copies a tensor that is not pinned into a pinned staging
  block first, because only a copy *from pinned memory* is asynchronous
  (``chute.device.staging``).

A block goes out in one of two ways, and may be handed out again only once
nothing can read it:

Lent (:meth:`Arena.take_all`, :meth:`Arena.take`; numpy dtypes)
    A block is a numpy array owned by the arena. Lending it makes a fresh numpy
    view of it and a tensor with ``torch.from_numpy(view)``: the tensor's
    storage keeps ``view`` alive for as long as the tensor, or any view or
    slice of it (``batch["x"][0]`` kept for logging), exists. A weak reference
    to ``view`` (a :class:`Lease`) has the key's free list as its callback, so
    when the last tensor using the storage is freed, the lease lands in the
    free list, by the garbage collector's own bookkeeping, on whatever thread
    dropped the batch. A batch the user keeps is never rewritten; the arena
    allocates another block meanwhile. Pinned blocks are read by a device copy
    after the host batch is dropped; the device stage keeps the host batch
    alive until the copy's event has completed (``chute.device``), so the same
    rule covers them. Taking a block costs two C calls and no Python-level
    call; returning one costs nothing on the consumer's side.
Guarded (:meth:`Arena.borrow`, :meth:`Arena.release`; torch dtypes)
    The block is read by an asynchronous device copy after its borrower is
    done with it. ``release(guard)`` ends a batch: the arena keeps every block
    borrowed since the previous release together with ``guard`` (the copy's
    event) and waits on that event before it hands the block out again.

Bounds. Lent blocks have no cap (a batch the user keeps needs blocks of its
own); :meth:`Arena.trim` forgets free ones beyond ``keep`` per key. Guarded
blocks of a key stop at ``slots`` batches' worth, ``slots * peak`` (``peak``:
the most blocks of that key one batch has borrowed), so borrowing for batch
``n + 1`` never waits for the copy of batch ``n``; beyond that the oldest block
is reused, after its event. With ``max_keys``, each release drops the least
recently used keys beyond that many, so batches of ever-changing shapes do not
hold memory without bound.

The shared-memory ring of the worker processes (``chute.pipeline.shm``) is not
an arena, because none of this applies to it: its blocks are named segments
that other processes map, one per slot whatever the batch holds (its tensors
are packed at offsets, not keyed by shape), sized and re-created when a batch
did not fit, and unlinked by the main process. A slot is free again when the
wire protocol says so (the main process has copied the batch out), not when a
reference count drops or an event completes: a weak reference cannot see a
view in another process, and there is no device copy to wait for.
"""

from __future__ import annotations

import math
import mmap
import weakref
from collections import OrderedDict, deque
from typing import Any, Protocol

import numpy as np
import torch

#: Blocks of at least this many bytes are mapped on their own, in small pages (numpy asks for transparent huge
#: pages at 4 MiB and more).
OWN_MAPPING = 4 << 20

Key = tuple[tuple[int, ...], Any]  # (shape, dtype): a numpy dtype for lent blocks, a torch dtype for guarded ones


class Guard(Protocol):
    """What the arena needs from an event: block until the work it marks is done."""

    def synchronize(self) -> None: ...


class Lease(weakref.ref):
    """A weak reference to the view a tensor was made from; ``block`` goes back to the free list when it dies.

    Hashed by identity (the view it refers to is not hashable), so the arena can
    keep its leases in a dict without a Python call per batch.
    """

    __slots__ = ("block",)
    block: Any
    __hash__ = object.__hash__
    __eq__ = object.__eq__


class Shelf:
    """The blocks of one key."""

    __slots__ = ("free", "held", "out", "size", "peak")

    def __init__(self) -> None:
        self.free: list[Lease] = []  # lent blocks nothing refers to, the latest last
        self.held: deque[tuple[torch.Tensor, Guard | None]] = deque()  # released guarded blocks, the oldest first
        self.out: list[torch.Tensor] = []  # guarded blocks borrowed since the last release
        self.size = 0  # guarded blocks owned: held and out
        self.peak = 0  # most guarded blocks one batch has borrowed


class Arena:
    """Host memory blocks keyed by ``(shape, dtype)``, pinned if ``pin``; see the module docstring.

    Lending is safe from several threads (list appends and pops are atomic,
    and each free list is only ever popped by :meth:`take_all`). Borrowing is
    not: one copying thread owns a guarded arena.
    """

    def __init__(self, *, pin: bool = False, slots: int = 2, max_keys: int | None = None) -> None:
        if slots < 1 or (max_keys is not None and max_keys < 1):
            raise ValueError(f"slots and max_keys must be >= 1, got {slots}, {max_keys}")
        self.pin, self.slots, self.max_keys = pin, slots, max_keys
        self.allocated = 0  # blocks ever allocated (stays flat once the arena is warm)
        self._shelves: OrderedDict[Key, Shelf] = OrderedDict()  # the least recently borrowed key first
        self._leases: dict[Lease, None] = {}  # leases out: a weakref's callback fires only while the weakref lives
        self._touched: list[Shelf] = []  # shelves with blocks borrowed since the last release

    # ------------------------------------------------------------------ lent

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Any]:
        """``(array, tensor)``: a writable block of ``shape`` and ``dtype``, as numpy and as torch (one memory)."""
        arrays, tensors = self.take_all(((shape, dtype),), 1)
        return arrays[0], tensors[0]

    def take_all(self, keys: tuple[Key, ...], count: int) -> tuple[list[np.ndarray], list[Any]]:
        """:meth:`take` for ``count`` blocks at once, one per ``(shape, dtype)`` key: ``(arrays, tensors)``.

        The Loader's per-batch call (a batch's fixed-size columns): two C calls per block.
        """
        arrays: list[Any] = [None] * count
        tensors: list[Any] = [None] * count
        shelves = self._shelves
        leases = self._leases
        j = 0
        for key in keys:
            try:
                free = shelves[key].free
            except KeyError:
                free = self._shelf(key).free
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

    def trim(self, keep: int) -> None:
        """Forget all but ``keep`` free lent blocks of each key (after a burst of batches the user held)."""
        for shelf in self._shelves.values():
            while len(shelf.free) > keep:
                del self._leases[shelf.free.pop(0)]

    @property
    def free(self) -> int:
        """Lent blocks waiting to be reused."""
        return sum(len(shelf.free) for shelf in self._shelves.values())

    @property
    def out(self) -> int:
        """Lent blocks handed out and still held somewhere."""
        return len(self._leases) - self.free

    # ------------------------------------------------------------------ guarded

    def borrow(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` to fill, reused after the event of the copy that last read it."""
        shelf = self._shelf((shape, dtype))
        if shelf.held and shelf.size >= self.slots * max(shelf.peak, len(shelf.out) + 1):
            block, guard = shelf.held.popleft()
            if guard is not None:
                guard.synchronize()  # the copy that last read the block is done
        else:
            block = torch.empty(shape, dtype=dtype, pin_memory=self.pin)
            self.allocated += 1
            shelf.size += 1
        if not shelf.out:
            self._touched.append(shelf)
        shelf.out.append(block)
        return block

    def release(self, guard: Guard | None) -> None:
        """End the batch: the blocks borrowed since the last release may be reused once ``guard`` completes."""
        for shelf in self._touched:
            shelf.peak = max(shelf.peak, len(shelf.out))
            shelf.held.extend((block, guard) for block in shelf.out)
            shelf.out.clear()
        self._touched.clear()
        while self.max_keys is not None and len(self._shelves) > self.max_keys:
            self._shelves.popitem(last=False)

    # ------------------------------------------------------------------ both

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks in the arena's hands: free, held, or borrowed (lent blocks out are their user's)."""
        total = 0
        for shelf in self._shelves.values():
            total += sum(lease.block.nbytes for lease in shelf.free)
            total += sum(block.nbytes for block, _ in shelf.held) + sum(block.nbytes for block in shelf.out)
        return total

    def clear(self) -> None:
        """Drop every block (pinned memory goes back to PyTorch's allocator)."""
        self._shelves.clear()
        self._leases.clear()
        self._touched.clear()

    def _shelf(self, key: Key) -> Shelf:
        shelf = self._shelves.get(key)
        if shelf is None:
            shelf = self._shelves[key] = Shelf()
        self._shelves.move_to_end(key)
        return shelf

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        self.allocated += 1
        if self.pin:
            return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True).numpy()
        return small_pages(shape, dtype)


def small_pages(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype``; from :data:`OWN_MAPPING` bytes up, an anonymous
    mapping of its own in small pages, freed with the array.

    numpy asks the kernel for transparent huge pages for arrays of 4 MiB and more. A huge page takes a
    whole 2 MiB free block, and on a VM whose host takes back the free blocks the guest reports (free page
    reporting), every page of it faults on the host the first time it is written: a new Loader's first
    pass paid several times the CPU per byte of its later passes for its batch blocks (docs/remote.md,
    "Performance"). Small pages come from the small free blocks first. What huge pages save where free
    memory stays with the machine (a fault per 4 KiB instead of one per 2 MiB) is paid once per block:
    the arena reuses its blocks.
    """
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize * math.prod(map(int, shape))
    if nbytes < OWN_MAPPING or dtype.hasobject:
        return np.empty(shape, dtype)
    # private (as malloc's): a forked child writes its own copy, never the parent's block
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), dtype).reshape(shape)
