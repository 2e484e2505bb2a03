"""The global order: which sample each rank delivers in each batch.

Pure functions of numbers: no threads, no files. Everything downstream follows
this order, so it is what makes a run reproducible and resumable.

The epoch's **global order** is a permutation of all rows:

* ``shuffle=False``: rows in dataset order.
* ``shuffle=True``: the shards are permuted, then cut into windows of
  ``window`` consecutive (permuted) shards, and the rows of each window are
  permuted. A window's rows are read together, so only a few shards need to be
  resident at once (the cache can stream the rest).

Permutations come from a keyed Feistel network over integers (not from numpy's
generators, whose streams may change between numpy versions), so the same
``(seed, epoch)`` gives the same order on any machine and any version.

The global order is consumed in **steps**: each step takes the next
``batch_size * world_size`` rows and rank ``r`` delivers the ``r``-th slice of
``batch_size`` rows. The position reached (``consumed``) is the whole resume
state: from it the rest of the epoch can be cut for any world size, and every
row is still delivered exactly once. The last, partial step (``drop_last=False``)
gives every rank the same number of rows ``ceil(rest / world_size)``; the few
missing ones are padded with the first rows of the epoch's global order. With
``drop_last=True`` the partial step is dropped. Every rank therefore delivers the
same number of batches.

Within a batch, rows are grouped by shard (keeping their order otherwise), so
the reader gathers each shard's rows with one copy.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from chute import _native

DEFAULT_WINDOW = 4
"""Shards per shuffle window."""

_M64 = (1 << 64) - 1
_ROUNDS = 6
_CHUNK = 1 << 20  # positions permuted per numpy pass, to bound temporary memory


def _splitmix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _key(*parts: int) -> int:
    """A 64-bit key derived from integers (seed, epoch, purpose, ...)."""
    h = 0x6A09E667F3BCC908
    for part in parts:
        h = _splitmix(h ^ (int(part) & _M64))
    return h


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x ^ key``, element-wise on uint64 (wrapping)."""
    x = x ^ key
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permutation(n: int, key: int) -> np.ndarray:
    """A pseudo-random permutation of ``range(n)`` determined by ``key`` (int64 array).

    A balanced Feistel network is a bijection on ``[0, 4**h)``; the values below
    ``n``, taken in order of their position, are a permutation of ``range(n)``.
    Computed by ``chute._native.feistel``; ``_permutation_numpy`` is the same in numpy.
    """
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    out = np.empty(n, dtype=np.int64)
    _native.feistel(n, half, [_key(key, r) for r in range(_ROUNDS)], out)
    return out


def group_by_shard(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each batch of ``rows`` (``[batch]``, or ``[count, batch]``: one batch a row) stably ordered by shard, the
    shards given by their row ``offsets`` (S + 1): one native call (``_group_by_shard_numpy`` is the same in numpy)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size == 0:
        return rows
    grouped = np.empty_like(rows)
    _native.group_by_shard(rows, rows.shape[-1], offsets, grouped)
    return grouped


def _group_by_shard_numpy(rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each row of ``rows`` (``[count, width]``) stably ordered by shard: ``chute._native.group_by_shard`` in numpy."""
    shard = np.searchsorted(offsets, rows, side="right")
    return np.take_along_axis(rows, np.argsort(shard, axis=1, kind="stable"), axis=1)


def _permutation_numpy(n: int, key: int) -> np.ndarray:
    """``permutation`` in numpy: the reference the native Feistel network is tested against."""
    if n <= 1:
        return np.zeros(n, dtype=np.int64)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    round_keys = [np.uint64(_key(key, r)) for r in range(_ROUNDS)]
    parts = []
    for start in range(0, 1 << (2 * half), _CHUNK):
        v = np.arange(start, min(start + _CHUNK, 1 << (2 * half)), dtype=np.uint64)
        left, right = v >> shift, v & mask
        for rk in round_keys:
            left, right = right, left ^ (_mix(right, rk) & mask)
        out = (left << shift) | right
        parts.append(out[out < np.uint64(n)])
    return np.concatenate(parts).astype(np.int64)


def permutation_prefix(n: int, key: int, count: int) -> np.ndarray:
    """``permutation(n, key)[:count]``, computing only the positions it needs.

    The Feistel network maps each position on its own, so the first values
    below ``n`` come from the first few positions: a pass's first batch needs
    ``batch_size`` values of its window's permutation, not all of them.
    """
    if count >= n or n <= 1:
        return permutation(n, key)[:count]
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift, total = np.uint64((1 << half) - 1), np.uint64(half), 1 << (2 * half)
    round_keys = [np.uint64(_key(key, r)) for r in range(_ROUNDS)]
    parts, found, start, span = [], 0, 0, max(64, 2 * count)
    while found < count and start < total:
        v = np.arange(start, min(start + span, total), dtype=np.uint64)
        left, right = v >> shift, v & mask
        for rk in round_keys:
            left, right = right, left ^ (_mix(right, rk) & mask)
        out = (left << shift) | right
        out = out[out < np.uint64(n)]
        parts.append(out)
        found, start, span = found + len(out), start + len(v), span * 2
    return np.concatenate(parts)[:count].astype(np.int64)


#: A pass that starts within this many rows of a window's start computes just that prefix of the window
#: (the rest of the window is computed, once, by the next request).
PREFIX_ROWS = 1 << 12


@dataclasses.dataclass(frozen=True)
class Order:
    """The order of one dataset's rows for a given batch size, shuffle and seed.

    ``shard_rows`` are the row counts of the shards in dataset order. Methods take
    the epoch, the world size and the resume position, so one ``Order`` serves
    every epoch and any number of ranks.
    """

    shard_rows: tuple[int, ...]
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    window: int = DEFAULT_WINDOW
    drop_last: bool = False

    if TYPE_CHECKING:  # per instance, set in __post_init__; ClassVar only keeps them out of the dataclass fields
        _cache: ClassVar[dict[tuple, Any]]
        _cache_lock: ClassVar[threading.Lock]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_rows", tuple(int(r) for r in self.shard_rows))
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1 shard, got {self.window}")
        if any(r < 0 for r in self.shard_rows):
            raise ValueError("shard row counts cannot be negative")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_cache_lock", threading.Lock())

    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def _cached(self, key: tuple, make):
        """A small per-instance memo of the last few windows, shared by the loader's threads.

        (``functools.lru_cache`` would hash ``self``, which costs O(shards) per call.)
        """
        with self._cache_lock:
            value = self._cache.get(key)
        if value is None:
            value = make()  # outside the lock: two threads may both compute it, harmlessly
            with self._cache_lock:
                if len(self._cache) >= 8:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = value
        return value

    # ------------------------------------------------------------------ the global order

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """First global row of each shard, plus the total at the end."""
        offsets = np.zeros(len(self.shard_rows) + 1, dtype=np.int64)
        np.cumsum(self.shard_rows, out=offsets[1:])
        return offsets

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def _windows(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's shard order and the first global-order position of each window."""
        return self._cached(("windows", epoch), lambda: self._make_windows(epoch))

    def _make_windows(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        shards = permutation(len(self.shard_rows), _key(self.seed, epoch, 0))
        rows = np.asarray(self.shard_rows, dtype=np.int64)[shards]
        sizes = [int(rows[a : a + self.window].sum()) for a in range(0, len(shards), self.window)]
        starts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        return shards, starts

    def _window_rows(self, epoch: int, w: int) -> np.ndarray:
        """Global row ids of window ``w`` of ``epoch``, in their shuffled order."""
        return self._cached(("rows", epoch, w), lambda: self._make_window_rows(epoch, w))

    def _window_prefix(self, epoch: int, w: int, count: int) -> np.ndarray:
        """The first ``count`` rows of window ``w`` (``_window_rows(epoch, w)[:count]``), from a prefix of its permutation."""
        shards, _ = self._windows(epoch)
        members = shards[w * self.window : (w + 1) * self.window]
        sizes = np.asarray(self.shard_rows, dtype=np.int64)[members]
        ends = np.cumsum(sizes)
        picked = permutation_prefix(int(ends[-1]), _key(self.seed, epoch, 1, w), count)
        k = np.searchsorted(ends, picked, side="right")
        return self.offsets[members[k]] + picked - (ends[k] - sizes[k])

    def _make_window_rows(self, epoch: int, w: int) -> np.ndarray:
        shards, _ = self._windows(epoch)
        members = shards[w * self.window : (w + 1) * self.window]
        rows = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in members])
        return rows[permutation(len(rows), _key(self.seed, epoch, 1, w))]

    def positions(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Rows at positions ``[start, stop)`` of the epoch's global order."""
        start, stop = max(0, start), min(stop, self.num_rows)
        if stop <= start:
            return np.zeros(0, dtype=np.int64)
        if not self.shuffle:
            return np.arange(start, stop, dtype=np.int64)
        _, starts = self._windows(epoch)
        parts = []
        w = int(np.searchsorted(starts, start, side="right")) - 1
        while start < stop:
            w_start, w_stop = int(starts[w]), int(starts[w + 1])
            take = min(stop, w_stop)
            if take - w_start <= PREFIX_ROWS and ("rows", epoch, w) not in self._cache:  # a pass's first batch
                parts.append(self._window_prefix(epoch, w, take - w_start)[start - w_start :])
            else:
                parts.append(self._window_rows(epoch, w)[start - w_start : take - w_start])
            start = take
            w += 1
        return np.concatenate(parts)

    def global_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's global order (for tests and small datasets)."""
        return self.positions(epoch, 0, self.num_rows)

    # ------------------------------------------------------------------ steps and ranks

    def num_batches(self, world_size: int = 1, consumed: int = 0) -> int:
        """Batches each rank delivers from position ``consumed`` to the end of the epoch."""
        _check_world(world_size)
        if consumed < 0:
            raise ValueError(f"consumed cannot be negative, got {consumed}")
        rest = max(0, self.num_rows - consumed)
        step = self.batch_size * world_size
        full, tail = divmod(rest, step)
        return full + (1 if tail and not self.drop_last else 0)

    def consumed_after(self, batches: int, world_size: int = 1, consumed: int = 0) -> int:
        """The position reached once every rank has delivered ``batches`` more batches."""
        if batches >= self.num_batches(world_size, consumed):
            return self.num_rows
        return consumed + batches * self.batch_size * world_size

    def batch(self, epoch: int, step: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> np.ndarray:
        """The rows rank ``rank`` delivers in step ``step`` counted from position ``consumed``."""
        _check_world(world_size, rank)
        n = self.num_batches(world_size, consumed)
        if not 0 <= step < n:
            raise IndexError(f"step {step} is outside the {n} batches left in the epoch")
        size = self.batch_size * world_size
        first = consumed + step * size
        if first + size <= self.num_rows:
            rows = self.positions(epoch, first + rank * self.batch_size, first + (rank + 1) * self.batch_size)
        else:  # the last, partial step: equal shares, padded from the start of the order
            rest = self.num_rows - first
            share = -(-rest // world_size)
            lo, hi = rank * share, (rank + 1) * share
            rows = self.positions(epoch, first + lo, first + min(hi, rest))
            if hi > rest:  # padding: positions 0, 1, ... of the order (cycling if it is short)
                pad = np.arange(max(lo, rest) - rest, hi - rest) % self.num_rows
                rows = np.concatenate([rows, self.positions(epoch, 0, int(pad.max()) + 1)[pad]])
        return self._group_by_shard(rows)

    def full_steps(self, world_size: int = 1, consumed: int = 0) -> int:
        """Steps from position ``consumed`` whose ``batch_size * world_size`` rows are all real (no padding)."""
        _check_world(world_size)
        return max(0, self.num_rows - consumed) // (self.batch_size * world_size)

    def prepare(self, epoch: int, first: int, count: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> None:
        """Compute :meth:`steps` with these arguments now, for a later call (or :meth:`prepared`) to take.

        A Loader's pass calls it on a thread of its own for the pass after it
        (``chute.pipeline.indices``): a window's permutation of a large dataset
        takes milliseconds, which the next pass's start would otherwise wait for.
        At most a few are kept, the oldest dropped first.
        """
        self._cached(("steps", epoch, first, count, rank, world_size, consumed),
                     lambda: self.steps(epoch, first, count, rank, world_size, consumed))

    def prepared(self, epoch: int, first: int, count: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> np.ndarray | None:
        """What :meth:`prepare` computed with these arguments (taken: it is not kept), or None."""
        with self._cache_lock:
            return self._cache.pop(("steps", epoch, first, count, rank, world_size, consumed), None)  # type: ignore[no-any-return]

    def steps(self, epoch: int, first: int, count: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> np.ndarray:
        """Rows of full steps ``[first, first + count)`` for ``rank``: a ``[count, batch_size]`` array.

        Row ``k`` equals ``batch(epoch, first + k, rank, world_size, consumed)``,
        computed for all the steps at once (one slice of the global order, one
        native grouping by shard) instead of one batch at a time. Only full steps
        (see :meth:`full_steps`); the last, partial step comes from :meth:`batch`.
        """
        _check_world(world_size, rank)
        if first < 0 or count < 0 or first + count > self.full_steps(world_size, consumed):
            raise IndexError(
                f"steps [{first}, {first + count}) are not all full steps of the "
                f"{self.full_steps(world_size, consumed)} from position {consumed}"
            )
        ready = self.prepared(epoch, first, count, rank, world_size, consumed)
        if ready is not None:
            return ready
        size = self.batch_size * world_size
        start = consumed + first * size
        rows = self.positions(epoch, start, start + count * size).reshape(count, world_size, self.batch_size)[:, rank, :]
        if len(self.shard_rows) > 1 and self.batch_size > 1:
            return group_by_shard(rows, self.offsets)  # one native call, not a numpy sort per row (docs/benchmarks.md)
        return np.ascontiguousarray(rows)

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> Iterator[np.ndarray]:
        """Every batch rank ``rank`` delivers from position ``consumed`` to the end of the epoch."""
        for step in range(self.num_batches(world_size, consumed)):
            yield self.batch(epoch, step, rank, world_size, consumed)

    def shard_uses(self, epoch: int, world_size: int = 1, consumed: int = 0) -> list[tuple[int, int, int]]:
        """``(first step, last step, shard)`` for every shard the rest of the epoch reads, by first step.

        A shard is counted as used by every step that covers any position of its
        window (``shuffle=True``: the window's rows are interleaved) or of its own
        rows (``shuffle=False``), on any rank: a superset of what one rank reads,
        computed without listing rows. This is what the downloader follows.
        """
        n = self.num_batches(world_size, consumed)
        if n == 0:
            return []
        size = self.batch_size * world_size
        groups: list[tuple[int, int, Sequence[int] | np.ndarray]]
        if self.shuffle:
            shards, starts = self._windows(epoch)
            groups = [(int(starts[w]), int(starts[w + 1]), shards[w * self.window : (w + 1) * self.window]) for w in range(len(starts) - 1)]
        else:
            groups = [(int(self.offsets[s]), int(self.offsets[s + 1]), [s]) for s in range(len(self.shard_rows))]
        uses: list[tuple[int, int, int]] = []
        for a, b, members in groups:
            if b <= max(a, consumed):
                continue
            first = (max(a, consumed) - consumed) // size
            if first >= n:
                continue
            last = min(n - 1, (b - 1 - consumed) // size)
            uses.extend((first, last, int(s)) for s in members if self.shard_rows[s])
        rest = (self.num_rows - consumed) % size
        if not self.drop_last and rest and -(-rest // world_size) * world_size > rest:
            # some rank's last batch pads with positions 0 .. world_size-1 of the order
            uses.extend((n - 1, n - 1, int(s)) for a, b, members in groups if a < world_size for s in members if self.shard_rows[s])
        uses.sort()
        return uses

    def _group_by_shard(self, rows: np.ndarray) -> np.ndarray:
        if len(self.shard_rows) <= 1 or len(rows) <= 1:
            return rows
        return group_by_shard(rows, self.offsets)

    # ------------------------------------------------------------------ resume state

    def state(self, epoch: int, consumed: int) -> dict[str, int | bool | str]:
        """What a checkpoint stores to resume at position ``consumed`` of ``epoch``."""
        return {
            "epoch": int(epoch),
            "consumed": int(consumed),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window": self.window,
            "num_rows": self.num_rows,
            "num_shards": len(self.shard_rows),
            "layout": self.layout,
        }

    @functools.cached_property
    def layout(self) -> str:
        """A fingerprint of the shard row counts: the order depends on them, not only on their sum."""
        import hashlib

        return hashlib.blake2b(np.asarray(self.shard_rows, dtype=np.int64).tobytes(), digest_size=8).hexdigest()

    def check_state(self, state: dict) -> tuple[int, int]:
        """Validate a state from :meth:`state` against this order; return ``(epoch, consumed)``."""
        for key in ("seed", "shuffle", "window", "num_rows", "num_shards", "layout"):
            if key in state and state[key] != self.state(0, 0)[key]:
                raise ValueError(
                    f"cannot resume: the saved state has {key}={state[key]!r} but this loader has "
                    f"{key}={self.state(0, 0)[key]!r}; resuming needs the same dataset, seed, shuffle and window"
                )
        consumed = int(state["consumed"])
        if not 0 <= consumed <= self.num_rows:
            raise ValueError(f"cannot resume: position {consumed} is outside an epoch of {self.num_rows} rows")
        return int(state["epoch"]), consumed


def _check_world(world_size: int, rank: int = 0) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
