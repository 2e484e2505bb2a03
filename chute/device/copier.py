"""One batch to the device: copies on a side CUDA stream, an event per batch, hand-over to the consumer's stream."""

from __future__ import annotations

from typing import Any

import torch

from chute.device.nested import map_tensors
from chute.device.staging import StagingRing
from chute.errors import ChuteError

DeviceLike = torch.device | str | int | None


def resolve_device(device: DeviceLike) -> torch.device | None:
    """Normalise ``device`` to ``None``, ``cpu`` or ``cuda:N`` (an explicit index)."""
    if device is None:
        return None
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', not {device!r}")
    if not torch.cuda.is_available():
        raise ChuteError(
            f"device={device!r} was requested but torch.cuda.is_available() is False; "
            "pass device='cpu' (or None) on a machine without a CUDA GPU"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ChuteError(
            f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return torch.device("cuda", index)


class DeviceCopier:
    """Copies batches to one device on a side stream.

    ``copy`` runs in the copying thread, ``hand_over`` in the consumer thread.
    For ``device=None`` batches pass through untouched; for ``cpu`` tensors
    already on the CPU pass through (others are moved synchronously); in both
    cases there is no event. For ``cuda:N`` see the module docstring.
    """

    def __init__(
        self, device: DeviceLike, *, staging_slots: int = 2, max_shapes: int = 16
    ) -> None:
        self.device = resolve_device(device)
        self.is_cuda = self.device is not None and self.device.type == "cuda"
        self.staging = StagingRing(slots=staging_slots, max_shapes=max_shapes, pin_memory=True)
        self._stream: torch.cuda.Stream | None = None

    @property
    def pinned_allocations(self) -> int:
        """Pinned staging buffers allocated so far (stays at the ring size)."""
        return self.staging.allocations

    def copy(self, batch: Any) -> tuple[Any, torch.cuda.Event | None]:
        """Start copying ``batch`` to the device; return ``(device_batch, event)``.

        ``event`` (``None`` without CUDA) completes when the copies are done:
        the consumer's stream must wait on it before reading ``device_batch``
        (``hand_over`` does that), and pinned tensors of ``batch`` that were
        copied directly must not be rewritten before it. Unpinned tensors were
        staged synchronously and may be rewritten as soon as ``copy`` returns.
        """
        if self.device is None:
            return batch, None
        if not self.is_cuda:
            return map_tensors(lambda t: t if t.is_cpu else t.to(self.device), batch), None
        # The current device is per thread: make it ours in the copying thread,
        # so the stream, events and allocations land on the right GPU.
        if torch.cuda.current_device() != self.device.index:
            torch.cuda.set_device(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.no_grad(), torch.cuda.stream(self._stream):
            try:
                out = map_tensors(self._copy_tensor, batch)
            finally:
                # Recorded even if a copy failed, so the buffers staged so far
                # are only rewritten after the copies already queued.
                event = torch.cuda.Event()
                event.record(self._stream)
                self.staging.release(event)
        return out, event

    def _copy_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        if t.device.type == "cpu" and t.layout == torch.strided and not t.is_pinned():
            t = self.staging.stage(t)
        # Allocated on the side stream (the current one here); hand_over ties it
        # to the consumer's stream.
        return t.to(self.device, non_blocking=True)

    def hand_over(self, batch: Any, event: torch.cuda.Event | None) -> Any:
        """Make ``batch`` safe to use on the calling thread's current stream.

        The current stream waits (on the GPU, the host does not block) for the
        copies, and every device tensor of the batch is recorded on that stream
        so its memory is not reused while work queued there may still read it.
        A batch used on another stream later needs the user's own sync.
        """
        if event is None:
            return batch
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(event)

        def record(t: torch.Tensor) -> torch.Tensor:
            if t.device == self.device:
                t.record_stream(stream)
            return t

        map_tensors(record, batch)  # record() returns t: this only walks the batch
        return batch
