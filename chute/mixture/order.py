"""The order of a weighted mixture of datasets: which source rows each rank delivers in each batch.

Pure functions of numbers, like :mod:`chute.order`, whose interface this shares
so a Loader can use either.

**Streams.** Each source ``k`` (``n_k`` rows) is read as an endless stream: pass
``p`` of it is the source's own :class:`chute.order.Order` for "epoch" ``p``
with a seed derived from ``(seed, source name)`` (shuffled shards, rows shuffled
within windows of shards). Stream position ``c`` is row ``c % n_k`` of pass
``c // n_k``, so no row of a source repeats before all of it was seen; a small
source cycles, a large one is read without replacement and goes on where it
stopped in the next epoch. A source's **counter** is its stream position.

**Epochs.** An epoch of the mixture is ``num_rows`` rows (default: the sources'
rows together). Its rows are split between the sources in proportion to their
weights, *cumulatively over epochs* (largest remainders of ``epochs * num_rows *
share``), so the counters at an epoch's start are a function of the epoch alone,
whatever world sizes ran before. Largest remainders alone can give a source one
row fewer after an epoch than before it, when its share grows by less than one
row an epoch; such a count is kept where it was instead, and the row comes from
the source furthest above its share (:func:`monotone_apportion`).

**Steps.** The epoch is consumed in global batches of ``batch_size *
world_size`` rows (the last one partial, or dropped with ``drop_last``). Each
global batch gives source ``k`` ``floor`` or ``ceil`` of its exact share of
the batch; which sources get the extra sample is decided by how far each is
behind its share so far (largest deficit first, ties to the first source), so
the rounding evens out and the epoch ends exactly on each source's quota. A
global batch's rows are dealt to the ranks in turn, source by source, so every
rank's batch holds ``floor`` or ``ceil`` of its part of each source's rows.

**Resume.** The position in the epoch (``consumed``, an int) plus the counters
at that position continue the epoch exactly, on any world size: the deficits
that decide the rounding are a function of the counters and the position.
:meth:`MixOrder.state` records them with the weight history, and
:meth:`MixOrder.check_state` adopts them.

**Weights** may change at any position (:meth:`MixOrder.set_weights`): from
there the rest of that epoch and the following ones follow the new shares, and
the change is part of the state, so a curriculum resumes exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from chute.order import DEFAULT_WINDOW, Order, _check_world, _key, group_by_shard


def apportion(total: int, weights: Sequence[Fraction]) -> list[int]:
    """``total`` split in proportion to ``weights``: floors plus one for the largest remainders.

    Exact (rational arithmetic); ties go to the first source. The result sums to ``total``.
    """
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    counts = [math.floor(x) for x in exact]
    extra = total - sum(counts)
    ranked = sorted(range(len(weights)), key=lambda k: (-(exact[k] - counts[k]), k))
    for k in ranked[:extra]:
        counts[k] += 1
    return counts


def monotone_apportion(previous: Sequence[int], total: int, weights: Sequence[Fraction]) -> list[int]:
    """:func:`apportion` of ``total`` rows, with no count below ``previous`` (the counts of a smaller total).

    Where largest remainders would take a row back from a source (its exact share grew by less than
    one row since ``previous``), the source keeps its ``previous`` count, and each such row is given
    back by the source then furthest above its exact share (ties: the last source) among those above
    their own ``previous`` count. Equal to ``apportion`` wherever that takes nothing back.
    """
    counts = apportion(total, weights)
    excess = sum(max(0, p - c) for p, c in zip(previous, counts))
    if not excess:
        return counts
    counts = [max(p, c) for p, c in zip(previous, counts)]
    whole = sum(weights)
    for _ in range(excess):  # (counts now sum to total + excess, previous to at most total: someone is above it)
        k = max((k for k in range(len(counts)) if counts[k] > previous[k]), key=lambda k: (counts[k] - total * weights[k] / whole, k))
        counts[k] -= 1
    return counts


def step_counts(size: int, quota: Sequence[int], length: int, deficit: Sequence[int]) -> list[int]:
    """How many of ``size`` rows each source gives in one global batch.

    A plan gives source ``k`` ``quota[k]`` of ``length`` rows; ``deficit[k]`` is
    how far it is behind that share so far, in units of ``1/length`` rows. Each
    source gets ``floor`` of its share ``size * quota[k] / length``, and the rows
    left over go to the sources furthest behind (ties: the first source).
    """
    base = [size * q // length for q in quota]
    extra = size - sum(base)
    behind = sorted(range(len(quota)), key=lambda k: (-(deficit[k] + size * quota[k] - length * base[k]), k))
    for k in behind[:extra]:
        base[k] += 1
    return base


def name_key(name: str) -> int:
    """A stable 64-bit integer for a source name (part of its seed)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


@dataclasses.dataclass(frozen=True)
class WeightChange:
    """From position ``position`` of epoch ``epoch`` on, the sources' weights are ``weights``.

    ``counters`` are the sources' stream positions there.
    """

    epoch: int
    position: int
    weights: tuple[Fraction, ...]
    counters: tuple[int, ...]

    @property
    def at(self) -> tuple[int, int]:
        return (self.epoch, self.position)

    def to_json(self, names: Sequence[str]) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "weights": {n: [w.numerator, w.denominator] for n, w in zip(names, self.weights)},
            "counters": dict(zip(names, self.counters)),
        }

    @classmethod
    def from_json(cls, data: Mapping, names: Sequence[str]) -> WeightChange:
        return cls(
            int(data["epoch"]), int(data["position"]),
            tuple(Fraction(*data["weights"][n]) for n in names), tuple(int(data["counters"][n]) for n in names),
        )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How an epoch's rows from ``start`` to its end split between the sources.

    Source ``k`` gives ``quota[k]`` of those ``length`` rows, starting at stream position ``first[k]``.
    """

    start: int
    length: int
    first: tuple[int, ...]
    quota: tuple[int, ...]

    def deficits(self, position: int, counters: Sequence[int]) -> list[int]:
        """How far each source is behind its share at ``position`` (in ``1/length`` rows)."""
        return [q * (position - self.start) - self.length * (c - f) for q, c, f in zip(self.quota, counters, self.first)]


@dataclasses.dataclass(frozen=True)
class _Trajectory:
    """The counters at every step boundary of one pass over an epoch."""

    positions: np.ndarray  # int64 [steps + 1]: the epoch position before each step, and at the end
    bounds: np.ndarray  # int64 [steps + 1, sources]: the counters there

    def row_of(self, position: int) -> int | None:
        i = int(np.searchsorted(self.positions, position))
        return i if i < len(self.positions) and self.positions[i] == position else None


@dataclasses.dataclass
class MixOrder:
    """The order of a mixture's rows (see the module docstring).

    ``names`` and ``shard_rows`` describe the sources (in the mixture's order:
    source ``k``'s row ``r`` is row ``base[k] + r`` of the mixture), ``weights``
    their initial weights (positive numbers, relative). The other settings mean
    what they mean for :class:`chute.order.Order`; ``window`` applies within each
    source. ``epoch_rows`` is the length of an epoch (default: all sources' rows).
    """

    names: tuple[str, ...]
    shard_rows: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    window: int = DEFAULT_WINDOW
    drop_last: bool = False
    epoch_rows: int | None = None
    changes: tuple[WeightChange, ...] = ()  # the weight history, the initial weights first
    anchors: dict = dataclasses.field(default_factory=dict)  # (epoch, position) -> counters, from loaded states

    def __post_init__(self) -> None:
        self.names = tuple(str(n) for n in self.names)
        self.shard_rows = tuple(tuple(int(r) for r in rows) for rows in self.shard_rows)
        if len(self.names) != len(self.shard_rows) or not self.names:
            raise ValueError("a mixture needs one or more sources, each with its shard row counts")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"source names must be distinct, got {list(self.names)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        empty = [n for n, rows in zip(self.names, self.shard_rows) if sum(rows) == 0]
        if empty:
            raise ValueError(f"source(s) {empty} have no rows; a mixture draws from every source")
        self.sources = tuple(
            Order(rows, 1, self.shuffle, _key(self.seed, name_key(name)) & (2**63 - 1), self.window)
            for name, rows in zip(self.names, self.shard_rows)
        )
        self.sizes = tuple(o.num_rows for o in self.sources)
        self.base = tuple(int(b) for b in np.cumsum((0,) + self.sizes)[:-1])
        self.shard_base = tuple(int(b) for b in np.cumsum((0,) + tuple(len(r) for r in self.shard_rows))[:-1])
        if self.epoch_rows is None:
            self.epoch_rows = sum(self.sizes)
        if self.epoch_rows < 1:
            raise ValueError(f"epoch_rows must be at least 1, got {self.epoch_rows}")
        if not self.changes:
            self.changes = (WeightChange(0, 0, self._fractions(self.weights), (0,) * len(self.names)),)
        self._cache: dict = {}
        self._since_change: dict[tuple[int, int], list[tuple[int, ...]]] = {}  # change.at -> _since(change, 1, 2, ...)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def _fractions(self, weights: Sequence[float] | Mapping[str, float]) -> tuple[Fraction, ...]:
        if isinstance(weights, Mapping):
            if set(weights) != set(self.names):
                raise ValueError(
                    f"weights name {sorted(weights)} but the mixture's sources are {sorted(self.names)}; "
                    "give one weight per source"
                )
            weights = [weights[n] for n in self.names]
        if len(weights) != len(self.names):
            raise ValueError(f"{len(weights)} weights for {len(self.names)} sources")
        out = []
        for name, w in zip(self.names, weights):
            if isinstance(w, bool) or not isinstance(w, (int, float, Fraction, np.integer, np.floating)) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"the weight of source {name!r} must be a positive finite number, got {w!r}")
            out.append(Fraction(w) if not isinstance(w, np.generic) else Fraction(w.item()))
        return tuple(out)

    # ------------------------------------------------------------------ sizes

    @property
    def num_rows(self) -> int:
        """Rows in one epoch of the mixture."""
        assert self.epoch_rows is not None  # set in __post_init__
        return int(self.epoch_rows)

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        """First mixture row of each shard of the concatenated shard list, plus the total."""
        rows = [r for source in self.shard_rows for r in source]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(rows, out=offsets[1:])
        return offsets

    @functools.cached_property
    def layout(self) -> str:
        """A fingerprint of the sources' names and shard row counts."""
        h = hashlib.blake2b(digest_size=8)
        for name, rows in zip(self.names, self.shard_rows):
            h.update(name.encode("utf-8") + b"\0" + np.asarray(rows, dtype=np.int64).tobytes())
        return h.hexdigest()

    # the same cut of an epoch into steps as one dataset's order (Order's functions, which read
    # num_rows, batch_size and drop_last; declared for the type checker with this class as self)
    if TYPE_CHECKING:
        def num_batches(self, world_size: int = 1, consumed: int = 0) -> int: ...
        def consumed_after(self, batches: int, world_size: int = 1, consumed: int = 0) -> int: ...
        def full_steps(self, world_size: int = 1, consumed: int = 0) -> int: ...
    else:
        num_batches = Order.num_batches
        consumed_after = Order.consumed_after
        full_steps = Order.full_steps

    def steps(self, epoch: int, first: int, count: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> np.ndarray:
        """Rows of full steps ``[first, first + count)`` for ``rank``: a ``[count, batch_size]`` array (the Loader's
        form), equal to :meth:`batch` of each step, computed for the whole chunk at once: each source's stream
        positions in one call, then one stable sort by step (sources in order within a step), the rank's deal,
        and one stable sort by shard within each step."""
        if count == 0:
            return np.zeros((0, self.batch_size), dtype=np.int64)
        _check_world(world_size, rank)
        full = self.full_steps(world_size, consumed)
        if not (0 <= first and first + count <= full):
            raise IndexError(f"steps {first} to {first + count - 1} are not all among the {full} full steps left in the epoch")
        size = self.batch_size * world_size
        bounds = self._trajectory(epoch, consumed, size).bounds[first : first + count + 1]  # [count + 1, sources]
        per_step = np.diff(bounds, axis=0)  # rows of each source in each step
        rows, step_of = [], []
        for k in range(len(self.names)):
            rows.append(self.base[k] + self.stream_rows(k, int(bounds[0, k]), int(bounds[-1, k])))
            step_of.append(np.repeat(np.arange(count), per_step[:, k]))
        together = np.concatenate(rows)[np.argsort(np.concatenate(step_of), kind="stable")]
        mine = together.reshape(count, size)[:, rank::world_size]  # full steps: size rows each, dealt in turn
        return group_by_shard(mine, self.offsets)

    # ------------------------------------------------------------------ plans and counters

    def _change_at(self, epoch: int, position: int) -> WeightChange:
        """The weight change in force at ``position`` of ``epoch``."""
        current = self.changes[0]
        for change in self.changes[1:]:
            if change.at <= (epoch, position):
                current = change
        return current

    def _plan(self, epoch: int, position: int) -> _Plan:
        """How the rest of ``epoch`` from the last weight change at or before ``position`` is split."""
        change = self._change_at(epoch, position)
        n = self.num_rows
        if change.epoch == epoch:
            length = n - change.position
            return _Plan(change.position, length, change.counters, tuple(apportion(length, change.weights)))
        done, then = self._since(change, epoch - change.epoch), self._since(change, epoch - change.epoch + 1)
        return _Plan(0, n, tuple(c + d for c, d in zip(change.counters, done)), tuple(b - a for a, b in zip(done, then)))

    def _since(self, change: WeightChange, j: int) -> tuple[int, ...]:
        """Each source's rows from ``change`` to the start of the ``j``-th epoch after the change's own (``j >= 1``):
        the cumulative split of those rows, epoch boundary by epoch boundary (:func:`monotone_apportion`); in
        closed form where no source's share is under a row an epoch (largest remainders then never lower a count)."""
        n = self.num_rows
        whole = sum(change.weights)
        if all(n * w >= whole for w in change.weights):  # every share grows by a row or more an epoch: never lowered
            return tuple(apportion(j * n - change.position, change.weights))
        with self._lock:
            known = self._since_change.setdefault(change.at, [])
            while len(known) < j:
                previous = known[-1] if known else (0,) * len(self.names)
                known.append(tuple(monotone_apportion(previous, (len(known) + 1) * n - change.position, change.weights)))
            return known[j - 1]

    def _trajectory(self, epoch: int, start: int, size: int) -> _Trajectory:
        """The counters at each step boundary of a pass over ``epoch`` from ``start``, ``size`` rows a step."""
        key = ("trajectory", epoch, start, size)
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            return found
        counters = list(self.counters(epoch, start, size))
        bounds, positions = [tuple(counters)], [start]
        position = start
        plan: _Plan | None = None
        replan = start  # the plan changes only where the weights do
        changes = sorted(c.position for c in self.changes if c.epoch == epoch and c.position > start)
        while position < self.num_rows:
            if position >= replan:
                plan = self._plan(epoch, position)
                replan = next((p for p in changes if p > position), self.num_rows)
            assert plan is not None  # made at the first step (position == replan)
            rows = min(size, self.num_rows - position)
            if position + rows >= self.num_rows:  # the last step lands exactly on every quota
                counts = [f + q - c for f, q, c in zip(plan.first, plan.quota, counters)]
            else:
                counts = step_counts(rows, plan.quota, plan.length, plan.deficits(position, counters))
            counters = [c + d for c, d in zip(counters, counts)]
            position += rows
            bounds.append(tuple(counters))
            positions.append(position)
        trajectory = _Trajectory(np.asarray(positions, dtype=np.int64), np.asarray(bounds, dtype=np.int64).reshape(-1, len(self.names)))
        with self._lock:
            if len(self._cache) >= 8:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = trajectory
        return trajectory

    def counters(self, epoch: int, position: int = 0, size: int | None = None) -> tuple[int, ...]:
        """Every source's stream position at ``position`` of ``epoch``.

        Known at an epoch's start and end, at a weight change, at a position a
        loaded state named, at every step boundary of a pass computed so far and,
        given the global batch ``size``, at every step boundary of a pass of that
        size from the epoch's start (or the last weight change).
        """
        if (epoch, position) in self.anchors:
            return tuple(self.anchors[(epoch, position)])
        plan = self._plan(epoch, position)
        if position == plan.start:
            return plan.first
        if position == self.num_rows:
            return tuple(f + q for f, q in zip(plan.first, plan.quota))
        with self._lock:
            trajectories = [t for k, t in self._cache.items() if k[0] == "trajectory" and k[1] == epoch]
        if size is not None and position > plan.start:
            trajectories.append(self._trajectory(epoch, plan.start, size))
        for trajectory in reversed(trajectories):
            row = trajectory.row_of(position)
            if row is not None:
                return tuple(int(c) for c in trajectory.bounds[row])
        raise ValueError(
            f"position {position} of epoch {epoch} is not a step boundary this order has computed; "
            "positions come from consumed_after() of a pass, or from a loaded state"
        )

    # ------------------------------------------------------------------ rows

    def stream_rows(self, source: int, first: int, stop: int) -> np.ndarray:
        """Source ``source``'s own rows at stream positions ``[first, stop)`` (crossing passes)."""
        order, n = self.sources[source], self.sizes[source]
        parts = []
        while first < stop:
            p, offset = divmod(first, n)
            take = min(stop - first, n - offset)
            parts.append(order.positions(p, offset, offset + take))
            first += take
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def global_batch(self, epoch: int, step: int, world_size: int = 1, consumed: int = 0) -> np.ndarray:
        """The rows all ranks deliver in step ``step`` together, source by source, without padding."""
        trajectory = self._trajectory(epoch, consumed, self.batch_size * world_size)
        low, high = trajectory.bounds[step], trajectory.bounds[step + 1]
        return np.concatenate([self.base[k] + self.stream_rows(k, int(low[k]), int(high[k])) for k in range(len(self.names))])

    def batch(self, epoch: int, step: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> np.ndarray:
        """The mixture rows rank ``rank`` delivers in step ``step`` counted from position ``consumed``.

        The global batch's rows, source by source, are dealt to the ranks in turn,
        so each rank gets ``floor`` or ``ceil`` of ``1/world_size`` of each
        source's rows. In the last, partial step every rank gets
        ``ceil(rest / world_size)`` rows: the ranks dealt one row less are padded
        with one of the epoch's first rows. Rows come grouped by source and, within
        a source, by shard, so each source's rows are gathered together.
        """
        _check_world(world_size, rank)
        n = self.num_batches(world_size, consumed)
        if not 0 <= step < n:
            raise IndexError(f"step {step} is outside the {n} batches left in the epoch")
        rows = self.global_batch(epoch, step, world_size, consumed)
        mine = rows[rank::world_size]
        share = -(-len(rows) // world_size)
        if len(mine) < share:  # this rank is one row short in the last step
            short = rank - len(rows) % world_size  # its place among the short ranks
            pad_total = share * world_size - len(rows)
            first = self.counters(epoch, 0)
            pad = [self.base[k] + self.stream_rows(k, first[k], first[k] + c) for k, c in enumerate(apportion(pad_total, self._change_at(epoch, 0).weights))]
            mine = np.concatenate([mine, np.concatenate(pad)[short : short + 1]])
        return self._group_by_shard(mine)

    def batches(self, epoch: int, rank: int = 0, world_size: int = 1, consumed: int = 0) -> Iterator[np.ndarray]:
        """Every batch rank ``rank`` delivers from position ``consumed`` to the end of the epoch."""
        for step in range(self.num_batches(world_size, consumed)):
            yield self.batch(epoch, step, rank, world_size, consumed)

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's rows in the order one rank reads them (batch after batch, without padding)."""
        trajectory = self._trajectory(epoch, 0, self.batch_size)
        parts = [self.global_batch(epoch, s) for s in range(len(trajectory.bounds) - 1)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _group_by_shard(self, rows: np.ndarray) -> np.ndarray:
        if len(rows) <= 1:
            return rows
        return group_by_shard(rows, self.offsets)

    def shard_uses(self, epoch: int, world_size: int = 1, consumed: int = 0) -> list[tuple[int, int, int]]:
        """``(first step, last step, shard)`` for each use of a shard by the rest of the epoch, by first step.

        Shards are numbered in the concatenated shard list. A use covers every
        step that reads any row of the shard's window (``shuffle=True``) or of the
        shard (``shuffle=False``) in one pass of its source: a superset of what
        one rank reads. A small source's shards are used once per pass.
        """
        n = self.num_batches(world_size, consumed)
        if n == 0:
            return []
        trajectory = self._trajectory(epoch, consumed, self.batch_size * world_size)
        uses = []
        for k, order in enumerate(self.sources):
            starts = trajectory.bounds[: n + 1, k]
            uses.extend(self._stream_uses(k, order, starts, int(starts[0]), int(starts[-1]), 0))
        rest = self.num_rows - consumed - (n - 1) * self.batch_size * world_size
        if not self.drop_last and 0 < rest < self.batch_size * world_size and rest % world_size:
            pad = world_size - rest % world_size
            first = self.counters(epoch, 0)
            for k, c in enumerate(apportion(pad, self._change_at(epoch, 0).weights)):
                if c:
                    marks = np.asarray([first[k], first[k] + c], dtype=np.int64)
                    uses.extend(self._stream_uses(k, self.sources[k], marks, first[k], first[k] + c, n - 1))
        uses.sort()
        return uses

    def _stream_uses(self, k: int, order: Order, starts: np.ndarray, low: int, high: int, step0: int) -> list[tuple[int, int, int]]:
        """Uses of source ``k``'s shards by steps whose stream positions are ``[starts[s], starts[s + 1])``."""
        size = self.sizes[k]
        uses: list[tuple[int, int, int]] = []
        for p in range(low // size, -(-high // size)):
            for a, b, members in self._groups(order, p):
                lo, hi = max(p * size + a, low), min(p * size + b, high)
                if lo >= hi:
                    continue
                first = int(np.searchsorted(starts[1:], lo, side="right"))
                last = int(np.searchsorted(starts[:-1], hi, side="left")) - 1
                if first <= last:
                    uses.extend((step0 + first, step0 + last, self.shard_base[k] + int(s)) for s in members if order.shard_rows[s])
        return uses

    @staticmethod
    def _groups(order: Order, p: int) -> list[tuple[int, int, Sequence[int] | np.ndarray]]:
        """A source pass's windows (or shards): ``(first position, end position, shards)``."""
        if order.shuffle:
            shards, starts = order._windows(p)
            return [(int(starts[w]), int(starts[w + 1]), shards[w * order.window : (w + 1) * order.window]) for w in range(len(starts) - 1)]
        return [(int(order.offsets[s]), int(order.offsets[s + 1]), [s]) for s in range(len(order.shard_rows))]

    # ------------------------------------------------------------------ weights

    def set_weights(self, epoch: int, position: int, weights: Mapping[str, float]) -> None:
        """Use ``weights`` (by source name) from ``position`` of ``epoch`` on.

        ``position`` must be one whose counters are known (see :meth:`counters`:
        what ``consumed_after`` returns during a pass). Changes recorded for
        later positions are dropped: the new weights hold until changed again.
        """
        at = (int(epoch), int(position))
        counters = self.counters(*at)
        kept = tuple(c for c in self.changes if c.at < at)
        self.changes = kept + (WeightChange(at[0], at[1], self._fractions(weights), tuple(int(c) for c in counters)),)
        self.anchors = {k: v for k, v in self.anchors.items() if k <= at}
        with self._lock:
            self._cache.clear()

    def current_weights(self, epoch: int, position: int = 0) -> dict[str, float]:
        """The weights in force at ``position`` of ``epoch``, by source name."""
        return {n: float(w) for n, w in zip(self.names, self._change_at(epoch, position).weights)}

    # ------------------------------------------------------------------ resume state

    def state(self, epoch: int, consumed: int) -> dict:
        """What a checkpoint stores to resume at position ``consumed`` of ``epoch``.

        A few numbers: the position, one counter per source, the order's identity,
        and the weight history (one entry per change).
        """
        return {
            "epoch": int(epoch),
            "consumed": int(consumed),
            **self._identity(),
            "counters": dict(zip(self.names, (int(c) for c in self.counters(epoch, consumed)))),
            "weights": [c.to_json(self.names) for c in self.changes],
        }

    def _identity(self) -> dict:
        """What a state must share with this order to resume it."""
        return {"seed": self.seed, "shuffle": self.shuffle, "window": self.window, "num_rows": self.num_rows,
                "num_shards": sum(len(r) for r in self.shard_rows), "layout": self.layout, "sources": list(self.names)}

    def check_state(self, state: dict) -> tuple[int, int]:
        """Validate a state from :meth:`state` and adopt its counters and weight history; ``(epoch, consumed)``."""
        for key, value in self._identity().items():
            if key in state and state[key] != value:
                raise ValueError(
                    f"cannot resume: the saved state has {key}={state[key]!r} but this mixture has {key}={value!r}; "
                    "resuming needs the same sources (names and data), seed, shuffle, window and epoch length"
                )
        if "counters" not in state or "weights" not in state:
            raise ValueError("cannot resume a mixture from this state: it has no per-source counters (is it a single dataset's?)")
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if not 0 <= consumed <= self.num_rows:
            raise ValueError(f"cannot resume: position {consumed} is outside an epoch of {self.num_rows} rows")
        self.changes = tuple(WeightChange.from_json(c, self.names) for c in state["weights"])
        self.anchors[(epoch, consumed)] = tuple(int(state["counters"][n]) for n in self.names)
        with self._lock:
            self._cache.clear()
        return epoch, consumed

