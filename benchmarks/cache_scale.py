"""The node cache's bookkeeping per download as the cache grows: its journal against a scan of the directory.

Every download into a limited node cache takes the cache lock twice: to reserve
its bytes (count what the cache holds, evict a shard, create the ``.part``) and
to rename the finished file into place. Counting used to mean listing every
dataset directory with a ``stat`` per shard; now the count comes from the
journal's new lines (chute/storage/node/ledger.py). This times both ways of counting
on a cache directory of N complete shards (sparse files, so no disk is used),
each cycle doing what a download does under the lock: count, evict one shard,
create a ``.part``, then rename it into place.

    python benchmarks/cache_scale.py --shards 100,1000,10000 --runs 5

Choosing a victim is timed apart: it ranks at most ``EVICTION_SAMPLE`` (256)
cached shards per eviction, the best of a random sample when more are cached
(before: a Python sort key for every cached shard). What the sample costs in
downloads is simulated: two shuffled epochs (``window=4``) over a dataset of
``--sim-shards`` equal shards through a cache of a quarter of them, counting the
shards the second epoch downloads with exact next-use eviction (what chute does
below 256 cached shards: Belady's choice, the order being known), the sampled
one, and LRU.

    python benchmarks/cache_scale.py --sim-shards 8000
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import save  # noqa: E402

from chute.storage.node import ledger as ledger_module  # noqa: E402
from chute.storage.node.ledger import Ledger, scan, try_exclusive, unlink  # noqa: E402
from chute.storage.node.share import cache_lock  # noqa: E402

SIZE = 8 << 20  # bytes each shard counts (sparse: nothing is written)
CYCLES = 200


def _fill(root: str, n: int) -> str:
    directory = os.path.join(root, "0123456789abcdef")
    os.makedirs(os.path.join(directory, "locks"))
    for k in range(n):
        with open(os.path.join(directory, f"shard-{k:06d}.arrow"), "wb") as f:
            f.truncate(SIZE)
    return directory


def _cycle(root: str, directory: str, k: int, books: Ledger | None) -> None:
    """One download's bookkeeping: evict the oldest shard, reserve a .part, rename it into place."""
    victim = f"shard-{k:06d}.arrow"
    new = f"new-{k:06d}.arrow"
    part = f"{new}.{SIZE}.0000abcd.part"
    with cache_lock(root):
        if books is None:
            sum(scan(root).values())
        else:
            books.sync()
        try_exclusive(directory, victim, lambda: unlink(os.path.join(directory, victim)))
        if books is not None:
            books.remove(directory, victim)
        fd = os.open(os.path.join(directory, part), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, SIZE)
        os.close(fd)
        if books is not None:
            books.add(directory, part, SIZE)
    ledger_module.DOWNLOADS.add(os.path.join(directory, part))
    with cache_lock(root):
        os.replace(os.path.join(directory, part), os.path.join(directory, new))
        if books is not None:
            books.sync()
            books.remove(directory, part)
            books.add(directory, new, SIZE)
    ledger_module.DOWNLOADS.discard(os.path.join(directory, part))


def measure(n: int, journal: bool) -> float:
    """Milliseconds of CPU per download's bookkeeping with ``n`` shards cached."""
    root = tempfile.mkdtemp(prefix="chute-cache-scale-")
    try:
        directory = _fill(root, n)
        books = Ledger(root) if journal else None
        if books is not None:
            with cache_lock(root):
                books.sync()
        start = time.process_time()
        for k in range(min(CYCLES, n)):
            _cycle(root, directory, k, books)
        return (time.process_time() - start) / min(CYCLES, n) * 1e3
    finally:
        shutil.rmtree(root, ignore_errors=True)


def simulate(shards: int, sample: int | None, lru: bool = False, seed: int = 0) -> float:
    """Fraction of the dataset the second of two epochs downloads (see the module docstring)."""
    from chute.order import Order

    order = Order(tuple([64] * shards), 16, shuffle=True, seed=0, window=4)
    sequence = [(e, first, last, shard) for e in (0, 1) for first, last, shard in order.shard_uses(e)]
    following = [math.inf] * len(sequence)  # position of the shard's next use after each position
    seen: dict[int, int] = {}
    for k in range(len(sequence) - 1, -1, -1):
        following[k] = seen.get(sequence[k][3], math.inf)
        seen[sequence[k][3]] = k
    capacity = shards // 4
    rng = random.Random(seed)
    cached: list[int] = []
    where: dict[int, int] = {}  # shard -> its place in cached
    key: dict[int, float] = {}  # shard -> next use (or -last use, for LRU): the largest is evicted
    held: dict[int, tuple[int, int]] = {}  # shard -> (epoch, last step) it is read until
    downloads = 0
    for k, (e, first, last, shard) in enumerate(sequence):
        for s in [s for s, until in held.items() if until < (e, first)]:
            del held[s]
        if shard not in where:
            downloads += e == 1
            if len(cached) >= capacity:
                pool = cached if sample is None or len(cached) <= sample else rng.sample(cached, sample)
                free = [s for s in pool if s not in held] or [s for s in cached if s not in held]
                victim = max(free, key=key.__getitem__)
                spot = where.pop(victim)
                moved = cached.pop()
                if moved != victim:
                    cached[spot], where[moved] = moved, spot
            where[shard] = len(cached)
            cached.append(shard)
        key[shard] = -k if lru else following[k]
        held[shard] = (e, last)
    return downloads / shards


def choose(n: int, sample: bool, repeats: int = 20) -> float:
    """Milliseconds of CPU to pick the first victim among ``n`` cached shards: chute's eviction order
    (``ShardCache._by_eviction_order``) over the journal's shards, with every shard ranked or a sample;
    the next use of a shard is a constant-time function here (the loader's is a bisect)."""
    import types

    from chute.storage.node import cache as cache_module
    from chute.storage.node.cache import ShardCache

    root = tempfile.mkdtemp(prefix="chute-cache-scale-")
    saved = cache_module.EVICTION_SAMPLE
    try:
        directory = _fill(root, n)
        books = Ledger(root)
        with cache_lock(root):
            books.sync()
        names = {f"shard-{k:06d}.arrow": k for k in range(n)}
        cache = types.SimpleNamespace(_index=names, next_use=float, sharing=None, dir=directory)
        cache._eviction_order = lambda: ShardCache._eviction_order(cache)  # type: ignore[arg-type]
        cache_module.EVICTION_SAMPLE = saved if sample else n
        times = []
        for _ in range(repeats):
            start = time.process_time()
            next(ShardCache._by_eviction_order(cache, books.shards(), set()))  # type: ignore[arg-type]
            times.append(time.process_time() - start)
        return statistics.median(times) * 1e3
    finally:
        cache_module.EVICTION_SAMPLE = saved
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="100,1000,10000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sim-shards", type=int, default=8000)
    args = parser.parse_args()
    policies = [("exact next use (all cached shards ranked)", None, False), ("next use, best of 256 sampled (chute)", 256, False),
                ("next use, best of 64 sampled", 64, False), ("LRU", None, True)]
    simulated = []
    for label, sample, lru in policies:
        fraction = simulate(args.sim_shards, sample, lru)
        print(f"simulated, {args.sim_shards:,} shards, cache of a quarter: {label}: second epoch downloads {fraction:.3f}x")
        simulated.append({"label": label, "second": fraction})
    rows = []
    for n in (int(v) for v in args.shards.split(",")):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.runs):
            for journal in (False, True):
                times[journal].append(measure(n, journal))
        scan_ms, journal_ms = statistics.median(times[False]), statistics.median(times[True])
        every, sampled = choose(n, sample=False), choose(n, sample=True)
        print(f"{n:7,} shards cached: scan {scan_ms:7.3f} ms, journal {journal_ms:7.3f} ms per download (x{scan_ms / journal_ms:.1f}); "
              f"choosing a victim {every:.3f} ms ranking all, {sampled:.3f} ms ranking a sample")
        rows.append({"label": f"{n:,} shards cached", "scan_ms": scan_ms, "journal_ms": journal_ms, "ratio": scan_ms / journal_ms,
                     "every_ms": every, "sampled_ms": sampled})
    save("cache_scale", {"bookkeeping": {
        "title": "CPU per download for the node cache's bookkeeping under its lock (count, evict one, reserve, rename)",
        "columns": [["scan_ms", "counting by a scan (before), ms", ".3f"], ["journal_ms", "counting by the journal, ms", ".3f"],
                    ["ratio", "scan / journal", ".1f"], ["every_ms", "choosing a victim, all ranked (before), ms", ".3f"],
                    ["sampled_ms", "choosing a victim, at most 256 ranked, ms", ".3f"]],
        "rows": rows,
        "notes": (f"median of {args.runs} runs of up to {CYCLES} downloads each; process CPU time; sparse shard files; "
                  "choosing a victim (median of 20, not in the per-download figures): chute's eviction order over the "
                  "journal's shards, with a constant-time next use (the loader's is a bisect, so ranking all costs more)"),
    }, "eviction": {
        "title": f"simulated: {args.sim_shards:,} shards, a cache of a quarter of them, window 4",
        "columns": [["second", "second epoch downloads (fraction of the dataset)", ".3f"]],
        "rows": simulated,
        "notes": "one run (the simulation is deterministic: seeded shuffle and sample); the bound the issue sets is 0.80",
    }})


if __name__ == "__main__":
    main()
