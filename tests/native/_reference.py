"""Shard layouts, Arrow sources and pure-Python references for the chute._native tests.

The references apply the validation rules of chute/_native.pyi row by row in plain
Python, so a fuzzed (byte-flipped, truncated) shard can be judged independently of the
C code: either the reference finds the set of (shard, row) problems, and the native
call must raise ``CorruptShard`` for one of them, or it finds none and the native
result must equal the reference's.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, settings, strategies as st

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------------------- layouts

_rows = st.one_of(st.integers(1, 12), st.integers(1, 12), st.just(0), st.integers(13, 40))
layouts = st.lists(_rows, min_size=1, max_size=6)
"""1..6 shards of 0..40 rows, one in four of them empty."""


def offsets_of(rows: list[int]) -> np.ndarray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=offsets[1:])
    return offsets


@st.composite
def batches(draw, layout: list[int], max_size: int = 40) -> np.ndarray:
    """Indices into a layout: any order, duplicates likely, possibly empty."""
    total = sum(layout)
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    values = draw(st.lists(st.integers(0, total - 1), max_size=max_size))
    return np.asarray(values, dtype=np.int64)


def shard_of(offsets: np.ndarray, index: int) -> tuple[int, int]:
    """(shard, row within it) of a global row."""
    s = int(np.searchsorted(offsets, index, side="right")) - 1
    return s, int(index - offsets[s])


# ---------------------------------------------------------------------------- Arrow sources


def binary_source(array: pa.Array) -> tuple[pa.Buffer, pa.Buffer]:
    """(value_offsets, data) of a large_binary / large_string / large_list array, slices included."""
    buffers = array.buffers()
    values = buffers[2] if len(buffers) == 3 else buffers[-1]
    return buffers[1].slice(8 * array.offset, 8 * (len(array) + 1)), values


def map_source(array: pa.MapArray) -> tuple:
    """(entry_offsets, key_offsets, key_data, value_offsets or None, value_data) of a map array."""
    b = array.buffers()
    entry_offsets = b[1].slice(4 * array.offset, 4 * (len(array) + 1))
    if pa.types.is_large_string(array.type.item_type) or pa.types.is_large_binary(array.type.item_type):
        return entry_offsets, b[4], b[5], b[7], b[8]
    return entry_offsets, b[4], b[5], None, b[7]


# ---------------------------------------------------------------------------- references


class Corrupt(Exception):
    """The reference found these (shard, row) problems (row -1: the shard as a whole)."""

    def __init__(self, problems: set[tuple[int, int]]) -> None:
        super().__init__(sorted(problems))
        self.problems = problems


def _int64s(buffer) -> list[int]:
    raw = bytes(buffer)
    return list(struct.unpack(f"<{len(raw) // 8}q", raw[: len(raw) // 8 * 8]))


def _int32s(buffer) -> list[int]:
    raw = bytes(buffer)
    return list(struct.unpack(f"<{len(raw) // 4}i", raw[: len(raw) // 4 * 4]))


def ref_binary(indices, offsets, sources, item_size: int = 1) -> list[bytes]:
    """Each row's bytes of a binary column, or Corrupt."""
    problems: set[tuple[int, int]] = set()
    parsed = {}
    for s in sorted({shard_of(offsets, x)[0] for x in indices}):
        value_offsets, data = sources[s]
        vo = _int64s(value_offsets)
        if len(vo) < offsets[s + 1] - offsets[s] + 1:
            problems.add((s, -1))
        parsed[s] = vo, bytes(data)
    rows = []
    for x in indices:
        s, r = shard_of(offsets, x)
        vo, data = parsed[s]
        if (s, -1) in problems:
            continue
        start, stop = vo[r], vo[r + 1]
        if not 0 <= start <= stop <= len(data) // item_size:
            problems.add((s, r))
            continue
        rows.append(data[start * item_size : stop * item_size])
    if problems:
        raise Corrupt(problems)
    return rows


def _valid_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def ref_map(indices, offsets, sources, value_size: int = 8, text_values: bool = False) -> list[list[tuple[bytes, bytes]]]:
    """Each row's (key bytes, value bytes) entries of a map column, or Corrupt.

    Keys must be UTF-8; with ``text_values`` the values too (take_dicts' "str").
    """
    problems: set[tuple[int, int]] = set()
    parsed = {}
    for s in sorted({shard_of(offsets, x)[0] for x in indices}):
        eo, ko, kd, vo, vd = sources[s]
        eo = _int32s(eo)
        if len(eo) < offsets[s + 1] - offsets[s] + 1:
            problems.add((s, -1))
        parsed[s] = eo, _int64s(ko), bytes(kd), None if vo is None else _int64s(vo), bytes(vd)
    rows = []
    for x in indices:
        s, r = shard_of(offsets, x)
        if (s, -1) in problems:
            continue
        eo, ko, kd, vo, vd = parsed[s]
        e0, e1 = eo[r], eo[r + 1]
        values_available = len(vo) - 1 if vo is not None else len(vd) // value_size
        if not (0 <= e0 <= e1 and e1 <= len(ko) - 1 and e1 <= values_available):
            problems.add((s, r))
            continue
        entries = []
        for e in range(e0, e1):
            if not 0 <= ko[e] <= ko[e + 1] <= len(kd):
                problems.add((s, r))
                break
            key = kd[ko[e] : ko[e + 1]]
            if vo is not None:
                if not 0 <= vo[e] <= vo[e + 1] <= len(vd):
                    problems.add((s, r))
                    break
                value = vd[vo[e] : vo[e + 1]]
            else:
                value = vd[e * value_size : (e + 1) * value_size]
            if not _valid_utf8(key) or (text_values and not _valid_utf8(value)):
                problems.add((s, r))
                break
            entries.append((key, value))
        else:
            rows.append(entries)
    if problems:
        raise Corrupt(problems)
    return rows


def flip_bytes(buffer, positions: list[int], values: list[int]) -> bytes:
    """A copy of ``buffer`` with the byte at each position (mod its size) replaced."""
    raw = bytearray(bytes(buffer))
    for p, v in zip(positions, values):
        if raw:
            raw[p % len(raw)] = v
    return bytes(raw)
