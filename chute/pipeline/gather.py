"""The gather stage: the rows of one batch, read from the mapped shards into the batch's own memory.

:class:`Gather` (``read`` in the report) is the first stage on the workers.
Fixed-size columns land in blocks from the Loader's :class:`Arena` (one
native call for all of them, GIL released), variable-size columns come back
decoded for the whole batch (``chute.format.columns``). The result is the
batch as the training loop sees it without a transform: a dict of column name
to a tensor ``[rows, ...]`` or a list (Arrow array with ``columnar=True``),
in the dataset's column order. Over a token sequence view
(``chute.tokens.sequences``) the same call packs the sequences (the view's
``read`` is one native call per batch too), and the stage is ``pack``: token
packing is a row of the report of its own.

:class:`ShardWait` comes before it for a remote dataset: it waits until the
pass's downloader holds the batch's shards, and the runtime counts that time
as the gather's ``wait_in`` (the report then blames the downloads, not the
reading). :func:`shard_uses` says which shards a pass reads when, for the
downloader.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chute.format.reader import Dataset
from chute.pipeline.stage import BatchStage


def gather_name(dataset: Any) -> str:
    """The gather's name (its report row): ``pack`` over a token sequence view (the read packs the
    sequences: ``chute.tokens.sequences``), else ``read``."""
    return "pack" if hasattr(dataset, "seq_len") and hasattr(dataset, "pack") else "read"


class Gather(BatchStage):
    """Reads the rows ``ctx.indices`` of ``dataset`` into blocks of ``ctx.pool``."""

    _builtin = True
    gathers = True  # the stage that makes the batch (the runtime counts its bytes)

    def __init__(self, dataset: Dataset, columnar: bool = False) -> None:
        super().__init__(name=gather_name(dataset), where="workers", gil=False)
        self.dataset, self.columnar = dataset, columnar
        fixed = dataset.fixed_columns
        self.fixed_names = [name for name, _, _, _ in fixed]
        self.shapes = [shape for _, shape, _, _ in fixed]
        self.dtypes = [dtype for _, _, dtype, _ in fixed]
        # torch dtypes numpy lacks (bfloat16): the block is built as its storage dtype, then viewed
        self.views = [(j, t) for j, (_, _, d, t) in enumerate(fixed) if _needs_view(d, t)]
        self.count = len(fixed)
        self.row_bytes = sum(_shape_bytes(shape, dtype) for shape, dtype in zip(self.shapes, self.dtypes))
        self._cached: tuple[int, tuple] = (-1, ())  # (rows, block keys): one object, thread-safe
        self.variable_names = dataset.variable_columns
        names = dataset.schema.names
        self.reorder = names if names != self.fixed_names + self.variable_names else None

    def map(self, batch: Any, ctx: Any) -> dict[str, Any]:
        """The batch of rows ``ctx.indices`` (``batch`` is None: this is the first stage)."""
        indices = ctx.indices
        n = indices.size  # (an attribute: no call on the hot path)
        rows, keys = self._cached
        if n != rows:  # a new batch size (the first batch, the last one of an epoch)
            keys = tuple(((n, *shape), dtype) for shape, dtype in zip(self.shapes, self.dtypes))
            self._cached = (n, keys)
        arrays, tensors = ctx.pool.take_all(keys, self.count)
        values = self.dataset.read(indices, arrays, self.columnar)
        for j, dtype in self.views:
            tensors[j] = tensors[j].view(dtype)
        out = dict(zip(self.fixed_names, tensors))
        if values:
            out.update(zip(self.variable_names, values))
            if self.reorder is not None:
                out = {name: out[name] for name in self.reorder}
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cached": (-1, ())}


class ShardWait(BatchStage):
    """Waits until ``fetcher`` (the pass's downloader) holds the shards of the batch; counted as the gather's ``wait_in``."""

    _builtin = True
    waits = True  # the runtime counts its time as waiting, not work

    def __init__(self, fetcher: Any, dataset: Any) -> None:
        super().__init__(name=gather_name(dataset), where="workers", gil=False)
        self.fetcher, self.dataset = fetcher, dataset

    def map(self, batch: Any, ctx: Any) -> Any:
        self.fetcher.wait(ctx.step, self.dataset.shards_of(ctx.indices))
        return batch


def shard_uses(dataset: Any, order: Any, epoch: int, world_size: int, start: int) -> list[tuple[int, int, int]]:
    """``(first step, last step, shard)`` for every shard a pass over ``epoch`` from ``start`` reads.

    A view whose shards also read other shards (``dataset.reads(shard)``: the
    windows of a token sequence view run into the next shards) holds each read
    shard as long as the shard it reads for.
    """
    uses = order.shard_uses(epoch, world_size, start)
    reads = getattr(dataset, "reads", None)
    if reads is None:
        return uses
    return [(first, last, read) for first, last, shard in uses for read in reads(shard)]


def _needs_view(dtype: np.dtype, torch_dtype: Any) -> bool:
    """Whether a block built as numpy ``dtype`` must be viewed as ``torch_dtype`` (numpy has no bfloat16)."""
    import torch

    return torch.from_numpy(np.empty(0, dtype)).dtype != torch_dtype


def _shape_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n
