"""Named steps of the cache protocol, where a test can pause a process, kill it, or check what it holds.

``CHUTE_CACHE_STEPS=module:function`` (read once, when this module is imported)
names a function the protocol calls at each step below as ``function(step, **facts)``.
Unset, as everywhere but in tests/storage/test_stress.py, :data:`HOOK` is None and
each step is one test of a module constant: nothing is called.

=========== ================================================================== =====================
step        where (chute/storage/node/README.md names the states and locks)     facts
=========== ================================================================== =====================
reserved    a ``.part`` was made at its full size (the cache lock is held)      ``path``, ``size``
downloaded  a download matched the manifest, before its rename (download lock)  ``part``, ``final``
held        this process's first hold of a complete shard (read lock shared)    ``shard``, ``path``
release     its last hold is about to go (the read lock is still held)          ``shard``, ``path``
gave-back   a member shrank its lease and is about to ring the waiters          ``lease``, ``ringing``
turn-wait   a member is about to wait for its turn or for room in its lease     ``reserved``, ``at_least``
woken       that wait (or a wait for room in the cache) ended                   ``rung``, ``seconds``
=========== ================================================================== =====================

``rung`` is False when a wait ended by its timeout (the dead-peer check), True
when something woke it (a doorbell, a release in this process).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

ENV = "CHUTE_CACHE_STEPS"


def _load() -> Callable[..., None] | None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{ENV}={spec!r}: expected module:function")
    return getattr(importlib.import_module(module), name)


#: The function called at each step, or None (the steps cost one test of this constant).
HOOK: Callable[..., None] | None = _load()

__all__ = ["ENV", "HOOK"]
