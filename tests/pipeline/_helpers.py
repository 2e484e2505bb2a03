"""What tests of the pipeline share."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Callable


def gone_without_a_collection(use: Callable[[], weakref.ref], left: Callable[[], list]) -> None:
    """``use()`` makes a Loader, uses it and returns a weak reference to it: with the garbage collector off, the
    Loader is gone once ``use`` returns (it is in no reference cycle) and ``left()`` (its threads) is empty."""
    gc.collect()
    gc.disable()
    try:
        gone = use()
        assert gone() is None
        assert left() == []
    finally:
        gc.enable()


def loader_threads() -> list[threading.Thread]:
    """The Loaders' worker threads alive now."""
    return [t for t in threading.enumerate() if t.name.startswith("chute-loader")]


def native_threads() -> list[int]:
    """The thread ids of the Loaders' native gather threads alive now (``chute.pipeline.native_gather``: not
    Python threads, so ``threading`` does not list them; named ``chute-gather`` for the system)."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "chute-gather":
                    found.append(int(tid))
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile (before the open; between it and the read)
            pass
    return found
