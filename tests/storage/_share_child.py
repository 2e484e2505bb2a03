"""One process of the cache-sharing tests (run as ``python -m tests.storage._share_child``).

Arguments: URL CACHE_DIR LIMIT SEED EPOCHS OUT. The process opens the dataset
through the shared cache with that byte limit, prints "ready", waits for a line
on stdin (so that every process starts at once), reads EPOCHS shuffled epochs
with its own seed, saves their columns to OUT and prints its cache counters as
JSON on the last line.

With ``hold`` as EPOCHS it takes a lease of the whole limit (as a loader reading
ahead would), prints "holding" and waits on stdin: the process a test kills.
"""

from __future__ import annotations

import json
import sys

import torch

import chute
from tests.storage._helpers import epoch_columns, loader

#: Seconds without a batch before a child gives up (waiting for a turn in a cache
#: that fits one process at a time takes up to a few of the others' passes).
STALL_S = 600.0


def main(url: str, cache_dir: str, limit: str, seed: str, epochs: str, out: str) -> None:
    if epochs == "hold":
        from chute.storage.node.share import Sharing

        Sharing(cache_dir, int(limit)).reserve(0, at_least=int(limit))
        print("holding", flush=True)
        sys.stdin.readline()
        return
    ds = chute.open(url, cache_dir=cache_dir, cache_limit=int(limit))
    ld = loader(ds, seed=int(seed), watchdog=chute.Watchdog(STALL_S, on_stall="raise"))
    print("ready", flush=True)
    sys.stdin.readline()
    torch.save([epoch_columns(ld) for _ in range(int(epochs))], out)
    print(json.dumps(ds.cache.stats()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
