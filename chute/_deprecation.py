"""The deprecation path of CHANGELOG.md: a renamed argument keeps working for one minor version, with a warning.

Use at the top of a public function that renamed ``old`` to ``new``::

    def __init__(self, ..., workers=None, **deprecated):
        workers = renamed(deprecated, "num_threads", "workers", workers, since="0.2", where="chute.Loader")
        no_more(deprecated, "chute.Loader")

A ``FutureWarning`` (shown by default) names the new argument and the version
that removes the old one; passing both is a ``TypeError``.
"""

from __future__ import annotations

import warnings
from typing import Any


def _next_minor(version: str) -> str:
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"{major}.{minor + 1}"


def renamed(kwargs: dict[str, Any], old: str, new: str, value: Any, *, since: str, where: str, default: Any = None) -> Any:
    """``value`` of ``new``, or the value passed under the ``old`` name (popped from ``kwargs``) with a FutureWarning."""
    if old not in kwargs:
        return value
    given = kwargs.pop(old)
    if value is not default:
        raise TypeError(f"{where}: {old}= was renamed to {new}= in chute {since}; pass only {new}=")
    warnings.warn(
        f"{where}: {old}= is deprecated since chute {since} and will be removed in chute {_next_minor(since)}; use {new}=",
        FutureWarning,
        stacklevel=3,
    )
    return given


def no_more(kwargs: dict[str, Any], where: str) -> None:
    """After the renamed arguments are taken out: anything left in ``kwargs`` is an unknown argument."""
    if kwargs:
        raise TypeError(f"{where} got unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
