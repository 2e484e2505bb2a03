"""``convert``: one entry point for every source kind (what ``chute convert`` calls)."""

from __future__ import annotations

import importlib
import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import chute
from chute.errors import ChuteError
from chute.sources._remote import is_remote, local_copy
from chute.sources._write import DEFAULT_SHARD_SIZE
from chute.sources.arrow import from_arrow_files
from chute.sources.detect import KINDS, detect_kind
from chute.sources.hdf5 import from_hdf5
from chute.sources.hf import from_hf
from chute.sources.images import from_image_folder
from chute.sources.index import from_index
from chute.sources.jsonl import from_jsonl
from chute.sources.lmdb import from_lmdb
from chute.sources.npy import from_numpy
from chute.sources.tfrecord import from_tfrecord
from chute.sources.webdataset import from_webdataset
from chute.sources.zarr import from_zarr

CONVERTERS: dict[str, Callable[..., chute.Dataset]] = {
    "index": from_index,
    "images": from_image_folder,
    "arrow": from_arrow_files,
    "hf": from_hf,
    "numpy": from_numpy,
    "webdataset": from_webdataset,
    "jsonl": from_jsonl,
    "hdf5": from_hdf5,
    "zarr": from_zarr,
    "lmdb": from_lmdb,
    "tfrecord": from_tfrecord,
}
TAKES_URLS = frozenset({"index", "jsonl", "zarr", "tfrecord"})
"""Kinds that read URLs themselves; a remote source of another kind is downloaded to a temporary copy first."""
USES_WORKERS = frozenset({"index", "images", "hdf5", "zarr", "lmdb", "tfrecord"})
"""Kinds read by a pool of processes; the others stream natively (Arrow) or sequentially (tar, npy)."""
TAKES_PICKLES = frozenset({"index", "lmdb"})
"""Kinds that unpickle only with allow_pickle=True."""


def convert(
    src: Any,
    dst: str | os.PathLike,
    *,
    kind: str | None = None,
    allow_pickle: bool = False,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
    ray: str | None = None,
    **kind_specific: Any,
) -> chute.Dataset:
    """Convert ``src`` into a chute dataset at ``dst`` and open it.

    ``kind`` is one of ``index``, ``images``, ``arrow``, ``hf``, ``numpy``,
    ``webdataset``, ``jsonl``, ``hdf5``, ``zarr``, ``lmdb``, ``tfrecord``; when None it
    is detected from ``src`` (see :func:`chute.sources.detect.detect_kind`).
    ``allow_pickle`` lets the index and LMDB converters unpickle (pickles can run
    arbitrary code: only for data you trust). ``workers`` is the number of reader
    processes for the index, image, HDF5, Zarr, LMDB and TFRecord converters
    (default: one per CPU; 0 reads in this process). ``kind_specific``
    goes to the converter (e.g. ``path_column=``, ``root=``, ``data_type=`` for index,
    ``split=`` for hf, ``columns=`` for arrow/hf, ``column=`` for numpy); an option the
    kind does not take is an error. If anything fails, nothing valid is left at ``dst``.

    ``ray=`` is deprecated since chute 0.1 (removed in 0.2): call
    :func:`chute.ray.convert_on_ray` (``address=``) instead.
    """
    if ray is not None:
        warnings.warn(
            "chute.sources.convert: ray= is deprecated since chute 0.1 and will be removed in chute 0.2; "
            "use chute.ray.convert_on_ray(src, dst, address=...)",
            FutureWarning,
            stacklevel=2,
        )
        # the one import of a higher layer left (sources sits below ray): listed in tests/test_layers.py
        # KNOWN with its removal version, 0.2, when it goes with ray=
        convert_on_ray = importlib.import_module("chute.ray").convert_on_ray
        return convert_on_ray(
            src, dst, address=ray, kind=kind, allow_pickle=allow_pickle, shard_size=shard_size, overwrite=overwrite, **kind_specific
        )
    if kind is None:
        kind = detect_kind(src)
    elif kind not in CONVERTERS:
        raise ChuteError(f"unknown source kind {kind!r}; use one of {', '.join(KINDS)}")
    options: dict[str, Any] = {"shard_size": shard_size, "overwrite": overwrite, "progress": progress}
    if kind in USES_WORKERS:
        options["workers"] = workers
    if kind in TAKES_PICKLES:
        options["allow_pickle"] = allow_pickle
    converter = CONVERTERS[kind]
    if kind not in TAKES_URLS and isinstance(src, (str, os.PathLike)) and is_remote(os.fspath(src)):
        if kind not in ("arrow", "webdataset", "numpy", "hdf5"):
            raise ChuteError(f"{src}: a remote {kind} source cannot be converted where it is; copy it locally first")
        storage_options = kind_specific.pop("storage_options", None)
        _check_options(kind, converter, kind_specific)
        with local_copy(os.fspath(src), storage_options) as path:
            return converter(path, dst, **options, **kind_specific)
    _check_options(kind, converter, kind_specific)
    return converter(src, dst, **options, **kind_specific)


def _check_options(kind: str, converter: Callable[..., Any], options: dict[str, Any]) -> None:
    """Refuse options the converter of ``kind`` does not take, naming them as in Python and on the command line."""
    accepted = inspect.signature(converter).parameters
    unknown = [name for name in options if name not in accepted]
    if unknown:
        named = ", ".join(f"{name}= (--{name.replace('_', '-')})" for name in unknown)
        takes = [name for name, p in accepted.items() if p.kind is p.KEYWORD_ONLY]
        raise ChuteError(f"{named} does not apply to {kind} sources; {converter.__name__} takes {', '.join(takes)}")
