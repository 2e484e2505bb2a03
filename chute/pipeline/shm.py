"""The shared-memory ring the worker processes return batches through.

``depth`` slots; each is one shared-memory segment that the main process
creates on the slot's first use, reuses for every later batch, and re-creates
only when a batch did not fit (the first size comes from the dataset's
fixed-size columns times the batch size; a new size has 25% headroom, and
every slot grows to it on its next use, so this happens a few times per run,
never per batch). The main process owns every segment: it creates, sizes and
unlinks them; workers only attach. A slot is handed to one task at a time and
is free again once the main process has copied the batch out. (Why this ring
is not part of the arena the other host memory comes from: ``chute._arena``.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
from multiprocessing import shared_memory

import torch

from chute.errors import ChuteError

ALIGN = 64  # every tensor starts on a 64-byte boundary of its slot
_GRAIN = 1 << 16  # slot sizes are multiples of this
_MIN_SLOT = 1 << 18


class Segment:
    """One shared-memory segment, created and unlinked by the main process, attached by workers."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        self.name, self.size = name, size

    def view(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel(shape) * dtype.itemsize
        return torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)

    def close(self, unlink: bool) -> None:
        with contextlib.suppress(BufferError):  # a view still alive keeps the mapping until it goes
            self.shm.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


class Ring:
    """``slots`` reusable segments (main process side): take a free slot, give it back when copied out."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self._prefix = f"chute_{os.getpid()}_{secrets.token_hex(4)}"
        self._made = 0
        self.segments: list[Segment | None] = [None] * slots
        self._free = list(reversed(range(slots)))  # a stack: the most recently used slot first
        self.target = slot_bytes

    def take(self) -> int | None:
        """A free slot whose segment holds ``target`` bytes (created now if needed), or None."""
        if not self._free:
            return None
        slot = self._free.pop()
        segment = self.segments[slot]
        if segment is None or segment.size < self.target:
            self.segments[slot] = None
            if segment is not None:
                segment.close(unlink=True)
            name = f"{self._prefix}_{self._made}"
            self._made += 1
            try:
                self.segments[slot] = Segment(name, self.target, create=True)
            except OSError as exc:
                self._free.append(slot)
                raise ChuteError(
                    f"cannot create a {self.target}-byte shared memory segment {name} for the worker processes "
                    f"({exc}); /dev/shm is full or too small (in docker: --shm-size): use workers='threads', "
                    "a smaller batch_size or a smaller prefetch"
                ) from exc
        return slot

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def fit(self, need: int) -> None:
        """A batch needed ``need`` bytes: slots smaller than that are re-created on their next use."""
        if need > self.target:
            self.target = slot_bytes(need)

    def release(self) -> None:
        segments, self.segments = self.segments, [None] * len(self.segments)
        for segment in segments:
            if segment is not None:
                segment.close(unlink=True)


def slot_bytes(need: int) -> int:
    want = need + need // 4
    return max(_MIN_SLOT, -(-want // _GRAIN) * _GRAIN)


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
