"""The gather stage: the rows of one batch, read from the mapped shards into the batch's own memory.

Fixed-size columns land in blocks from the Loader's :class:`Arena` (one
native call for all of them, GIL released), variable-size columns come back
decoded for the whole batch (``chute.format.columns``). The result is the
batch as the training loop sees it without a transform: a dict of column name
to a tensor ``[rows, ...]`` or a list (Arrow array with ``columnar=True``),
in the dataset's column order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chute._arena import Arena
from chute.format.reader import Dataset


class Gather:
    """Reads batches of ``dataset`` into blocks of ``pool``."""

    def __init__(self, dataset: Dataset, pool: Arena, columnar: bool = False) -> None:
        self.dataset, self.pool, self.columnar = dataset, pool, columnar
        fixed = dataset.fixed_columns
        self.fixed_names = [name for name, _, _, _ in fixed]
        self.shapes = [shape for _, shape, _, _ in fixed]
        self.dtypes = [dtype for _, _, dtype, _ in fixed]
        # torch dtypes numpy lacks (bfloat16): the block is built as its storage dtype, then viewed
        self.views = [(j, t) for j, (_, _, d, t) in enumerate(fixed) if _needs_view(d, t)]
        self.count = len(fixed)
        self._cached: tuple[int, tuple] = (-1, ())  # (rows, block keys): one object, thread-safe
        self.variable_names = dataset.variable_columns
        names = dataset.schema.names
        self.reorder = names if names != self.fixed_names + self.variable_names else None

    def __call__(self, indices: np.ndarray, n: int) -> dict[str, Any]:
        """The batch of rows ``indices`` (``n`` of them)."""
        rows, keys = self._cached
        if n != rows:  # a new batch size (the first batch, the last one of an epoch)
            keys = tuple(((n, *shape), dtype) for shape, dtype in zip(self.shapes, self.dtypes))
            self._cached = (n, keys)
        arrays, tensors = self.pool.take_all(keys, self.count)
        values = self.dataset.read(indices, arrays, self.columnar)
        for j, dtype in self.views:
            tensors[j] = tensors[j].view(dtype)
        batch = dict(zip(self.fixed_names, tensors))
        if values:
            batch.update(zip(self.variable_names, values))
            if self.reorder is not None:
                batch = {name: batch[name] for name in self.reorder}
        return batch


def _needs_view(dtype: np.dtype, torch_dtype: Any) -> bool:
    """Whether a block built as numpy ``dtype`` must be viewed as ``torch_dtype`` (numpy has no bfloat16)."""
    import torch

    return torch.from_numpy(np.empty(0, dtype)).dtype != torch_dtype
