"""Numeric arguments of the token API, checked as integers in range before anything uses them.

A float (``1.5``), a bool (``True``) or a string is refused rather than
truncated, and a number outside the range the kernels take is refused with an
error naming the argument (never an ``OverflowError`` from deep inside, nor an
error that blames the data).
"""

from __future__ import annotations

import numbers
from typing import Any

#: The longest sequence the native kernels take (their ``seq_len`` is an int32; packed ``cu_seqlens`` are int32).
MAX_SEQ_LEN = 2**31 - 1
INT64_MAX = 2**63 - 1


def integer(value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; TypeError for a non-integer (bools and floats included), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise ValueError(f"{name} must be an integer from {_spell(low)} to {_spell(high)}, got {number}")
    return number


def optional_integer(value: Any, name: str, low: int, high: int) -> int | None:
    return None if value is None else integer(value, name, low, high)


def _spell(n: int) -> str:
    for power in (31, 32, 63, 64):
        if n == 2**power - 1:
            return f"2**{power}-1"
        if n == -(2**power):
            return f"-2**{power}"
    return str(n)
