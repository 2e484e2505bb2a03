"""Where chute keeps files of its own on this machine (a leaf module: the standard library only)."""

from __future__ import annotations

import os


def default_cache_dir() -> str:
    """``$CHUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/chute``, else ``~/.cache/chute``."""
    if os.environ.get("CHUTE_CACHE_DIR"):
        return os.path.expanduser(os.environ["CHUTE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "chute")
