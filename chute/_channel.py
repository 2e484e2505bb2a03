"""The one hand-off between stages: a bounded, in-order channel of step results.

Producers (worker threads, the process pool's receiver, the device stage) put
the result of step ``s`` into slot ``s % slots``; the one consumer takes steps
in order. Each slot has a lock used as a binary semaphore: the producer
releases it when the slot is full, the consumer acquires it to wait for the
slot. Waiting and waking are single C calls that release the GIL (no
``Future`` per batch, no ``Condition`` in Python), and a wait can time out,
which is how the consumer notices a stall (``chute.observe.watchdog``).

Flow control: a slot must not be refilled before the consumer took its
previous step. With a thread pool the consumer guarantees it (it submits step
``s + depth`` only after taking step ``s``, and ``depth <= slots``); a single
producer that pulls from a source (the device stage) calls :meth:`reserve`
first, which waits until the consumer has freed the slot.

Errors travel in-band: a producer puts ``Failure(exc)`` at the step where it
happened and the consumer re-raises the original exception object there.
:meth:`close` ends the channel for both sides: a waiting ``reserve`` returns
False and the producer stops; results not taken are dropped.
"""

from __future__ import annotations

import threading
from typing import Any

from chute.errors import ChuteError


class Failure:
    """An exception raised while producing a step, re-raised by the consumer at that step."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Closed(Exception):
    """The channel was closed while the consumer waited."""


class SlotFull(ChuteError):
    """A step was put into a slot that still holds one the consumer has not taken."""


class Channel:
    """``slots`` in-order slots between any number of producers and one consumer.

    ``keep=True``: a result the consumer took stays referenced by the channel
    until the first ``put`` after the consumer has taken two later steps. A
    batch the training loop has dropped (a loop holds the batch it works on,
    and the one before it while in ``next()``) then loses its last reference on a
    producer's thread, not on the loop's: freeing
    a tensor releases the GIL in torch (and a tensor over numpy memory, as the
    Loader's blocks are, takes it back in its deleter), and a worker that
    takes the GIL in that gap keeps the loop waiting, for a whole time slice
    of the CPU when the worker is then preempted on a busy machine
    (docs/loader.md, "Workers"). Nothing is kept beyond that: a batch the
    consumer still holds is only un-referenced, and ``close`` lets go of all.
    """

    def __init__(self, slots: int, *, reserve: bool = False, keep: bool = False) -> None:
        if slots < 1:
            raise ValueError(f"a channel needs at least one slot, got {slots}")
        self.slots = slots
        self._items: list[Any] = [None] * slots
        self._full = [threading.Lock() for _ in range(slots)]
        for lock in self._full:
            lock.acquire()
        # with reserve=True (one producer pulling from a source): a lock per slot, held while the slot is in use
        self._free = [threading.Lock() for _ in range(slots)] if reserve else None
        self.closed = False
        self._front = 0  # the consumer's side: the step where the run of results last seen ended (count_ready)
        # keep=True (see the class): results taken, by step modulo twice the slots (a put lets go of one long
        # before the consumer's take of that place), the last step taken, and the first not let go of yet
        self._kept: list[Any] | None = [None] * (2 * slots) if keep else None
        self._size = 2 * slots
        self._taken = -1
        self._let_go = 0

    # ------------------------------------------------------------------ producers

    def put(self, step: int, item: Any) -> None:
        """Fill the slot of ``step`` (whose previous step the consumer has taken) with ``item`` (never None).

        Raises :class:`SlotFull` when the slot is still full on an open channel
        (a step put twice, or a slot refilled before the consumer took it): a
        batch would otherwise be lost without a word.
        """
        i = step % self.slots
        self._items[i] = item
        try:
            self._full[i].release()
        except RuntimeError:  # the slot's lock was already released: by close(), or by a put not taken yet
            if not self.closed:
                raise SlotFull(f"chute: step {step} was put into slot {i} of {self.slots}, which still holds a step the consumer has not taken (a bug in chute: please report it)") from None
            self._items[i] = None  # closed meanwhile: the item is dropped
        kept = self._kept
        if kept is not None:  # let go of the steps before the last two taken (see the class)
            j, end = self._let_go, self._taken - 1
            if j < end:
                self._let_go = end
                size = self._size
                if j < end - size:
                    j = end - size
                while j < end:  # (after the item is in: the consumer never waits for what is freed here)
                    kept[j % size] = None
                    j += 1

    def reserve(self, step: int) -> bool:
        """Wait until the slot of ``step`` is free (a single producer pulling from a source); False once closed."""
        assert self._free is not None, "reserve() needs a Channel made with reserve=True"
        self._free[step % self.slots].acquire()
        return not self.closed

    # ------------------------------------------------------------------ the consumer

    def take(self, step: int, timeout: float = -1) -> Any:
        """The result of ``step``, waiting up to ``timeout`` seconds (-1: for ever).

        Raises ``TimeoutError`` when the wait timed out (the step is still
        pending: call again to keep waiting) and :class:`Closed` once closed.
        A :class:`Failure` put for the step is re-raised as its exception.
        """
        i = step % self.slots
        if not self._full[i].acquire(True, timeout):
            raise TimeoutError(step)
        if self.closed:
            self._full[i].release()  # let every other waiter through too
            raise Closed(step)
        item = self._items[i]
        self._items[i] = None
        kept = self._kept
        if kept is not None:
            kept[step % self._size] = item  # (what it replaces was let go of by a put, unless none came for long)
            self._taken = step
        if self._free is not None:
            self._free[i].release()
        if item.__class__ is Failure:
            if kept is not None:
                kept[step % self._size] = None  # (its traceback holds frames)
            try:
                raise item.exc
            finally:  # the traceback holds this frame: its locals must not hold the exception (a reference cycle)
                item = None
        return item

    def let_go(self) -> None:
        """The consumer takes nothing from this channel for now (the loop builds the steps itself): let go of
        the results it took, which no put will let go of meanwhile (with ``keep=True``)."""
        if self._kept is not None:
            self._kept = [None] * self._size  # (a put running now writes into the old list: nothing it holds stays)

    def ready(self, step: int) -> bool:
        """Whether the result of ``step`` is there (without taking it)."""
        return self._full[step % self.slots].locked() is False

    def count_ready(self, first: int, limit: int) -> int:
        """How many results are there in a row from step ``first`` (at most ``limit``, and at most ``slots``).

        ``first`` is the consumer's next step. The channel keeps where the run
        of results from there was seen to end (``_front``): a result stays
        until the consumer takes it, in order, so only the steps past that
        point are looked at, each once while it is there, and a call costs no
        call of its own (a slot's item, set before its lock is released and
        cleared after it is taken, says whether it is filled). The workers'
        ``put`` pays nothing for it: a count they updated would need a lock or
        an atomic counter, a call per batch on their side.
        """
        if limit > self.slots:
            limit = self.slots
        if self.closed:
            return limit  # (every slot's lock is released)
        end = first + limit
        j = self._front
        if j < first:
            j = first
        items, slots = self._items, self.slots
        while j < end and items[j % slots] is not None:
            j += 1
        if j > self._front:
            self._front = j
        return (j if j < end else end) - first

    def close(self) -> None:
        """End the channel: waiting producers and the consumer wake up; results not taken are dropped."""
        if self.closed:
            return
        self.closed = True
        self._items = [None] * self.slots
        if self._kept is not None:
            self._kept = [None] * self._size
        for lock in self._full:
            if lock.locked():
                lock.release()
        if self._free is not None:
            for lock in self._free:
                if lock.locked():
                    lock.release()
