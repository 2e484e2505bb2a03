"""What ``Loader`` and ``TorchIterable`` share: the dataset, its order, the batch functions, the rank.

Both classes take these arguments with the same names, defaults and checks;
:meth:`LoaderSpec.of` is the one place they are validated and turned into the
opened dataset, its :class:`chute.order.Order` and the user's functions, so the
two constructors cannot drift (``tests/pipeline/test_spec.py`` also compares
their signatures with :data:`COMMON`). The Loader adds its own settings
(workers, device, watchdog, columnar) on top.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from chute.order import Order
from chute.pipeline.config import Shuffle, check_batch_size, check_seed, check_shuffle
from chute.pipeline.transform import Functions

#: The arguments both constructors take, with their defaults (``dataset`` and ``batch_size`` are required).
COMMON: dict[str, Any] = {
    "shuffle": False,
    "seed": 0,
    "drop_last": False,
    "transform": None,
    "batch_transform": None,
    "collate": None,
    "on_error": "raise",
    "rank": None,
    "world_size": None,
}


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """The validated common settings: the opened dataset and its order, the functions, this rank's place."""

    dataset: Any
    order: Order
    batch_size: int
    shuffle: Shuffle | None
    fns: Functions
    rank: int
    world_size: int

    @classmethod
    def of(
        cls,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool | Shuffle = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[dict[str, Any]], Any] | Any | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        on_error: str = "raise",
        rank: int | None = None,
        world_size: int | None = None,
    ) -> LoaderSpec:
        """Check the arguments (each error names the argument and what it takes) and open the dataset."""
        batch_size = check_batch_size(batch_size)
        checked_shuffle = check_shuffle(shuffle)
        seed = check_seed(seed)
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be True or False, got {drop_last!r}")
        opened, order = dataset_and_order(dataset, batch_size, checked_shuffle, seed, drop_last)
        fns = Functions(transform, batch_transform, collate, on_error)
        rank, world_size = distributed_defaults(rank, world_size)
        return cls(opened, order, batch_size, checked_shuffle, fns, rank, world_size)


def distributed_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments, else torch.distributed's, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) and world_size >= 1, got rank={rank}, world_size={world_size}")
    return rank, world_size


def dataset_and_order(dataset: Any, batch_size: int, shuffle: Shuffle | None, seed: int, drop_last: bool) -> tuple[Any, Order]:
    """The dataset (opened if given as a path) and the order of its rows for these settings."""
    if isinstance(dataset, (str, os.PathLike)):
        from chute.storage.open import open_dataset

        dataset = open_dataset(dataset)
    elif not hasattr(dataset, "read") and not hasattr(dataset, "order"):
        raise TypeError(
            f"the dataset must be a chute.Dataset (chute.open(path)), a path or URL, or chute.mix(...), "
            f"got {type(dataset).__name__}; to convert other data, see chute.write and `chute convert`"
        )
    window = shuffle.window if shuffle is not None else Shuffle().window
    make = getattr(dataset, "order", None)
    if callable(make):  # a mixture makes its own order
        return dataset, make(batch_size, shuffle is not None, seed, window, drop_last)
    order = Order(tuple(s.rows for s in dataset.shards), batch_size, shuffle is not None, seed, window, drop_last)
    return dataset, order
