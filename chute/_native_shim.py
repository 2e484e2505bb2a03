"""DEVELOPMENT ONLY: a numpy stand-in for the chute._native C extension (same API, slow).

Removed once the extension lands; nothing imports it then.
"""

from __future__ import annotations

import numpy as np


class Unmapped(LookupError):
    def __init__(self, shard: int) -> None:
        super().__init__(f"shard {shard} is not mapped")
        self.shard = shard


class CorruptShard(ValueError):
    def __init__(self, message: str, shard: int, row: int = -1) -> None:
        super().__init__(message)
        self.shard, self.row = shard, row


def _locate(indices, offsets, sources_list):
    idx = np.frombuffer(indices, dtype=np.int64) if not isinstance(indices, np.ndarray) else indices
    off = np.frombuffer(offsets, dtype=np.int64) if not isinstance(offsets, np.ndarray) else offsets
    total = int(off[-1])
    if len(idx) and (idx.min() < 0 or idx.max() >= total):
        bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
        raise IndexError(f"row {bad} is out of range for {total} rows")
    shard = np.searchsorted(off, idx, side="right") - 1
    needed = np.unique(shard).tolist()
    for s in needed:
        for sources in sources_list:
            if sources[s] is None:
                raise Unmapped(s)
    return idx, off, shard


def gather(indices, offsets, columns):
    columns = list(columns)
    idx, off, shard = _locate(indices, offsets, [c[0] for c in columns])
    for sources, out, row_bytes in columns:
        dst = np.frombuffer(out, dtype=np.uint8) if not isinstance(out, np.ndarray) else out.reshape(-1).view(np.uint8)
        dst = dst.reshape(len(idx), row_bytes) if len(idx) else dst
        for i, (s, r) in enumerate(zip(shard.tolist(), (idx - off[shard]).tolist())):
            src = np.frombuffer(sources[s], dtype=np.uint8)
            dst[i] = src[r * row_bytes : (r + 1) * row_bytes]


def _rows(indices, offsets, sources):
    idx, off, shard = _locate(indices, offsets, [sources])
    return zip(shard.tolist(), (idx - off[shard]).tolist())


def gather_binary(indices, offsets, sources, item_size=1):
    parts, offs = [], [0]
    for s, r in _rows(indices, offsets, sources):
        o, data = sources[s]
        o = np.frombuffer(o, dtype=np.int64)
        part = bytes(memoryview(data)[o[r] * item_size : o[r + 1] * item_size])
        parts.append(part)
        offs.append(offs[-1] + len(part) // item_size)
    return np.asarray(offs, np.int64).tobytes(), b"".join(parts)


def take_objects(indices, offsets, sources, kind):
    offs, data = gather_binary(indices, offsets, sources)
    o = np.frombuffer(offs, np.int64)
    out = [data[o[i] : o[i + 1]] for i in range(len(o) - 1)]
    return [b.decode("utf-8") for b in out] if kind == "str" else out


def gather_map(indices, offsets, sources, value_size=8):
    entries, koffs, kdata, voffs, vdata = [0], [0], [], [0], []
    fixed = False
    for s, r in _rows(indices, offsets, sources):
        eo, ko, kd, vo, vd = sources[s]
        eo, ko = np.frombuffer(eo, np.int32), np.frombuffer(ko, np.int64)
        kd = bytes(kd)
        a, b = int(eo[r]), int(eo[r + 1])
        for e in range(a, b):
            key = kd[ko[e] : ko[e + 1]]
            kdata.append(key)
            koffs.append(koffs[-1] + len(key))
            if vo is None:
                fixed = True
                vdata.append(bytes(memoryview(vd)[e * value_size : (e + 1) * value_size]))
            else:
                vo_ = np.frombuffer(vo, np.int64)
                v = bytes(memoryview(vd)[vo_[e] : vo_[e + 1]])
                vdata.append(v)
                voffs.append(voffs[-1] + len(v))
        entries.append(entries[-1] + b - a)
    return (
        np.asarray(entries, np.int32).tobytes(), np.asarray(koffs, np.int64).tobytes(), b"".join(kdata),
        b"" if fixed else np.asarray(voffs, np.int64).tobytes(), b"".join(vdata),
    )


def _decode_values(voffs, vdata, kind, n):
    if kind in ("int64", "float64"):
        return np.frombuffer(vdata, dtype=kind).tolist()
    vo = np.frombuffer(voffs, np.int64)
    vals = [vdata[vo[i] : vo[i + 1]] for i in range(n)]
    return [v.decode("utf-8") for v in vals] if kind == "str" else vals


def take_dicts(indices, offsets, sources, kind):
    eo, ko, kd, vo, vd = gather_map(indices, offsets, sources)
    ko_ = np.frombuffer(ko, np.int64)
    keys = [kd[ko_[i] : ko_[i + 1]].decode("utf-8") for i in range(len(ko_) - 1)]
    return dicts_from_values(eo, ko, kd, _decode_values(vo, vd, kind, len(keys)), keys)


def dicts_from_values(entry_offsets, key_offsets, key_data, values, _keys=None):
    eo = np.frombuffer(entry_offsets, np.int32)
    if _keys is None:
        ko = np.frombuffer(key_offsets, np.int64)
        _keys = [bytes(key_data[ko[i] : ko[i + 1]]).decode("utf-8") for i in range(len(ko) - 1)]
    if len(values) != len(_keys):
        raise ValueError("values do not match the entries")
    return [dict(zip(_keys[eo[i] : eo[i + 1]], values[eo[i] : eo[i + 1]])) for i in range(len(eo) - 1)]


def join_json(offsets, data):
    o = np.frombuffer(offsets, np.int64)
    return b"[" + b",".join(bytes(data[o[i] : o[i + 1]]) for i in range(len(o) - 1)) + b"]"


def feistel(n, half, round_keys, out):
    raise NotImplementedError
