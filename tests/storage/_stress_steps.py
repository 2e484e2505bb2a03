"""The stress test's hook at the cache protocol's steps (chute/storage/node/steps.py), in each member process.

A member runs with ``CHUTE_CACHE_STEPS=tests.storage._stress_steps:step`` and its
schedule in ``CHUTE_STRESS_SCHEDULE`` (JSON, drawn by the test from the round's seed):

* ``seed``, ``pause`` (a probability) and ``pause_ms`` (the longest pause): at the
  fault-injection points (``PAUSED``: a ``.part`` just reserved, with the cache lock
  held; a download verified and not yet renamed; a lease shrunk and its waiters not
  yet rung) the member sleeps for a seeded random while, as a slow or descheduled
  process would;
* ``kill``: ``[step, n]`` kills the member (``SIGKILL``, by itself) at the ``n``-th
  time it reaches that step, so a death lands exactly there (holding the cache lock,
  a complete ``.part`` not renamed, a lease not yet given back).

And it checks, in the process, the invariants a server log or a directory listing
cannot show (chute/storage/node/README.md's numbering):

* 3, never evict what is held: a shard's file at its last release is the file
  (same inode) that was there at its first hold;
* 6, no wait while holding what another needs: a member that waits for its turn
  holds nothing;
* 8, wake-ups, not polls: a wait that nobody woke lasted the whole dead-peer check.

A broken invariant is written to stderr as a line starting with ``VIOLATION``; the
test fails the round on any.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading

PAUSED = frozenset({"reserved", "downloaded", "gave-back"})
VIOLATION = "VIOLATION"

_lock = threading.Lock()
_schedule = json.loads(os.environ.get("CHUTE_STRESS_SCHEDULE", "{}"))
_rng = random.Random(_schedule.get("seed", 0))
_counts: dict[str, int] = {}
_inodes: dict[str, int] = {}


def counts() -> dict[str, int]:
    """How many times this process reached each step."""
    with _lock:
        return dict(_counts)


def _violation(text: str) -> None:
    print(f"{VIOLATION} pid={os.getpid()}: {text}", file=sys.stderr, flush=True)


def step(name: str, **facts: object) -> None:
    """Called by the cache protocol at step ``name`` (see the module docstring)."""
    from chute.storage.node.share import DEAD_PEER_CHECK_S

    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        count = _counts[name]
        pause = _rng.random() < _schedule.get("pause", 0.0) and name in PAUSED
        pause_s = _rng.uniform(0, _schedule.get("pause_ms", 0) / 1000)
    kill = _schedule.get("kill")
    if kill and kill[0] == name and kill[1] == count:
        print(f"stress member: killed by its schedule at {name} #{count}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if name == "held":
        try:
            inode = os.stat(str(facts["path"])).st_ino
        except FileNotFoundError:  # let go (and evicted) by another thread of this process meanwhile
            return
        with _lock:
            _inodes[str(facts["path"])] = inode
    elif name == "release":
        with _lock:
            inode = _inodes.pop(str(facts["path"]), None)
        if inode is not None:
            try:
                now = os.stat(str(facts["path"])).st_ino
            except FileNotFoundError:
                now = None
            if now != inode:
                _violation(f"shard {facts['shard']} ({facts['path']}) was evicted or replaced while held (invariant 3)")
    elif name == "turn-wait":
        if facts["at_least"] and facts["reserved"]:
            _violation(f"waits for its turn holding {facts['reserved']:,} bytes (invariant 6)")
    elif name == "woken":
        if not facts["rung"] and float(facts["seconds"]) < DEAD_PEER_CHECK_S - 0.5:  # type: ignore[arg-type]
            _violation(f"a wait ended unwoken after {facts['seconds']:.3f} s, before the dead-peer check (a poll: invariant 8)")
    if pause:
        threading.Event().wait(pause_s)
