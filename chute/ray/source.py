"""``chute.ray.read``: a chute dataset as a Ray Dataset, one read task per group of shards.

Each read task opens the dataset from its (pickled) manifest in the worker and
reads its shards with chute's reader: memory-mapped where the dataset is local
(on a cluster: a shared file system), through the node's chute cache where it is
remote, so each node downloads a shard once. Rows come out as Ray blocks of at
most about ``block_bytes``: tensor and scalar columns as numpy arrays (Ray's
tensor type), other columns as chute decodes them (bytes, str, dicts, arrays).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import ray
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from chute.format.reader import Dataset
from chute.format.schema import FIXED_SIZE
from chute.storage.open import open_dataset

DEFAULT_BLOCK_BYTES = 64 << 20


class ChuteDatasource(Datasource):
    """A Ray Data Datasource over an open chute :class:`~chute.Dataset` (local or remote)."""

    def __init__(self, dataset: Dataset, *, shards_per_task: int | None = None, block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        super().__init__()
        self.dataset = dataset
        self.shards_per_task = shards_per_task
        self.block_bytes = max(1, int(block_bytes))

    def estimate_inmemory_data_size(self) -> int | None:
        return self.dataset.nbytes

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[ReadTask]:
        shards = self.dataset.shards
        n = len(shards)
        if n == 0:
            return []
        per_task = self.shards_per_task or max(1, -(-n // max(1, parallelism)))
        tasks = []
        for first in range(0, n, per_task):
            group = range(first, min(n, first + per_task))
            rows = sum(shards[i].rows for i in group)
            metadata = BlockMetadata(
                num_rows=rows, size_bytes=sum(shards[i].bytes for i in group), input_files=None, exec_stats=None
            )
            read = _ReadShards(self.dataset, group.start, group.stop, self.block_bytes)
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks

    def get_name(self) -> str:
        return "ChuteRead"


class _ReadShards:
    """A read task's work: shards ``[first, stop)`` of ``dataset`` as blocks."""

    def __init__(self, dataset: Dataset, first: int, stop: int, block_bytes: int) -> None:
        self.dataset, self.first, self.stop, self.block_bytes = dataset, first, stop, block_bytes

    def __call__(self) -> Iterator[Block]:
        ds = self.dataset
        row_bytes = max(1, ds.nbytes // max(1, len(ds)))
        step = max(1, self.block_bytes // row_bytes)
        try:
            for a in range(int(ds.offsets[self.first]), int(ds.offsets[self.stop]), step):
                b = min(a + step, int(ds.offsets[self.stop]))
                yield _to_block(ds, ds.get_batch(np.arange(a, b)))
        finally:
            ds.close()


def _to_block(ds: Dataset, batch: Mapping[str, Any]) -> Block:
    columns: dict[str, np.ndarray] = {}
    for name, ctype in ds.schema:
        values = batch[name]
        if isinstance(ctype, FIXED_SIZE):
            columns[name] = values.numpy()
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = [v.numpy() if hasattr(v, "numpy") else v for v in values]
            columns[name] = array
    return BlockAccessor.batch_to_block(columns)


def read(
    path: str | os.PathLike | Dataset,
    *,
    shards_per_task: int | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    cache_dir: str | os.PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ray.data.Dataset:
    """A Ray Dataset of the chute dataset at ``path`` (a directory, a URL, or an open dataset).

    One read task per ``shards_per_task`` consecutive shards (default: spread the
    shards over Ray's read parallelism); rows keep the dataset's order within a
    task. The manifest is read here; the shards are read by the tasks, a remote
    dataset's through the chute cache ``cache_dir`` of the node each task runs on.
    """
    dataset = path if isinstance(path, Dataset) else open_dataset(path, cache_dir=cache_dir, storage_options=storage_options)
    return ray.data.read_datasource(ChuteDatasource(dataset, shards_per_task=shards_per_task, block_bytes=block_bytes))
