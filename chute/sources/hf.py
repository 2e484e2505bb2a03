"""Convert a Hugging Face ``datasets.Dataset`` (in memory or saved with ``save_to_disk``).

The dataset's Arrow table is read in row order (after any ``select``/``shuffle``,
whose index mapping is applied) one batch at a time, and its columns map onto
chute columns as in :mod:`chute.sources._arrow`; an ``Image`` (or ``Audio``)
feature becomes the encoded file's bytes. The features are kept in the
metadata (``ds.metadata["hf_features"]``) and the names of ``ClassLabel``
columns in ``ds.metadata["class_names"]`` (column name -> names).

``datasets`` is imported only when this converter runs (``pip install 'chute[datasets]'``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

import chute
from chute.errors import ChuteError
from chute.sources._arrow import (
    ROWS_PER_SLICE,
    batch_samples,
    needs_shape_scan,
    number_batches,
    plan_columns,
    scan_shapes,
    to_jsonable,
)
from chute.sources._progress import Progress
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
"""Files ``save_to_disk`` writes; a directory holding one is a saved Hugging Face dataset."""


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ChuteError(
            "converting a Hugging Face dataset needs the `datasets` package: "
            "pip install 'chute[datasets]' (or pip install datasets)"
        ) from None
    return datasets


def load_hf(src: Any, split: str | None) -> tuple[Any, str, str | None]:
    """``(datasets.Dataset, description for messages, split)`` from a Dataset, DatasetDict or saved directory."""
    datasets = _import_datasets()
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        if not os.path.isdir(path):
            raise ChuteError(f"{path} is not a directory; pass a directory written by Dataset.save_to_disk")
        try:
            loaded = datasets.load_from_disk(path)
        except (FileNotFoundError, ValueError) as exc:
            raise ChuteError(f"{path} is not a dataset saved with save_to_disk ({exc})") from None
        where = f"Hugging Face dataset {path}"
    else:
        loaded, where = src, f"Hugging Face dataset {getattr(getattr(src, 'info', None), 'dataset_name', None) or '(in memory)'}"
    if isinstance(loaded, datasets.DatasetDict):
        if split is None and len(loaded) == 1:
            split = next(iter(loaded))
        if split not in loaded:
            raise ChuteError(f"{where} has splits {sorted(loaded)}; choose one with split= (chute convert --split NAME)")
        loaded, where = loaded[split], f"{where} split {split!r}"
    elif split is not None:
        raise ChuteError(f"split={split!r} was given but {where} is a single Dataset, not a DatasetDict")
    if not isinstance(loaded, datasets.Dataset):
        raise ChuteError(
            f"cannot convert a {type(loaded).__name__}; pass a datasets.Dataset (for a streaming "
            "IterableDataset, write its rows with chute.write)"
        )
    return loaded, where, split


def _batches(dataset: Any, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The dataset's rows as record batches, in order (its index mapping applied)."""
    view = dataset.select_columns(list(columns)).with_format("arrow")
    for table in view.iter(batch_size=ROWS_PER_SLICE):
        yield from table.combine_chunks().to_batches()


def _metadata(dataset: Any, split: str | None) -> dict[str, Any]:
    datasets = _import_datasets()
    features = dataset.features
    class_names = {
        name: list(feature.names) for name, feature in features.items() if isinstance(feature, datasets.ClassLabel)
    }
    meta: dict[str, Any] = {"source": {"kind": "hf"}, "hf_features": to_jsonable(features.to_dict())}
    if split is not None:
        meta["source"]["split"] = split
    if class_names:
        meta["class_names"] = class_names
    return meta


def plan_hf(dataset_or_saved_dir: Any, split: str | None, columns: Sequence[str] | None) -> tuple[Any, str, str | None, list[str], list]:
    """The dataset, where it is, its split, the columns to convert and how (shapes scanned where needed)."""
    dataset, where, split = load_hf(dataset_or_saved_dir, split)
    names = list(columns) if columns is not None else list(dataset.column_names)
    missing = [c for c in names if c not in dataset.column_names]
    if missing:
        raise ChuteError(f"{where} has no column(s) {missing}; its columns are {dataset.column_names}")
    schema = pa.schema([dataset.data.schema.field(name) for name in names])
    scan_names = [f.name for f in schema if needs_shape_scan(f.type)]
    scans = scan_shapes(schema, ((b, where) for b in _batches(dataset, scan_names))) if scan_names else {}
    return dataset, where, split, names, plan_columns(schema, scans, where=where)


def from_hf(
    dataset_or_saved_dir: Any,
    dst: str | os.PathLike,
    *,
    split: str | None = None,
    columns: Sequence[str] | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert a Hugging Face ``datasets.Dataset`` or a directory written by ``save_to_disk``.

    For a ``DatasetDict`` pick the split with ``split=`` (needed when it has several).
    ``columns`` keeps only those columns. Row order is the dataset's order.
    """
    dataset, where, split, names, plan = plan_hf(dataset_or_saved_dir, split, columns)
    samples = (
        sample
        for first_row, batch in number_batches(_batches(dataset, names))
        for sample in batch_samples(batch, plan, where=where, first_row=first_row)
    )
    return write_samples(
        samples,
        dst,
        progress=Progress(len(dataset), "chute convert (hf)", enabled=progress, unit="rows"),
        schema={c.name: c.ctype for c in plan},
        metadata=_metadata(dataset.select_columns(names), split),
        shard_size=shard_size,
        overwrite=overwrite,
    )

