"""The progressive mode: train on what the cache holds while it keeps filling and rotating.

For a remote dataset larger than the node cache (docs/remote.md):

* a **filler** thread downloads shards in a seeded random order, one after
  another, until the loader is closed or the whole dataset is in the cache;
  when the cache is full it evicts
  the shards that arrived first (never one the current epoch still reads);
* **epoch k** covers exactly the shards that were complete in the cache when it
  started, in the usual shuffled order over that set. Starting an epoch only
  takes a snapshot of the cache (no download), so the loop does not wait at an
  epoch boundary; each shard of the set is held until the epoch has read it for
  the last time, then released so that the filler can replace it.

The epoch's set is part of the loader's state, so a resumed run finishes the
same epoch over the same shards (downloading again any that were evicted).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
from typing import Any

from chute.errors import ChuteError
from chute.format.reader import Dataset
from chute.order import Order, _key, permutation
from chute.storage.net.remote import Remote
from chute.storage.node.cache import ShardCache
from chute.storage.node.share import cache_lock

log = logging.getLogger("chute")


class Filler:
    """Keeps downloading the dataset's shards into the cache in a seeded random order."""

    def __init__(self, full: ShardCache, seed: int, name: str = "chute-fill") -> None:
        self.full = full  # the dataset's cache, which the loader reports
        remote = full.remote
        own = Remote(remote.url, remote.storage_options, remote.retry, remote.part_size, remote.parallel)  # closed on its own
        self.cache = ShardCache(own, full.manifest, full.cache_dir, full.limit, share=False)
        self.seed = seed
        self._arrival: dict[int, int] = {}
        self._counter = itertools.count()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.arrived = threading.Condition()
        self.cache.next_use = self._age  # evict the shards that arrived first
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _age(self, shard: int) -> float:
        arrival = self._arrival.get(shard)
        return math.inf if arrival is None else -arrival

    def _run(self) -> None:
        n = len(self.cache.manifest.shards)
        try:
            for round_ in itertools.count():
                missing = 0
                for i in permutation(n, _key(self.seed, round_, 7)).tolist():
                    if self._stop.is_set():
                        return
                    if self.cache.cached(i):
                        self._arrival.setdefault(i, next(self._counter))
                        continue
                    missing += 1
                    self.cache.acquire(i)
                    self._arrival[i] = next(self._counter)
                    shown = self.full.counts  # the loader reports the dataset's cache: its high-water mark is ours
                    shown["high_water"] = max(shown["high_water"], self.cache.counts["high_water"])
                    self.cache.release(i)
                    with self.arrived:
                        self.arrived.notify_all()
                if missing == 0 and round_ > 0:
                    return  # the whole dataset is in the cache: nothing left to rotate in
        except BaseException as exc:  # reported to the loader at the next epoch
            self.error = exc
            log.error("chute: the progressive filler stopped: %s", exc)
            with self.arrived:
                self.arrived.notify_all()

    def wake(self) -> None:
        """An epoch released shards: a waiting download may find room now."""
        with self.cache._cond:
            self.cache._cond.notify_all()

    def close(self) -> None:
        self._stop.set()
        self.cache.remote.close()
        self.wake()
        self._thread.join(timeout=5.0)
        self.cache.close()


class Progressive:
    """The epochs of a progressive loader: each a snapshot of the cache's complete shards."""

    def __init__(self, dataset: Dataset, order: Order, seed: int, min_shards: int = 1) -> None:
        if not isinstance(dataset.cache, ShardCache):
            raise ChuteError(
                f"progressive=True needs a remote dataset with a node cache; {dataset.root} is local "
                "(all of it is there already: use the default mode)"
            )
        if dataset.cache.limit is None:
            raise ChuteError(
                f"progressive=True needs a cache_limit (chute.open({dataset.root!r}, cache_limit=...)): "
                "the mode trains on what fits in the cache while it rotates"
            )
        self.dataset = dataset
        self.cache = dataset.cache  # the node cache the epochs read from and the filler fills
        self.order = order
        self.seed = seed
        self.min_shards = max(1, int(min_shards))
        self.filler: Filler | None = None
        self.epochs: list[dict[str, Any]] = []  # what each epoch covered

    def _start(self) -> Filler:
        if self.filler is None:
            self.filler = Filler(self.cache, self.seed)
        return self.filler

    def snapshot(self) -> tuple[list[int], ShardCache]:
        """The complete shards in the cache now, each held by a new per-epoch cache view."""
        filler = self._start()
        full = self.cache
        need = min(self.min_shards, len(full.manifest.shards))
        while True:
            with filler.arrived:
                while True:
                    present = [i for i in range(len(full.manifest.shards)) if full.cached(i)]
                    if len(present) >= need:
                        break
                    if filler.error is not None:
                        raise ChuteError(f"progressive mode: downloading {full.remote.url} failed: {filler.error}") from filler.error
                    filler.arrived.wait(timeout=5.0)
            # The filler may evict one of them before the lock is ours: the epoch's set (and its view, whose
            # manifest is the epoch's dataset) is what is still complete under the lock, never ``present``.
            with cache_lock(full.cache_dir):  # eviction needs this lock: nothing leaves while we hold
                held = [i for i in present if full.cached(i)]
                if len(held) >= need:
                    view = self._view(held)
                    try:
                        for k in range(len(held)):
                            view.acquire(k)
                    except BaseException:
                        view.close()  # no hold outlives a failed start
                        raise
                    return held, view

    def _view(self, shards: list[int]) -> ShardCache:
        full = self.cache
        manifest = dataclasses.replace(full.manifest, shards=tuple(full.manifest.shards[i] for i in shards))
        return ShardCache(full.remote, manifest, full.cache_dir, full.limit, share=False)

    def epoch_dataset(self, shards: list[int], view: ShardCache | None = None) -> tuple[Dataset, Order]:
        """The dataset and order of an epoch over ``shards`` (indices into the full dataset)."""
        view = view or self._view(shards)
        ds = Dataset(self.dataset.root, view.manifest, self.dataset._manifest_text, view)
        order = dataclasses.replace(self.order, shard_rows=tuple(s.rows for s in view.manifest.shards))
        return ds, order

    def order_for(self, rows: int) -> Order:
        return dataclasses.replace(self.order, shard_rows=(rows,))

    def record(self, epoch: int, shards: list[int]) -> None:
        """Note (and log) what epoch ``epoch`` covers."""
        before = set(self.epochs[-1]["shard_ids"]) if self.epochs else set()
        info = {
            "epoch": epoch,
            "shards": len(shards),
            "samples": sum(self.dataset.shards[i].rows for i in shards),
            "new_shards": len(set(shards) - before),
            "shard_ids": sorted(shards),
        }
        self.epochs.append(info)
        log.info("chute: progressive epoch %d covers %d shard(s), %d sample(s) (%d new)",
                 epoch, info["shards"], info["samples"], info["new_shards"])

    def close(self) -> None:
        if self.filler is not None:
            self.filler.close()
            self.filler = None


class EpochHolds:
    """Releases an epoch's snapshot holds as the epoch passes each shard's last use (the fetcher's interface)."""

    def __init__(self, view: ShardCache, uses: list[tuple[int, int, int]], filler: Filler | None) -> None:
        self.view = view
        self.filler = filler
        self._lock = threading.Lock()
        last: dict[int, int] = {}
        for _, end, shard in uses:
            last[shard] = max(end, last.get(shard, -1))
        self._left = sorted((end, shard) for shard, end in last.items())
        self._held = set(range(len(view.manifest.shards)))
        for shard in self._held - set(last):  # never read (no rows): release now
            self._release(shard)

    def _release(self, shard: int) -> None:
        self._held.discard(shard)
        self.view.release(shard)

    def wait(self, step: int, shards: list[int]) -> None:
        missing = [s for s in shards if s not in self._held]
        if missing:  # only if the schedule were wrong: never read a shard we do not hold
            raise ChuteError(f"progressive epoch: step {step} reads shards {missing} that are no longer held")

    def stop_waits(self) -> None:
        """(The fetcher's interface: :meth:`wait` never blocks.)"""

    def received(self, step: int) -> None:
        released = False
        with self._lock:
            while self._left and self._left[0][0] <= step:
                _, shard = self._left.pop(0)
                if shard in self._held:
                    self._release(shard)
                    released = True
        if released and self.filler is not None:
            self.filler.wake()

    def close(self) -> None:
        with self._lock:
            for shard in list(self._held):
                self._release(shard)
            self._left.clear()
        self.view.close()
        if self.filler is not None:
            self.filler.wake()
