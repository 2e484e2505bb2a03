"""What writing a new file costs in pages just freed, and in memory that has been free for a while.

    python benchmarks/first_touch.py [--mb 256] [--rounds 4] [--idle 6] [--write-kb 1024,256] [--dir DIR]

Each round, for each write size of ``--write-kb``, writes a file of ``--mb`` MiB
(fallocated, then written that many KiB per system call, each write aligned to
its size), leaves it idle ``--idle`` seconds, deletes it, and at once writes two
new files of the same size: the first one's pages can be the ones just freed,
the second one's cannot. It prints the thread CPU seconds per GB of each. On a
VM whose host takes back the memory the guest leaves free (free page reporting:
free blocks of 2 MiB and more), the second costs several times the first when
the writes are large: the page cache gives a write a folio as large as the
write, and large folios take whole free blocks, which the host faults back in
page by page. Writes of 256 KiB (chute's downloads: ``WRITE_MAX`` in
chute/storage/net/remote.py) take smaller free blocks the host still backs,
while there are some (docs/remote.md, "Performance").
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def write(path: str, mb: int, block: bytes, piece: int = 1 << 20) -> float:
    """Thread CPU seconds per GB to create ``path`` at ``mb`` MiB and write it ``piece`` bytes at a time."""
    view = memoryview(block)
    start = time.thread_time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, mb << 20)
        for offset in range(0, mb << 20, piece):
            os.pwrite(fd, view[offset % len(view):][:piece], offset)
    finally:
        os.close(fd)
    return (time.thread_time() - start) / (mb << 20) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--idle", type=float, default=6.0)
    parser.add_argument("--write-kb", default="1024,256", help="bytes per write system call, in KiB (a list: each in turn)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    block = os.urandom(1 << 20)
    pieces = [int(kb) << 10 for kb in args.write_kb.split(",")]
    if any(p <= 0 or (1 << 20) % p for p in pieces):
        parser.error("--write-kb: each size must divide 1024")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="chute-first-touch-") as work:
        old, first, second = (os.path.join(work, name) for name in ("old", "first", "second"))
        for k in range(args.rounds):
            for piece in pieces:
                write(old, args.mb, block)
                time.sleep(args.idle)
                os.unlink(old)
                into_freed = write(first, args.mb, block, piece)
                beyond = write(second, args.mb, block, piece)
                os.unlink(first)
                os.unlink(second)
                print(f"round {k}, writes of {piece >> 10} KiB: CPU s/GB writing a new file into pages just freed "
                      f"{into_freed:.2f}, into memory free for longer {beyond:.2f}", flush=True)


if __name__ == "__main__":
    main()
