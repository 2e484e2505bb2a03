"""Parsing and printing byte sizes ("128MB", "1.5 GiB")."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}


def parse_size(value: int | float | str) -> int:
    """Bytes from an int or a string such as ``"128MB"`` or ``"64 MiB"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a byte size: {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative: {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {value!r} (examples: 134217728, '128MB', '64MiB')")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
