"""The torch baseline every comparison uses: the best of four DataLoaders, each labelled with what it ran.

A torch user can fetch a batch two ways:

  per-sample  ``DataLoader(ds, batch_size=B, shuffle=True)``: ``__getitem__(i)``
              once per sample, then ``default_collate`` stacks them
  batch       ``DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), B, False),
              batch_size=None)``: ``__getitem__(list of B indices)`` once per
              batch; over a memmap that is one numpy fancy index

each at ``num_workers=0`` and ``num_workers=N`` (``persistent_workers=True``,
started and warmed before any clock runs where the caller says so). A ratio
"against torch" is always against the fastest of the four in the same run.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

WORKERS = os.cpu_count() or 2
CONFIGS = ["torch-0", f"torch-{WORKERS}", "torch-batch-0", f"torch-batch-{WORKERS}"]


def label(config: str) -> str:
    """``torch-batch-2`` -> a row label that says what ran."""
    parts = config.split("-")
    workers = parts[-1]
    if "batch" in parts:
        return f"torch DataLoader, batch __getitem__(list), num_workers={workers}"
    return f"torch DataLoader, per-sample __getitem__, num_workers={workers}"


def parse(config: str) -> tuple[bool, int]:
    """``(batch_fetch, num_workers)`` of a config name."""
    return "batch" in config.split("-"), int(config.split("-")[-1])


def is_torch(config: str) -> bool:
    return config.startswith("torch-")


def best(rates: dict[str, float]) -> tuple[str, float]:
    """The fastest torch config among ``rates`` (name, samples/s)."""
    name = max((c for c in rates if is_torch(c)), key=rates.__getitem__)
    return name, rates[name]


class MemmapDataset(torch.utils.data.Dataset):
    """The usual map-style Dataset over a .npy memmap: one sample per ``__getitem__(i)``."""

    def __init__(self, path: str, label: bool) -> None:
        self.path, self.label, self.data = path, label, None
        self.rows = len(np.load(path, mmap_mode="r"))

    def __len__(self) -> int:
        return self.rows

    def _array(self) -> np.ndarray:
        if self.data is None:  # opened lazily so each worker maps the file itself
            self.data = np.load(self.path, mmap_mode="r")
        return self.data

    def __getitem__(self, i: int) -> Any:
        x = torch.from_numpy(np.array(self._array()[i]))
        return (x, i) if self.label else x


class BatchMemmapDataset(MemmapDataset):
    """The same data, fetched a batch at a time: ``__getitem__(indices)`` is one fancy index on the memmap."""

    def __getitem__(self, indices: list[int]) -> Any:  # type: ignore[override]
        idx = np.asarray(indices, dtype=np.int64)
        x = torch.from_numpy(self._array()[idx])
        return (x, torch.from_numpy(idx)) if self.label else x


def loader(dataset: torch.utils.data.Dataset, batch: int, workers: int, batch_fetch: bool, num_samples: int | None = None,
           **kwargs: Any) -> torch.utils.data.DataLoader:
    """A shuffled DataLoader of either kind (persistent workers when there are any).

    ``num_samples``: a pass reads that many random samples, not the whole dataset.
    """
    common: dict[str, Any] = dict(num_workers=workers, persistent_workers=workers > 0, **kwargs)
    order = torch.utils.data.RandomSampler(dataset, num_samples=num_samples)
    if batch_fetch:
        sampler = torch.utils.data.BatchSampler(order, batch, drop_last=False)
        return torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, **common)
    return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=order, **common)


def memmap_loader(path: str, label: bool, batch: int, config: str, num_samples: int | None = None) -> torch.utils.data.DataLoader:
    """The DataLoader ``config`` names over the .npy file ``path``."""
    batch_fetch, workers = parse(config)
    dataset = (BatchMemmapDataset if batch_fetch else MemmapDataset)(path, label)
    return loader(dataset, batch, workers, batch_fetch, num_samples)
