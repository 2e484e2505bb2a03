"""``TorchIterable``: a chute dataset as a torch ``IterableDataset`` of whole batches.

For code that wants a plain ``torch.utils.data.DataLoader`` (Lightning, the HF
Trainer)::

    batches = chute.TorchIterable(ds, batch_size=256, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=4)

Each item is one batch in chute's global order. DataLoader worker ``w`` of ``n``
builds steps ``w, w + n, w + 2n, ...``; the DataLoader takes one item from each
worker in turn, so the stream is the same whatever ``num_workers`` is. Call
``set_epoch`` before each epoch (with ``persistent_workers=False``, the default,
the workers see it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from chute.format.reader import Dataset
from chute.pipeline.config import Shuffle, check_batch_size, check_seed, check_shuffle
from chute.pipeline.loader import dataset_and_order, distributed_defaults
from chute.pipeline.transform import Functions, Transform


class TorchIterable(torch.utils.data.IterableDataset):
    """Batches of a chute dataset, for ``DataLoader(..., batch_size=None)``."""

    def __init__(
        self,
        dataset: Dataset | str | os.PathLike,
        batch_size: int,
        *,
        shuffle: bool | Shuffle = False,
        seed: int = 0,
        drop_last: bool = False,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
    ) -> None:
        self.dataset, self.order = dataset_and_order(dataset, check_batch_size(batch_size), check_shuffle(shuffle), check_seed(seed), drop_last)
        self.fns = Functions(transform, batch_transform, collate, on_error)
        self.rank, self.world_size = distributed_defaults(rank, world_size)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.order.num_batches(self.world_size)

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        # fresh tensors (no reused blocks): the DataLoader moves them to shared memory to send them
        transform = None if self.fns.identity else Transform(self.fns, self.dataset, None, self.order.seed)
        progress = [-1]
        for step in range(worker, len(self), workers):
            indices = self.order.batch(self.epoch, step, self.rank, self.world_size)
            batch = self.dataset.get_batch(indices)
            if transform is not None:
                batch, _ = transform(batch, indices, self.epoch, progress, 0)
            if batch is not None:
                yield batch
