"""A process that reads through a limited shared cache, is stopped and continued, then exits
(run as ``python -m tests.storage._exit_child``; see tests/storage/test_exit.py).

Arguments: URL CACHE_DIR LIMIT HOW. The process opens the dataset with that
byte limit, reads a few batches (so that it holds a lease, its fetcher holds
shards and its doorbell's listener runs), prints "holding" and waits for a line
on stdin. Then, with HOW ``close``, it closes its loader and dataset; with
``leave`` it closes nothing (a program that breaks out of its loop and ends).
It prints "exiting" and returns: the interpreter exits normally.

SIGUSR1 dumps every thread's Python stack to stderr (faulthandler), for a test
whose bound on the exit passed.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

import chute
from tests.storage._helpers import loader

BATCHES = 3


def main(url: str, cache_dir: str, limit: str, how: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ds = chute.open(url, cache_dir=cache_dir, cache_limit=int(limit))
    ld = loader(ds, workers=chute.Workers(count=2))
    batches = iter(ld)
    for _ in range(BATCHES):
        next(batches)
    print("holding", flush=True)
    sys.stdin.readline()
    if how == "close":
        ld.close()
        ds.close()
    print("exiting", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
