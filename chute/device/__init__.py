"""The device stage: move batches to the training device while the model computes.

``to_device(iterable, device)`` wraps any iterable of batches (a torch
``DataLoader`` included) and yields the same batches with every tensor on
``device``. A background thread pulls batches ahead of the training loop, copies
them on a side CUDA stream and hands them over through a bounded channel, so the
host-to-device transfer of batch ``n + 1`` overlaps the compute of batch ``n``.

The pieces, from the bottom up (each usable on its own):

``map_tensors``
    Apply a function to every tensor of a nested batch (dicts and other
    mappings, lists, tuples, namedtuples, dataclasses); everything else passes
    through. Containers are rebuilt with their own type, and only when a tensor
    inside them changed.
``StagingRing``
    Reused pinned host buffers keyed by ``(shape, dtype)``. An unpinned host
    tensor is copied into one of them, because only a copy *from pinned
    memory* is asynchronous. A buffer is rewritten only after the device copy
    that last read it is done (it waits on that copy's event). The buffers
    are guarded blocks of an arena (``chute._arena``), the memory manager the
    Loader's own blocks come from too.
``DeviceCopier``
    Copies one batch to the device on its side stream and returns
    ``(device_batch, event)``; the event completes when the batch is on the
    device and the host memory it was read from may be rewritten.
    ``hand_over`` makes the consumer's current stream wait on the event and
    ties the device memory to that stream (``record_stream``).
``DevicePrefetcher``
    One pass over an iterable: a named daemon thread (``chute-device:<dev>``)
    that copies up to ``depth`` batches ahead, re-raises the thread's errors in
    the consumer and stops cleanly on ``close``, garbage collection or
    interpreter exit.
``DeviceLoader`` (returned by ``to_device``)
    A re-iterable wrapper: each ``iter()`` starts one ``DevicePrefetcher`` over
    a fresh pass of the wrapped iterable, after stopping the previous one.
    ``len()``, ``set_epoch`` and attributes such as ``.sampler`` and
    ``.dataset`` are forwarded to the wrapped iterable.

Buffer reuse (why no memory is rewritten or freed while a kernel reads it):

* Host staging buffers: a ring guarded by events. Before a staging buffer is
  rewritten, the copying thread waits on the event of the batch whose copy last
  read it. With two batches' worth of buffers per key (the default) that
  copy has normally finished long before, so the wait costs nothing.
* Device tensors: fresh allocations from PyTorch's caching allocator on the side
  stream, plus ``Tensor.record_stream(consumer_stream)`` at hand-over. The batch
  belongs to the user from then on (they may keep it, e.g. for logging), so a
  ring of device buffers that chute rewrites would corrupt tensors the user
  still holds. ``record_stream`` makes the allocator wait for the consumer
  stream's pending work before it reuses the memory for a later batch, and
  costs nothing when the user drops the batch at the end of the step. The
  number of batches on the device that the consumer has not taken yet is at
  most ``depth``.

How chute's Loader plugs in: with a CUDA device, the Loader builds every
batch in *pinned* blocks of its own arena (``chute._arena``), so the
gather writes once and the copy to the device reads that memory directly, with
no staging copy. The device stage's thread keeps each host batch alive until
its copy's event has completed, and only then can the block go back to the
arena. With ``device="cpu"`` the batches pass through the same thread and queue
without a copy, and the blocks return to the arena when the training loop drops
the batch.

**What has run where.** The CUDA paths (side stream, events,
``record_stream``, pinned blocks, the overlap of copy and compute) are written
for real GPUs and their tests exist (``tests/test_device.py``, marked
``cuda``), but no GPU has run them yet: on this project's machines they are
skipped. Everything else runs in CI on the CPU.

Modules: ``nested`` (``map_tensors``), ``staging`` (``StagingRing``),
``copier`` (``DeviceCopier``, ``resolve_device``), ``prefetch``
(``DevicePrefetcher``, ``DeviceLoader``, ``to_device``).
"""

from chute.device.copier import DeviceCopier, resolve_device
from chute.device.nested import map_tensors
from chute.device.prefetch import DeviceLoader, DevicePrefetcher, to_device
from chute.device.staging import StagingRing

__all__ = ["DeviceCopier", "DeviceLoader", "DevicePrefetcher", "StagingRing", "map_tensors", "resolve_device", "to_device"]
