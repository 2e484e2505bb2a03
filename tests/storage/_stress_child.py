"""One member of the cache stress test (run as ``python -m tests.storage._stress_child``).

Arguments: URL CACHE_DIR LIMIT SEED WINDOW BATCH EPOCHS OUT_DIR. The process
opens the dataset through the shared cache with that byte limit, prints
"ready", waits for a line on stdin (so that every member starts at once), then
reads EPOCHS shuffled epochs and saves each one's columns to
``OUT_DIR/epoch-<k>.pt`` as soon as it ends (written to a temporary name and
renamed: a member killed mid-write leaves no half file). It prints "done" last.

SIGUSR1 dumps every thread's stack to stderr (faulthandler), and SIGUSR2 what the
member holds (:func:`dump_state`: the cache's holds and downloads, the lease, the
pass's downloader): the test sends both to the members still running when a
round passes its time bound, so that a hang fails with where the processes that
hung were and what they held, not a silent timeout.

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
from tests.storage._helpers import epoch_columns, journal_files

#: Seconds without a batch before a member gives up on its own (the test's bound comes first).
STALL_S = 300.0
#: What a member writes to its stderr once it has closed everything (then it exits normally).
CLOSED = "closed, exiting"
#: The line before the protocol steps it reached, as JSON (tests/storage/_stress_steps.py).
STEPS = "stress member: steps"


def dump_state(ds, ld) -> str:
    """What this member holds and waits for: the cache's holds, loads and claims, the lease, the
    cache directory as the journal counts it, and the current pass's downloader (read without
    their locks: a hung member's locks may be what it hangs on)."""
    cache = ds.cache
    lines = [f"cache: limit {cache.limit:,} refs {dict(cache._refs)} loading {sorted(cache._loading)} "
             f"claims {dict(cache._claims)} reserved {sorted(cache._reserved)} counts {cache.counts}"]
    sharing = cache.sharing
    if sharing is not None:
        lines.append(f"sharing: id {sharing._id} reserved {sharing.reserved:,} state {sharing.state} "
                     f"attached {[(m, w) for m, w, *_ in sharing._attached.values()]} waiters {sharing._waiters}")
    counted = journal_files(cache.cache_dir) or {}  # as it reads now (not synced: a sync may scan)
    lines.append(f"journal: used {sum(counted.values()):,} files {sorted(counted.items())}")
    run = ld._pass
    fetcher = getattr(run, "fetcher", None)
    if fetcher is not None and hasattr(fetcher, "uses"):
        lines.append(
            f"pass: epoch {run.epoch} received {run.received} submitted {run.submitted} steps {run.steps}; "
            f"fetcher: need {fetcher.need:,} budget {fetcher.budget:,} held {fetcher._held_bytes:,} next "
            f"{fetcher._next}/{len(fetcher.uses)} frontier {fetcher._frontier} reached {fetcher._reached} turn "
            f"{fetcher._turn} taking {fetcher._taking} unclaimed {fetcher._unclaimed} squeezed {fetcher._squeezed} "
            f"started {fetcher._started} ready {fetcher._ready} extra {fetcher._extra} dropped {dict(fetcher._dropped)} "
            f"uses {fetcher.uses[max(0, fetcher._next - 8):fetcher._next + 4]}")
    else:
        lines.append(f"pass: {run!r} fetcher {fetcher!r}")
    return "\n".join(lines)


def _print_state(opened: list) -> None:
    try:
        state = dump_state(*opened) if len(opened) == 2 else "(the dataset and loader are not open yet)"
    except Exception as exc:  # a dict changed size while read: the stacks still come (SIGUSR1)
        state = f"(not read: {exc!r})"
    print(f"stress member: state\n{state}", file=sys.stderr, flush=True)


def main(url: str, cache_dir: str, limit: str, seed: str, window: str, batch: str, epochs: str, out_dir: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    opened: list = []
    signal.signal(signal.SIGUSR2, lambda *_: _print_state(opened))
    ds = chute.open(url, cache_dir=cache_dir, cache_limit=int(limit))
    ld = chute.Loader(ds, int(batch), shuffle=chute.Shuffle(window=int(window)), seed=int(seed),
                      workers=chute.Workers(count=2), watchdog=chute.Watchdog(STALL_S, on_stall="raise"))
    opened += [ds, ld]
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
