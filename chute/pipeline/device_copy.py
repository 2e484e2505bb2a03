"""The device copy as a stage of a Loader's pass: ``device=`` (``device`` in the report).

It runs on a thread of its own (``chute-device:<device>``), after every other
thread stage: each batch's copy to the device starts on a side CUDA stream
(:class:`chute.device.DeviceCopier`), and the batch is handed over to the
training loop's current stream when the loop takes it (:meth:`DeviceCopy.receive`,
in the loop's thread). The Loader builds its batches in pinned blocks, so the
copy reads them directly; this stage keeps each host batch until its copy's
event has completed, so the block is not reused while the copy may read it
(``chute/_arena.py``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from chute.pipeline.stage import BatchStage

#: Copies whose host batch may be in flight at once before the thread waits for the oldest.
HELD = 4


class DeviceCopy(BatchStage):
    """Copies each batch to ``copier``'s device; the loop's thread hands it over (:meth:`receive`)."""

    _builtin = True

    def __init__(self, copier: Any) -> None:
        super().__init__(name="device", where="thread", gil=False)
        self.copier = copier
        self._held: deque[tuple[Any, Any]] = deque()  # (event, host batch): copies that may still read the host batch

    def map(self, batch: Any, ctx: Any) -> tuple[Any, Any]:
        """``(device batch, event)``: the copy is queued on the side stream; the event completes when it is done."""
        held = self._held
        while held and held[0][0].query():
            held.popleft()
        out, event = self.copier.copy(batch)
        if event is not None:
            held.append((event, batch))
            if len(held) > HELD:
                held.popleft()[0].synchronize()
        return out, event

    def receive(self, item: tuple[Any, Any]) -> Any:
        """In the loop's thread: make the batch safe to use on the loop's current stream."""
        batch, event = item
        return self.copier.hand_over(batch, event)

    def close(self) -> None:
        """The pass ends: the host batches go only once nothing reads them."""
        held, self._held = self._held, deque()
        for event, _ in held:
            event.synchronize()

    @property
    def thread_name(self) -> str:
        device = self.copier.device
        return "chute-device" if device is None else f"chute-device:{device}"
