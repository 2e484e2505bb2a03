"""The arena's bounds and reuse rules, on CPU: unpinned blocks and fake events stand in for CUDA's."""

from __future__ import annotations

import gc

import numpy as np
import torch

from chute._arena import Arena


class FakeEvent:
    """An event that completes only when waited on (as a copy still queued on the GPU would)."""

    def __init__(self) -> None:
        self.done = False

    def synchronize(self) -> None:
        self.done = True


def test_guarded_blocks_stay_within_slots_per_key_and_the_least_recently_used_keys_go():
    arena = Arena(slots=2, max_keys=2)
    a, b, c = ((4,), torch.float32), ((3,), torch.int64), ((5,), torch.uint8)
    previous = FakeEvent()

    def batch(*keys: tuple) -> None:
        nonlocal previous
        for key in keys:
            arena.borrow(*key)
        assert not previous.done  # borrowing for batch n + 1 never waits for the copy of batch n
        previous = FakeEvent()
        arena.release(previous)

    for _ in range(10):
        batch(a, a, b)
    assert arena.allocated == 2 * 2 + 2 * 1  # slots x blocks per batch, per key, then only reuse
    assert arena.nbytes == 4 * 4 * 4 + 2 * 3 * 8
    for _ in range(10):  # a batch needs three blocks of a now: its cap grows to two such batches
        batch(a, a, a)
    assert arena.allocated == 6 + 2
    assert arena.nbytes == 6 * 4 * 4 + 2 * 3 * 8
    batch(c)  # a third key: b, the least recently used, is dropped at the release
    assert arena.nbytes == 6 * 4 * 4 + 5
    batch(b)  # b again: allocated anew; a goes
    assert arena.allocated == 8 + 2
    assert arena.nbytes == 3 * 8 + 5
    arena.clear()
    assert arena.nbytes == 0


def test_a_guarded_block_is_handed_out_again_only_after_its_event_completed():
    arena = Arena(slots=2)
    released_with: dict[int, FakeEvent] = {}  # block address -> the event of the batch that last used it
    shapes = [(8,), (8,), (2, 2), (8,)]
    for n in range(40):
        batch = [arena.borrow(shapes[(n + j) % 4], torch.float32) for j in range(1 + n % 3)]
        for block in batch:
            event = released_with.get(block.data_ptr())
            assert event is None or event.done  # a reused block: its last copy was waited for
        event = FakeEvent()
        arena.release(event)
        released_with.update((block.data_ptr(), event) for block in batch)
    assert arena.allocated < 40  # blocks were reused
    # The batch after a release gets other blocks and does not wait: slots=2 keeps one batch in flight.
    first = [arena.borrow((16,), torch.float32)]
    pending = FakeEvent()
    arena.release(pending)
    second = arena.borrow((16,), torch.float32)
    assert not pending.done and second.data_ptr() != first[0].data_ptr()


def test_a_lent_block_is_reused_only_once_no_tensor_uses_its_memory():
    arena = Arena()
    key = ((4, 3), np.dtype(np.float32))
    array, tensor = arena.take(*key)
    first = tensor.data_ptr()
    array[...] = 7
    row = tensor[1]  # a slice kept (for logging, say): the block is still in use
    del array, tensor
    gc.collect()
    other = arena.take(*key)[1]
    second = other.data_ptr()
    assert second != first and row.tolist() == [7, 7, 7]
    assert arena.out == 2 and arena.free == 0
    del row, other
    gc.collect()
    assert arena.out == 0 and arena.free == 2
    again = arena.take(*key)[1]
    assert again.data_ptr() in (first, second) and arena.allocated == 2
    arena.trim(keep=0)
    assert arena.free == 0 and arena.out == 1


def _mapping(array: np.ndarray) -> object:
    """The object that owns ``array``'s memory (down its chain of bases)."""
    owner: object = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner.obj if isinstance(owner, memoryview) else owner


def test_large_lent_blocks_are_mappings_of_their_own_reused_and_freed_when_forgotten():
    """A block of OWN_MAPPING bytes or more is an anonymous mapping of its own (small pages, not numpy's huge
    pages), one memory with its tensor, reused once dropped, and unmapped once the arena forgets it."""
    import mmap
    import os
    import weakref

    from chute._arena import OWN_MAPPING

    arena = Arena()
    big_key, small_key = ((4, OWN_MAPPING // 4), np.dtype(np.uint8)), ((4,), np.dtype(np.float32))
    (big, small), (big_t, small_t) = arena.take_all((big_key, small_key), 2)
    mapping = _mapping(big)
    assert isinstance(mapping, mmap.mmap) and len(mapping) == OWN_MAPPING
    assert not isinstance(_mapping(small), mmap.mmap)
    assert big.shape == big_key[0] and big.dtype == np.uint8 and big.flags.writeable
    big_t.fill_(7)
    assert int(big[3, -1]) == 7 and int(big.sum()) == 7 * OWN_MAPPING
    address = big.ctypes.data
    child = os.fork()  # a forked child (a worker process) writes its own copy, never the parent's block
    if child == 0:
        big.fill(9)
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0
    assert int(big.max()) == 7
    gone = weakref.ref(mapping)
    del big, small, big_t, small_t, mapping
    gc.collect()
    (again,), _ = arena.take_all((big_key,), 1)
    assert again.ctypes.data == address and arena.allocated == 2
    del again, _
    gc.collect()
    arena.trim(0)
    gc.collect()
    assert gone() is None
