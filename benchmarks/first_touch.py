"""What writing a new file costs in pages just freed, and in memory that has been free for a while.

    python benchmarks/first_touch.py [--mb 256] [--rounds 4] [--idle 6] [--dir DIR]

Each round writes a file of ``--mb`` MiB (fallocated, then written 1 MiB at a
time, as the node cache writes a download), leaves it idle ``--idle`` seconds,
deletes it, and at once writes two new files of the same size: the first one's
pages can be the ones just freed, the second one's cannot. It prints the thread
CPU seconds per GB of each. On a VM whose host takes back the memory the guest
leaves free (free page reporting), the second costs several times the first:
a node cache that fills pays that for every byte it fills, a cache that is full
does not (a download overwrites an evicted shard's file: docs/remote.md,
"Performance").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def write(path: str, mb: int, block: bytes) -> float:
    """Thread CPU seconds per GB to create ``path`` at ``mb`` MiB and write it 1 MiB at a time."""
    start = time.thread_time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, mb << 20)
        for i in range(mb):
            os.pwrite(fd, block, i << 20)
    finally:
        os.close(fd)
    return (time.thread_time() - start) / (mb << 20) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--idle", type=float, default=6.0)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    block = os.urandom(1 << 20)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="chute-first-touch-") as work:
        old, first, second = (os.path.join(work, name) for name in ("old", "first", "second"))
        for k in range(args.rounds):
            write(old, args.mb, block)
            time.sleep(args.idle)
            os.unlink(old)
            into_freed = write(first, args.mb, block)
            beyond = write(second, args.mb, block)
            os.unlink(first)
            os.unlink(second)
            print(f"round {k}: CPU s/GB writing a new file into pages just freed {into_freed:.2f}, "
                  f"into memory free for longer {beyond:.2f}", flush=True)


if __name__ == "__main__":
    main()
