"""What crosses between the main process and its worker processes: batches and exceptions.

A batch is pickled with its tensors replaced by references (``persistent_id``),
so tensors anywhere in a nested batch (dicts, lists, tuples, dataclasses...)
cross through a shared-memory slot and everything else (str, bytes, dicts,
numbers) through the pipe. A batch whose tensors do not fit its slot travels
pickled through the pipe once, and its size is what the ring grows to. An
exception comes back pickled with its chain, and the worker's formatted
traceback chained as :class:`RemoteTraceback`.
"""

from __future__ import annotations

import io
import pickle
import traceback
from typing import Any

import numpy as np
import torch

from chute._arena import Arena
from chute.errors import ChuteError
from chute.pipeline.shm import Segment, align

PROTOCOL = pickle.HIGHEST_PROTOCOL
_PROTOCOL = PROTOCOL


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process.

    Set as the ``__cause__`` of the innermost re-raised exception, so the
    worker's frames are printed above the consumer's.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text}"""'


class TensorPickler(pickle.Pickler):
    """Pickles a batch with its tensors left out: each becomes an index into ``tensors``."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, _PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is not torch.Tensor or not ringable(obj):
            return None
        index = self._index.get(id(obj))
        if index is None:  # the same tensor twice arrives as one tensor
            index = self._index[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return index


class TensorUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self._tensors = tensors

    def persistent_load(self, pid: int) -> torch.Tensor:
        return self._tensors[pid]


def ringable(t: torch.Tensor) -> bool:
    """Plain dense CPU tensors go through the ring; anything else (sparse, grad, empty) is pickled."""
    return (
        t.layout == torch.strided
        and t.device.type == "cpu"
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_nested
        and t.numel() > 0
    )


def encode(value: Any, segment: Segment | None) -> tuple[bytes, list | None, bytes | None, int]:
    """``(pickled value without tensor data, ring layout, or the tensors pickled if they do not fit, bytes needed)``."""
    buffer = io.BytesIO()
    pickler = TensorPickler(buffer)
    pickler.dump(value)
    layout, end = [], 0
    for t in pickler.tensors:
        layout.append((end, tuple(t.shape), t.dtype))
        end = align(end + t.numel() * t.element_size())
    if pickler.tensors and (segment is None or end > segment.size):
        return buffer.getvalue(), None, pickle.dumps(pickler.tensors, _PROTOCOL), end
    into: Any = segment  # not None when there are tensors (returned above otherwise)
    for (offset, shape, dtype), t in zip(layout, pickler.tensors):
        into.view(offset, shape, dtype).copy_(t)
    return buffer.getvalue(), layout, None, end


def decode(
    payload: bytes, layout: list | None, inline: bytes | None, segment: Segment | None, buffers: Arena | None = None
) -> Any:
    """The value :func:`encode` encoded, its tensors copied out of the segment.

    Into reused ``buffers`` if given: a fresh tensor per batch would fault on
    every page it is copied into (tens of MB per batch of images).
    """
    if inline is not None:
        tensors = pickle.loads(inline)
    else:
        source: Any = segment  # not None when the layout names tensors in it
        tensors = [copy_out(source.view(offset, shape, dtype), buffers) for offset, shape, dtype in layout or ()]
    return TensorUnpickler(io.BytesIO(payload), tensors).load()


def copy_out(view: torch.Tensor, pool: Arena | None) -> torch.Tensor:
    if pool is None or view.dtype == torch.bfloat16:
        return view.clone()
    array, out = pool.take(tuple(view.shape), view.numpy().dtype)
    np.copyto(array, view.numpy(), casting="no")  # on this thread, without the GIL (not torch's intra-op threads)
    return out


def encode_exception(exc: BaseException) -> tuple[list[bytes], str]:
    """The exception and its chain (each pickled on its own) and the formatted traceback."""
    text = "".join(traceback.format_exception(exc))
    chain: list[bytes] = []
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(chain) < 16:
        seen.add(id(link))
        try:
            data = pickle.dumps(link, _PROTOCOL)
            pickle.loads(data)  # some exception classes pickle but cannot be rebuilt
        except Exception:
            data = pickle.dumps(ChuteError(f"{type(link).__module__}.{type(link).__qualname__}: {safe_str(link)}"), _PROTOCOL)
        chain.append(data)
        link = link.__cause__ if link.__cause__ is not None else (None if link.__suppress_context__ else link.__context__)
    return chain, text


def decode_exception(chain: list[bytes], text: str) -> BaseException:
    links: list[BaseException] = []
    for data in chain:
        try:
            links.append(pickle.loads(data))
        except Exception as exc:
            links.append(ChuteError(f"an exception raised in a worker process could not be unpickled: {exc}"))
    for outer, inner in zip(links, links[1:]):
        outer.__cause__ = inner
    links[-1].__cause__ = RemoteTraceback(text)
    return links[0]


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return "<unprintable>"
