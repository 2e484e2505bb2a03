"""What a Loader is asked to do: small, validated, declarative settings (no threads, no files).

``chute.Loader`` takes a handful of arguments; the settings that belong
together are grouped in these classes so the signature stays short:

* :class:`Shuffle`: the order's shuffle window (``shuffle=True`` means ``Shuffle()``);
* :class:`Workers`: threads or processes, how many, how far ahead (default: autotuned threads);
* :class:`Watchdog`: how long the training loop may wait for one batch, and what then.

:func:`check_loader_args` turns the arguments a user passes into these, with a
message that says what to write instead of a value chute cannot take
(including the DataLoader argument names people carry over).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from chute.order import DEFAULT_WINDOW

#: DataLoader argument names and what chute calls them.
DATALOADER_HABITS = {
    "num_workers": "workers=chute.Workers(count=N) (threads by default; workers=chute.Workers('processes', count=N) for processes)",
    "pin_memory": "device='cuda' (batches are built in pinned memory and copied on a side stream)",
    "collate_fn": "collate=",
    "prefetch_factor": "workers=chute.Workers(prefetch=N) (batches in flight in total, autotuned by default)",
    "persistent_workers": "nothing: thread workers cost nothing to start, and process workers are kept across epochs",
    "sampler": "shuffle=, seed= and the rank/world_size arguments (chute's global order replaces samplers)",
    "batch_sampler": "batch_size=, shuffle=, seed= and drop_last= (chute's global order replaces samplers)",
    "worker_init_fn": "nothing: use a transform object that sets itself up on first use",
    "timeout": "watchdog=chute.Watchdog(timeout=seconds)",
    "generator": "seed=",
    "num_threads": "workers=chute.Workers(count=N)",
    "prefetch": "workers=chute.Workers(prefetch=N)",
    "stall_timeout": "watchdog=seconds or watchdog=chute.Watchdog(timeout=seconds, on_stall=...)",
    "on_stall": "watchdog=chute.Watchdog(on_stall='raise')",
    "window": "shuffle=chute.Shuffle(window=N)",
    "progressive": "chute.open(url, progressive=True, cache_limit=...)",
    "max_threads": "workers=chute.Workers(max_count=N)",
    "max_prefetch_bytes": "workers=chute.Workers(max_prefetch_bytes=N)",
}


def positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    """``value`` as an int >= 1, refusing floats, strings and bools (no silent coercion)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """Shuffle settings: shards are permuted, then samples within windows of ``window`` shards.

    A larger window mixes more (and needs more shards resident at once, which
    matters for a remote dataset's cache).
    """

    window: int = DEFAULT_WINDOW

    def __post_init__(self) -> None:
        positive_int(self.window, "Shuffle(window=...)")


@dataclasses.dataclass(frozen=True)
class Workers:
    """Who builds the batches, how many, and how far ahead.

    Args:
        kind: ``"threads"`` (default: the gather and decoding release the GIL)
            or ``"processes"`` for transforms that hold the GIL (spawned worker
            processes, module-level functions; see docs/loader.md).
        count: threads or processes. ``None``: threads are autotuned, starting
            at one, or at one per CPU for a transform whose work runs without the
            GIL (``chute.images``' decoders; docs/observe.md); processes default to
            the CPU count, at most 8.
        prefetch: batches in flight ahead of the training loop. ``None``: 16 (fewer
            if 16 batches would not fit ``max_prefetch_bytes``, at least 2 per
            worker), then autotuned (threads) within ``max_prefetch_bytes``.
        max_count: the most threads the autotuner may run (default: 4 per CPU this process may run
            on, at least 16); its CPU budget is the CPU time the process really uses, against those CPUs.
        max_prefetch_bytes: the autotuner's memory budget for batches in flight (default 512 MiB).
    """

    kind: str = "threads"
    count: int | None = None
    prefetch: int | None = None
    max_count: int | None = None
    max_prefetch_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("threads", "processes"):
            raise ValueError(f"Workers kind must be 'threads' or 'processes', got {self.kind!r}")
        positive_int(self.count, "Workers(count=...)", allow_none=True)
        positive_int(self.prefetch, "Workers(prefetch=...)", allow_none=True)
        positive_int(self.max_count, "Workers(max_count=...)", allow_none=True)
        positive_int(self.max_prefetch_bytes, "Workers(max_prefetch_bytes=...)", allow_none=True)

    @classmethod
    def of(cls, value: Workers | str | int | None) -> Workers:
        """``workers=`` as given to the Loader: a Workers, ``"threads"``/``"processes"``, a thread count, or None."""
        if value is None:
            return cls()
        if isinstance(value, Workers):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return cls(count=positive_int(value, "workers"))
        raise TypeError(
            f"workers must be chute.Workers(...), 'threads', 'processes' or a number of threads, got {type(value).__name__} {value!r}"
        )


@dataclasses.dataclass(frozen=True)
class Watchdog:
    """The hang watchdog: how long the loop may wait in ``next()`` for one batch, and what happens then.

    Args:
        timeout: seconds, or ``"auto"`` (300 s for the first batch of a pass,
            then ``max(60 s, 20 x the 95th percentile of recent waits)``).
        on_stall: ``"warn"`` (write the report to stderr and the ``"chute"``
            logger, keep waiting, report again a timeout later) or ``"raise"``
            (raise :class:`chute.StallError` carrying the report).
    """

    timeout: float | str = "auto"
    on_stall: str = "warn"

    def __post_init__(self) -> None:
        if self.on_stall not in ("warn", "raise"):
            raise ValueError(f"on_stall must be 'warn' or 'raise', got {self.on_stall!r}")
        if self.timeout != "auto":
            if isinstance(self.timeout, bool) or not isinstance(self.timeout, numbers.Real):
                raise ValueError(f"the watchdog timeout must be a number of seconds or 'auto', got {self.timeout!r}")
            if not self.timeout > 0:
                raise ValueError(f"the watchdog timeout must be positive (watchdog=None turns it off), got {self.timeout!r}")

    @classmethod
    def of(cls, value: Watchdog | float | str | None) -> Watchdog | None:
        """``watchdog=`` as given to the Loader: a Watchdog, seconds, ``"auto"`` or None (off)."""
        if value is None or isinstance(value, Watchdog):
            return value
        return cls(timeout=value)


def check_batch_size(batch_size: Any) -> int:
    checked = positive_int(batch_size, "batch_size")
    assert checked is not None  # None only with allow_none
    return checked


def check_shuffle(shuffle: Any) -> Shuffle | None:
    """``shuffle=`` as given: a bool or a :class:`Shuffle`; None when not shuffling."""
    if isinstance(shuffle, Shuffle):
        return shuffle
    if isinstance(shuffle, (bool, numbers.Integral)) and shuffle in (0, 1):
        return Shuffle() if shuffle else None
    raise TypeError(f"shuffle must be True, False or chute.Shuffle(window=...), got {type(shuffle).__name__} {shuffle!r}")


def check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    return int(seed)


def refuse_habits(kwargs: dict[str, Any], where: str = "chute.Loader") -> None:
    """A TypeError for arguments ``where`` does not take, saying what chute calls them."""
    if not kwargs:
        return
    lines = []
    for name in kwargs:
        instead = DATALOADER_HABITS.get(name)
        lines.append(f"{name}=: chute's Loader takes {instead}" if instead else f"{name}=: not an argument of {where}")
    raise TypeError(f"{where} got unexpected argument(s): " + "; ".join(lines) + " (see docs/loader.md)")
