"""The downloader: keeps the shards of the coming batches in the cache, ahead of the loader.

    order.shard_uses ──► [download threads] ──► held in the cache ──► batch tasks read them
                                                  released once the consumer is past their last use

The loader's pass knows, for every shard, the first and last step that reads it.
The fetcher takes these uses in order of first step and holds each shard in the
node cache (downloading it when it is missing), several at once, as far ahead
as the byte budget allows: with a cache limit, this process's lease in the
cache, which it shares with the other processes using it (chute/storage/node/share.py);
without one, ``ahead`` bytes. A batch task waits until its shards are held; once
the consumer has received the last step that uses a shard, the fetcher releases
it and it becomes evictable. The cache evicts by next use, which the fetcher
tells it (and publishes, for the other processes).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import copy
import hashlib
import heapq
import math
import threading
import time
from collections.abc import Iterable

from chute.errors import ChuteError
from chute.observe import inflight
from chute.order import Order
from chute.storage.node.cache import CacheFullError, ShardCache

#: How long close() waits for download threads to finish their current request (a hung
#: request is left to its socket timeout, in a daemon thread).
_JOIN_TIMEOUT = 2.0


def _again(error: BaseException, url: str) -> BaseException:
    """The download error ``error`` to raise in one more batch task.

    Each waiting task raises its own copy, of the same class and message (a
    ShardError stays a ShardError, a RemoteError a RemoteError), chained to the
    original; an error that is not chute's is wrapped in a ChuteError naming ``url``.
    """
    if isinstance(error, ChuteError):
        try:
            again = copy.copy(error)
        except Exception:
            again = None
        if type(again) is type(error) and again.args == error.args:
            again.__cause__ = error
            return again
    wrapped = ChuteError(f"downloading shards of {url} failed: {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


def resident_bytes(uses: list[tuple[int, int, int]], sizes: list[int]) -> int:
    """The most bytes of shards that ``uses`` need held at once (at any one step)."""
    events: list[tuple[int, int]] = []
    for first, last, shard in uses:
        events.append((first, sizes[shard]))
        events.append((last + 1, -sizes[shard]))
    events.sort(key=lambda e: (e[0], e[1]))  # releases before acquisitions at the same step
    peak = level = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def worst_resident_bytes(order: Order, sizes: list[int], world_size: int) -> int:
    """An upper bound of :func:`resident_bytes` over every epoch of ``order``.

    Unshuffled, every epoch reads the same way. Shuffled, one step of
    ``batch_size * world_size`` positions touches at most ``1 + ceil((step - 1) / r)``
    windows, ``r`` being the fewest rows a full window can hold (only the last
    window is smaller, and nothing follows it), plus the first window again when
    the last step pads; so it holds at most that many windows' worth of the
    largest shards.
    """
    if not order.shuffle:
        return resident_bytes(order.shard_uses(0, world_size, 0), sizes)
    rows = sorted(r for r in order.shard_rows if r)
    if not rows:
        return 0
    window = min(order.window, len(rows))
    fewest = sum(rows[:window])
    step = order.batch_size * world_size
    windows = 1 + -(-(step - 1) // fewest) + (1 if world_size > 1 and not order.drop_last else 0)
    largest = sorted((sizes[i] for i, r in enumerate(order.shard_rows) if r), reverse=True)
    return sum(largest[: windows * window])


def check_limit(cache: ShardCache, uses: list[tuple[int, int, int]] | None = None, need: int | None = None) -> int:
    """The bytes the loader must hold at once (``need``, else computed from ``uses``);
    CacheFullError if the cache's limit is smaller."""
    if need is None:
        assert uses is not None, "check_limit takes uses or need"
        need = resident_bytes(uses, [s.bytes for s in cache.manifest.shards])
    if cache.limit is not None and need > cache.limit:
        raise CacheFullError(
            f"cache_limit {cache.limit:,} bytes is smaller than the {need:,} bytes of shards this loader "
            f"must hold at once (the shuffle windows one batch reads, for {cache.remote.url}); raise "
            f"cache_limit to at least {need:,} bytes, or use a smaller window or smaller shards"
        )
    return need


class Fetcher:
    """Holds the shards a pass will read, in order of use, ``threads`` downloads at a time.

    With a cache limit the fetcher first takes this process's turn in the cache
    (a lease of at least the bytes its pass must hold at once, see
    chute/storage/node/share.py), then claims each shard within the lease before it
    acquires it. When another process sharing the cache waits for room, it
    gives back its read-ahead: the shards no batch task has asked for yet.
    """

    def __init__(self, cache: ShardCache, uses: list[tuple[int, int, int]], *, threads: int = 4,
                 ahead: int = 4 << 30, name: str = "chute-fetch", then: list[tuple[int, int, int]] | None = None) -> None:
        self.cache = cache
        self.uses = uses
        sizes = [s.bytes for s in cache.manifest.shards]
        self.sizes = sizes
        self.need = check_limit(cache, uses)
        # Read ahead by the shards held at once plus one download in flight per thread: deeper read-ahead
        # adds no speed, and each shard it brings in early evicts one the cache kept for a later use
        # (a second epoch at a small cache with the whole limit as read-ahead downloaded most of the dataset
        # again: benchmarks/remote.py, figures in docs/benchmarks.md "Design figures").
        largest = max((sizes[shard] for _, _, shard in uses), default=0)
        self.budget = max(self.need, min(cache.limit if cache.limit is not None else ahead,
                                         self.need + max(1, threads) * largest))
        self._cond = threading.Condition()
        self._next = 0  # index in uses of the next one to start
        self._held_bytes = 0  # bytes of the uses started (loading or ready)
        self._started: dict[int, bool] = {}  # index in uses -> ready (False: loading)
        self._ready: dict[int, int] = {}  # shard -> holds this fetcher has that are ready
        self._held: list[tuple[int, int]] = []  # heap of (last step, index in uses) of started uses
        self._dropped: collections.Counter[int] = collections.Counter()  # uses given back while loading: released on arrival
        self._frontier = 0  # steps below this were received by the consumer
        self._reached = -1  # the highest step a batch task has asked for
        self._extra: dict[int, list[int]] = {}  # step -> shards a task acquired itself (not in the plan)
        self._error: BaseException | None = None
        self._closed = False
        self._waits_stopped = False  # see stop_waits
        self._turn = cache.sharing is None  # whether this process has its lease (see take_turn)
        self._taking = False
        self._unclaimed = False  # a download waits for room outside the lease (see _run)
        self._squeezed = False  # a download waits for room in the cache (see _no_room)
        self._cancel = threading.Event()  # set by close(): downloads in progress stop (see Remote.cancelled_by)
        self.wait_s = 0.0  # time batch tasks spent waiting for shards
        # The first step's shards are downloaded before any read-ahead: alone, they arrive sooner.
        self._leading = sum(1 for first, _, _ in uses if first == uses[0][0]) if uses else 0
        # Where the following pass (``then``: the next epoch's uses) reads each shard first: after
        # this pass, those it reads soonest are the ones to keep in the cache.
        self._steps = max((last for _, last, _ in uses), default=-1) + 1
        self._then: dict[int, int] = {}
        for first, _, shard in then or ():
            self._then.setdefault(shard, first)
        # where each shard is next used, for the cache's eviction
        self._by_shard: dict[int, list[int]] = {}
        for first, _, shard in uses:
            self._by_shard.setdefault(shard, []).append(first)
        self._spans: dict[int, list[tuple[int, int, int]]] = {}  # shard -> (first, last, index in uses)
        for k, (first, last, shard) in enumerate(uses):
            self._spans.setdefault(shard, []).append((first, last, k))
        cache.next_use = self.next_use
        cache.on_no_room = self._no_room
        if cache.sharing is not None:
            job = hashlib.blake2b(repr((cache.dir, uses)).encode(), digest_size=8).hexdigest()  # the same for every rank
            cache.sharing.attach(self, self.need, self.budget, on_demand=self.give_back, on_change=self.wake,
                                 soon=self._soon, job=job)
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{k}", daemon=True) for k in range(max(1, threads))]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ the download threads

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._error is None and (self._taking or (self._turn and not self._can_start())):
                    self._cond.wait()
                if self._closed or self._error is not None:
                    return
                if not self._turn:
                    self._taking = True
                else:
                    k = self._next
                    first, last, shard = self.uses[k]
                    claimed = self.cache.claim(shard)
                    if not claimed and self._held_bytes:
                        self._cond.wait()  # no room in the lease: wait for the consumer, or a ring
                        continue
                    # Unclaimed, this fetcher holds nothing and the lease has no room now (holds outside
                    # it: downloads given back and still arriving): the download waits for room in the
                    # cache, and later uses wait for it, or they would take the room it waits for.
                    self._unclaimed = not claimed
                    self._next += 1
                    self._held_bytes += self.sizes[shard]
                    self._started[k] = False
                    heapq.heappush(self._held, (last, k))
            if not self._turn:
                self._take_turn()
                continue
            try:
                with self.cache.remote.cancelled_by(self._cancel):
                    self.cache.acquire(shard)
            except BaseException as exc:
                with self._cond:
                    if not claimed or self._squeezed:
                        self._unclaimed = self._squeezed = False
                    if not self._closed:  # after close() nobody waits for it, and close() cleared the books
                        self._error = exc
                        self._forget(k)
                    self._cond.notify_all()
                return
            with self._cond:
                if not claimed or self._squeezed:
                    self._unclaimed = self._squeezed = False
                    self._cond.notify_all()
                if self._leading and first == self.uses[0][0]:
                    self._leading -= 1
                    if not self._leading:
                        self._cond.notify_all()  # the read-ahead may start
                if self._dropped[k]:
                    self._dropped[k] -= 1
                    drop = True
                elif self._closed:
                    drop = True
                else:
                    drop = False
                    self._started[k] = True
                    self._ready[shard] = self._ready.get(shard, 0) + 1
                    self._cond.notify_all()
            if drop:
                self.cache.release(shard)

    def _take_turn(self) -> None:
        """Wait (holding nothing) until this process's lease covers the pass's minimum."""
        sharing = self.cache.sharing
        assert sharing is not None, "only a shared cache has turns (self._turn starts True without one)"
        try:
            with inflight.track(f"wait for a turn in the cache shared with other processes ({self.need:,} bytes)", sharing.cache_dir):
                sharing.reserve(0, at_least=self.need, cancelled=lambda: self._cancel.is_set())
        except BaseException as exc:
            with self._cond:
                self._taking = False
                if not self._closed:
                    self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._taking = False
            self._turn = True
            self._cond.notify_all()

    def _forget(self, k: int) -> None:
        """Under ``_cond``: use ``k`` was not held after all (its download failed)."""
        self._started.pop(k, None)
        self._held_bytes -= self.sizes[self.uses[k][2]]
        with contextlib.suppress(ValueError):
            self._held.remove((self.uses[k][1], k))
            heapq.heapify(self._held)

    def _can_start(self) -> bool:
        if self._unclaimed or self._squeezed or self._next >= len(self.uses):
            return False
        if self._leading and self.uses[self._next][0] > self.uses[0][0]:
            return False  # batch 0's shards first
        shard = self.uses[self._next][2]
        return self._held_bytes == 0 or self._held_bytes + self.sizes[shard] <= self.budget

    def _no_room(self) -> None:
        """A download of this process found the cache full (holds outside any lease, e.g. another
        process's reads, leave less room than the lease says): later uses wait for it, and the
        read-ahead no batch task has asked for yet goes back, so that the shard needed first gets
        the room before the shards needed later."""
        with self._cond:
            self._squeezed = True
        self.give_back()

    def stop_waits(self) -> None:
        """The pass ends: batch tasks waiting for shards give up now (raising), before :meth:`close`
        releases what this fetcher holds (tasks reading held shards go on to the end of their batch)."""
        with self._cond:
            self._waits_stopped = True
            self._cond.notify_all()

    def wake(self) -> None:
        """Look again: room may have come free in this process's lease."""
        with self._cond:
            self._cond.notify_all()

    def give_back(self) -> None:
        """Another process waits for room: release the read-ahead no batch task has asked for yet.

        Those are the started uses whose first step is past every step a task has
        waited for: a suffix of the order, which is started again later.
        """
        release = []
        with self._cond:
            if self._closed:
                return
            suffix = [k for k in self._started if self.uses[k][0] > self._reached]
            for k in sorted(suffix):
                shard = self.uses[k][2]
                if self._started.pop(k):
                    self._ready[shard] -= 1
                    release.append(shard)
                else:
                    self._dropped[k] += 1
                self._held_bytes -= self.sizes[shard]
            if suffix:
                self._held = [(last, k) for last, k in self._held if k not in suffix]
                heapq.heapify(self._held)
                self._next = min(suffix)
        for shard in release:
            self.cache.release(shard)

    def _soon(self) -> list[str]:
        """The shards this pass reads next, soonest first, as other processes name them (no lock:
        called under the cache lock, see ShardCache._eviction_order)."""
        start = self._next
        return [self.cache.ident(shard) for _, _, shard in self.uses[start : start + 32]]

    # ------------------------------------------------------------------ the batch tasks' side

    def wait(self, step: int, shards: Iterable[int]) -> None:
        """Block until ``shards`` (those batch ``step`` reads) are held; raise the download's error
        (or :class:`ChuteError` once :meth:`stop_waits` was called)."""
        start = time.perf_counter()
        with self._cond:
            self._reached = max(self._reached, step)  # from now on they are not given back
            for shard in shards:
                k = self._use(shard, step)
                if k is None:
                    self._cond.release()
                    try:
                        self.cache.acquire(shard)
                    finally:
                        self._cond.acquire()
                    if self._closed:  # close() ran meanwhile and released what it knew of: not this one
                        self._cond.release()
                        try:
                            self.cache.release(shard)
                        finally:
                            self._cond.acquire()
                        raise ChuteError("the loader's downloader was closed")
                    self._extra.setdefault(step, []).append(shard)  # held: released when the consumer passes step
                    continue
                # The use that covers this step, not any use of the shard: an earlier use still
                # held now is released when the consumer passes it, maybe while this step reads.
                if not self._started.get(k):
                    with inflight.track("wait for download of", f"{self.cache.remote.url}/{self.cache.manifest.shards[shard].file}"):
                        while not self._started.get(k) and self._error is None and not self._closed:
                            if self._waits_stopped:
                                raise ChuteError("the loader's pass ended while a batch waited for its shards")
                            self._cond.wait()
                if self._error is not None:
                    raise _again(self._error, self.cache.remote.url)
                if self._closed:
                    raise ChuteError("the loader's downloader was closed")
        self.wait_s += time.perf_counter() - start

    def _use(self, shard: int, step: int) -> int | None:
        """The index in ``uses`` of the use of ``shard`` that covers ``step`` (None: not planned)."""
        return next((k for first, last, k in self._spans.get(shard, ()) if first <= step <= last), None)

    def received(self, step: int) -> None:
        """The consumer has received batch ``step``: release the shards no later step reads."""
        planned, extra = [], []
        with self._cond:
            self._frontier = max(self._frontier, step + 1)
            while self._held and self._held[0][0] < self._frontier and self._started.get(self._held[0][1]):
                _, k = heapq.heappop(self._held)
                del self._started[k]
                shard = self.uses[k][2]
                self._ready[shard] -= 1
                planned.append(shard)
            for s in [s for s in self._extra if s < self._frontier]:
                extra.extend(self._extra.pop(s))
        for shard in planned + extra:
            self.cache.release(shard)
        if planned:
            # Only now is the room free in the cache: counted back any earlier, a download
            # could start and find the cache still full of this process's own holds.
            with self._cond:
                self._held_bytes -= sum(self.sizes[shard] for shard in planned)
                self._cond.notify_all()

    def next_use(self, shard: int) -> float:
        """The first step at or after the consumer's position that reads ``shard``; for a shard this
        pass reads no more, the following pass's first use of it, counted after this pass (inf: none)."""
        firsts = self._by_shard.get(shard)
        if firsts:
            k = bisect.bisect_left(firsts, self._frontier)
            if k < len(firsts):
                return firsts[k]
            if any(first <= self._frontier <= last for first, last, _ in self._spans[shard]):
                return self._frontier
        later = self._then.get(shard)
        return math.inf if later is None else self._steps + later

    def close(self) -> None:
        """Stop downloading and release every shard this fetcher holds."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            release = [shard for shard, n in self._ready.items() for _ in range(n)]
            release += [shard for shards in self._extra.values() for shard in shards]
            self._ready.clear()
            self._extra.clear()
            self._held.clear()
            self._started.clear()
            self._cond.notify_all()
        self.cache.remote.cancel(self._cancel)  # downloads in flight end now (streamed ones) or within their request
        if self.cache.sharing is not None:
            self.cache.sharing.wake()  # a thread waiting for its turn sees the cancel
        for shard in release:
            self.cache.release(shard)
        deadline = time.monotonic() + _JOIN_TIMEOUT
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.cache.next_use == self.next_use:
            self.cache.next_use = None
        if self.cache.on_no_room == self._no_room:
            self.cache.on_no_room = None
        if self.cache.sharing is not None:
            self.cache.sharing.detach(self)


__all__ = ["Fetcher", "resident_bytes"]

