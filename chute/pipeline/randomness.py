"""Randomness as a function of position: every random choice of a transform from ``(seed, epoch, sample)``.

A transform's random numbers for a sample are computed
from the Loader's seed, the epoch and the sample's dataset row, never drawn
from a generator that advances as batches are built. So the same sample in the
same epoch gets the same crop, flip and noise whatever the number of threads,
thread or process workers, the world size, or a resume in between.

Two ways in:

* :func:`uniform` (``BatchContext.random`` for batch-level transforms): ``k``
  numbers in [0, 1) per sample of a batch, vectorised: splitmix64 (the mixing
  of ``chute.order``) of a key from ``(seed, epoch, stream)`` and ``row * k + j``.
* :func:`sample_rng` and :func:`sample_seed`, for a per-sample ``transform``
  function: while the Loader runs it on a sample, they give a numpy
  ``Generator`` (Philox, keyed by the sample) and the 64-bit seed behind it
  (for ``torch.Generator().manual_seed(...)`` or ``random.Random(...)``).
  The per-sample loop publishes the sample's row in a :class:`SampleScope`
  (one attribute store per sample); the generator is only built when asked
  for (docs/benchmarks.md, design figures, has what each costs).
"""

from __future__ import annotations

import contextvars

import numpy as np

from chute.errors import ChuteError
from chute.order import _key, _mix

#: 2**-53: the spacing of float64 values in [0, 1) built from the top 53 bits.
_UNIT = 1.0 / (1 << 53)
#: Purposes mixed into the keys, so the batch numbers and the per-sample seeds never coincide.
_BATCH, _SAMPLE = 0x62617463, 0x73616D70


def uniform(seed: int, epoch: int, rows: np.ndarray, k: int, stream: int = 0) -> np.ndarray:
    """``float64[len(rows), k]`` in [0, 1): column ``j`` of row ``i`` depends only on ``(seed, epoch, stream, rows[i], j)``.

    ``stream`` separates independent users of the same samples (two transforms
    of one batch). Vectorised numpy, GIL released.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    key = np.uint64(_key(seed, epoch, _BATCH, stream))
    counters = np.asarray(rows, dtype=np.int64).astype(np.uint64)[:, None] * np.uint64(max(k, 1))
    counters = counters + np.arange(k, dtype=np.uint64)[None, :]
    bits = _mix(_mix(counters, key), key)
    return (bits >> np.uint64(11)).astype(np.float64) * _UNIT


def seed_of(seed: int, epoch: int, row: int) -> int:
    """The 64-bit seed of sample ``row`` in ``epoch`` (what :func:`sample_seed` returns)."""
    return _key(seed, epoch, _SAMPLE, row)


class SampleScope:
    """Which sample a per-sample transform is running on, in this thread: ``(seed, epoch, rows[j])``.

    The per-sample loop sets ``seed``, ``epoch`` and ``rows`` once per batch
    and ``j`` for each sample; ``j = -1`` outside a sample.
    """

    __slots__ = ("seed", "epoch", "rows", "j")

    def __init__(self) -> None:
        self.seed, self.epoch, self.rows, self.j = 0, 0, (), -1

    def seed_now(self) -> int:
        if self.j < 0:
            raise ChuteError(
                "chute.sample_rng() and chute.sample_seed() work inside a Loader's per-sample transform (transform=fn), "
                "while it runs on a sample; a batch-level transform uses ctx.random(k)"
            )
        return seed_of(self.seed, self.epoch, self.rows[self.j])


#: The scope of the calling thread (a context variable: each thread, worker process included, has its own).
_scope: contextvars.ContextVar[SampleScope] = contextvars.ContextVar("chute_sample_scope")


def scope() -> SampleScope:
    """This thread's :class:`SampleScope`, created on first use (by the per-sample loop)."""
    try:
        return _scope.get()
    except LookupError:
        current = SampleScope()
        _scope.set(current)
        return current


def sample_seed() -> int:
    """The 64-bit seed of the sample the calling per-sample transform runs on.

    A function of ``(Loader seed, epoch, dataset row)`` only: the same sample
    gets the same seed in the same epoch whatever the thread count, worker
    kind, world size or resume. For ``torch.Generator().manual_seed(chute.sample_seed())``.
    """
    try:
        current = _scope.get()
    except LookupError:
        current = SampleScope()
    return current.seed_now()


def sample_rng() -> np.random.Generator:
    """A numpy ``Generator`` for the sample the calling per-sample transform runs on (see :func:`sample_seed`).

    Built on each call, which costs more than drawing from it: call it once per sample and draw from it.
    """
    return np.random.Generator(np.random.Philox(key=sample_seed()))
