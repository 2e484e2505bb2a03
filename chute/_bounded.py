"""Reading what comes from outside (a manifest, an object's body) in blocks, never past a limit.

One loop for every bounded read: a file or an fsspec file is read in blocks
of at most ``block`` bytes, asking for no more than ``limit + 1`` bytes in
all, so a source larger than its limit costs one byte past it, never its whole
size in memory; the caller says what the limit was (each layer has its own
error).
"""

from __future__ import annotations

from collections.abc import Callable


def read_within(read: Callable[[int], bytes], limit: int, sink: Callable[[bytes], object], block: int = 1 << 20) -> int:
    """Hand ``sink`` the blocks ``read(n)`` returns until it returns ``b""``; the bytes read.

    More than ``limit`` (``limit + 1``) means the source is larger than the
    limit: reading stopped there and the block that crossed it was not handed
    to ``sink``.
    """
    got = 0
    while chunk := read(min(block, limit + 1 - got)):
        got += len(chunk)
        if got > limit:
            break
        sink(chunk)
    return got
