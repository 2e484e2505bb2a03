"""The node cache's bookkeeping per download as the cache grows: its journal against a scan of the directory.

Every download into a limited node cache takes the cache lock twice: to reserve
its bytes (count what the cache holds, evict a shard, create the ``.part``) and
to rename the finished file into place. Counting used to mean listing every
dataset directory with a ``stat`` per shard; now the count comes from the
journal's new lines (chute/storage/ledger.py). This times both ways of counting
on a cache directory of N complete shards (sparse files, so no disk is used),
each cycle doing what a download does under the lock: count, evict one shard,
create a ``.part``, then rename it into place.

    python benchmarks/cache_scale.py --shards 100,1000,10000 --runs 5

The eviction order (a sort of the cached shards by next use, the same in both)
is not included: it is a Python key per cached shard, so it still grows with N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import save  # noqa: E402

from chute.storage import ledger as ledger_module  # noqa: E402
from chute.storage.ledger import Ledger, scan, try_exclusive, unlink  # noqa: E402
from chute.storage.share import cache_lock  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="100,1000,10000")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for n in (int(v) for v in args.shards.split(",")):
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.runs):
            for journal in (False, True):
                times[journal].append(measure(n, journal))
        scan_ms, journal_ms = statistics.median(times[False]), statistics.median(times[True])
        print(f"{n:7,} shards cached: scan {scan_ms:7.3f} ms, journal {journal_ms:7.3f} ms per download (x{scan_ms / journal_ms:.1f})")
        rows.append({"label": f"{n:,} shards cached", "scan_ms": scan_ms, "journal_ms": journal_ms, "ratio": scan_ms / journal_ms})
    save("cache_scale", {"bookkeeping": {
        "title": "CPU per download for the node cache's bookkeeping under its lock (count, evict one, reserve, rename)",
        "columns": [["scan_ms", "counting by a scan (before), ms", ".3f"], ["journal_ms", "counting by the journal, ms", ".3f"],
                    ["ratio", "scan / journal", ".1f"]],
        "rows": rows,
        "notes": (f"median of {args.runs} runs of up to {CYCLES} downloads each; process CPU time; sparse shard files; "
                  "the eviction order's sort (the same in both) not included"),
    }})


if __name__ == "__main__":
    main()
