"""One member of the cache stress test (run as ``python -m tests.storage._stress_child``).

Arguments: URL CACHE_DIR LIMIT SEED WINDOW BATCH EPOCHS OUT_DIR. The process
opens the dataset through the shared cache with that byte limit, prints
"ready", waits for a line on stdin (so that every member starts at once), then
reads EPOCHS shuffled epochs and saves each one's columns to
``OUT_DIR/epoch-<k>.pt`` as soon as it ends (written to a temporary name and
renamed: a member killed mid-write leaves no half file). It prints "done" last.

SIGUSR1 dumps every thread's stack to stderr (faulthandler): the test sends it to
the members still running when a round passes its time bound, so that a hang
fails with the stacks of the processes that hung, not a silent timeout.

After closing its loader and dataset (which must leave the cache: the test
checks that no member file is left) the member prints the threads still alive
and returns: it exits normally, as a user's program does, and the test bounds
that exit too (a member that hangs at interpreter exit fails the round naming
it). ``CHUTE_STRESS_EXIT_DUMP=<seconds>`` arms ``faulthandler`` to dump every
thread's Python stack if the member is still alive that long after it closed
(a debugging aid for a hang at exit; the test's own bound also takes the native
stacks with gdb).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading

import torch

import chute
from tests.storage._helpers import epoch_columns

#: Seconds without a batch before a member gives up on its own (the test's bound comes first).
STALL_S = 300.0
#: What a member writes to its stderr once it has closed everything (then it exits normally).
CLOSED = "closed, exiting"
#: The line before the protocol steps it reached, as JSON (tests/storage/_stress_steps.py).
STEPS = "stress member: steps"


def main(url: str, cache_dir: str, limit: str, seed: str, window: str, batch: str, epochs: str, out_dir: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ds = chute.open(url, cache_dir=cache_dir, cache_limit=int(limit))
    ld = chute.Loader(ds, int(batch), shuffle=chute.Shuffle(window=int(window)), seed=int(seed),
                      workers=chute.Workers(count=2), watchdog=chute.Watchdog(STALL_S, on_stall="raise"))
    print("ready", flush=True)
    sys.stdin.readline()
    for epoch in range(int(epochs)):
        columns = epoch_columns(ld)
        path = os.path.join(out_dir, f"epoch-{epoch}.pt")
        torch.save(columns, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"stress member: epoch {epoch} saved", file=sys.stderr, flush=True)
    ld.close()
    ds.close()
    from tests.storage._stress_steps import counts

    print(f"{STEPS} {json.dumps(counts())}", file=sys.stderr, flush=True)
    threads = [f"{t.name}{' (daemon)' if t.daemon else ''}" for t in threading.enumerate()]
    print(f"stress member: {CLOSED}; threads alive: {', '.join(threads)}", file=sys.stderr, flush=True)
    if os.environ.get("CHUTE_STRESS_EXIT_DUMP"):
        faulthandler.dump_traceback_later(float(os.environ["CHUTE_STRESS_EXIT_DUMP"]), exit=False)
    print("done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:9])
