"""What ``Loader`` and ``TorchIterable`` share, written once: the arguments after the dataset and batch size.

:class:`Options` names them and their types (both constructors take them as
``**options: Unpack[Options]``, so type checkers and editors see each one),
:data:`DEFAULTS` gives their defaults, and :meth:`LoaderSpec.of` is the one
place they are validated and turned into the opened dataset, its
:class:`chute.order.Order`, the user's functions and stages, so the two
constructors cannot drift (``tests/pipeline/test_spec.py``). The Loader adds
its own settings (workers, device, watchdog, columnar) on top; an argument
neither takes is refused with what chute calls it (``config.refuse_habits``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from chute.order import Order
from chute.pipeline.config import Shuffle, check_batch_size, check_seed, check_shuffle
from chute.pipeline.stage import Stage, batch_stages
from chute.pipeline.transform import Functions


class Options(TypedDict, total=False):
    """The arguments ``chute.Loader`` and ``chute.TorchIterable`` share (see ``chute.Loader`` for each)."""

    shuffle: bool | Shuffle
    seed: int
    drop_last: bool
    transform: Callable[[dict[str, Any]], Any] | Any | None
    batch_transform: Callable[[Any], Any] | None
    collate: Callable[[list[Any]], Any] | None
    on_error: str
    stages: Sequence[Stage] | None
    rank: int | None
    world_size: int | None


#: The default of every option (the keys are :class:`Options`' names).
DEFAULTS: dict[str, Any] = {
    "shuffle": False,
    "seed": 0,
    "drop_last": False,
    "transform": None,
    "batch_transform": None,
    "collate": None,
    "on_error": "raise",
    "stages": None,
    "rank": None,
    "world_size": None,
}


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """The validated common settings: the opened dataset and its order, the functions and stages, this rank's place."""

    dataset: Any
    order: Order
    batch_size: int
    shuffle: Shuffle | None
    fns: Functions
    stages: tuple[Stage, ...]
    rank: int
    world_size: int

    @classmethod
    def of(cls, dataset: Any, batch_size: int, options: dict[str, Any]) -> LoaderSpec:
        """Check the arguments (each error names the argument and what it takes) and open the dataset.

        ``options`` holds the :class:`Options` given (the others take their
        :data:`DEFAULTS`); any other key is left in it for the caller to refuse.
        """
        given = {name: options.pop(name) for name in list(options) if name in DEFAULTS}
        o = {**DEFAULTS, **given}
        batch_size = check_batch_size(batch_size)
        checked_shuffle = check_shuffle(o["shuffle"])
        seed = check_seed(o["seed"])
        if not isinstance(o["drop_last"], bool):
            raise TypeError(f"drop_last must be True or False, got {o['drop_last']!r}")
        opened, order = dataset_and_order(dataset, batch_size, checked_shuffle, seed, o["drop_last"])
        fns = Functions(o["transform"], o["batch_transform"], o["collate"], o["on_error"])
        stages = tuple(batch_stages(o["stages"]))
        rank, world_size = distributed_defaults(o["rank"], o["world_size"])
        return cls(opened, order, batch_size, checked_shuffle, fns, stages, rank, world_size)


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
