"""Guess a source's kind from its path (``chute convert`` without ``--kind``).

========================================================  ============
source                                                    kind
========================================================  ============
``.csv`` / ``.tsv`` / ``.txt`` file                       index
``.npy`` / ``.npz`` file                                  numpy
``.parquet`` / ``.arrow`` / ``.feather`` / ``.ipc`` file  arrow
``.tar`` / ``.tar.gz`` / ``.tgz`` file                    webdataset
directory with ``dataset_info.json``, ``state.json`` or
``dataset_dict.json`` (``save_to_disk``)                  hf
directory of Parquet / Arrow / Feather files              arrow
directory of tars                                         webdataset
directory of TFRecord files                               tfrecord
directory whose subdirectories hold images                images
========================================================  ============

The checks run in that order; only names are looked at, never file contents.
A URL (``s3://``, ``gs://``, ``https://``) is a file: its name decides.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from chute.errors import ChuteError
from chute.sources._files import IMAGE_EXTENSIONS
from chute.sources.arrow import ARROW_EXTENSIONS
from chute.sources.hdf5 import HDF5_EXTENSIONS
from chute.sources.hf import SAVED_MARKERS
from chute.sources.jsonl import JSONL_EXTENSIONS
from chute.sources.lmdb import LMDB_FILES, is_lmdb_dir
from chute.sources.tfrecord import TFRECORD_EXTENSIONS
from chute.sources.webdataset import TAR_EXTENSIONS, expand_braces
from chute.sources.zarr import is_zarr_dir

KINDS = ("index", "images", "arrow", "hf", "numpy", "webdataset", "jsonl", "hdf5", "zarr", "lmdb", "tfrecord")
INDEX_EXTENSIONS = (".csv", ".tsv", ".txt")
NUMPY_EXTENSIONS = (".npy", ".npz")


def _kind_of_file(path: str) -> str | None:
    name = path.lower()
    for kind, extensions in (
        ("index", INDEX_EXTENSIONS),
        ("numpy", NUMPY_EXTENSIONS),
        ("arrow", ARROW_EXTENSIONS),
        ("webdataset", TAR_EXTENSIONS),
        ("jsonl", JSONL_EXTENSIONS),
        ("hdf5", HDF5_EXTENSIONS),
        ("tfrecord", TFRECORD_EXTENSIONS),
        ("lmdb", LMDB_FILES),
        ("zarr", (".zarr", ".zarr/")),
    ):
        if name.endswith(extensions):
            return kind
    return None


def _has_images(directory: str) -> bool:
    for _, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS for f in filenames):
            return True
    return False


def _kind_of_dir(path: str) -> str | None:
    names = os.listdir(path)
    if any(marker in names for marker in SAVED_MARKERS):
        return "hf"
    if "manifest.json" in names and any(n.endswith(".arrow") and n.startswith("shard-") for n in names):
        raise ChuteError(f"{path} is already a chute dataset; open it with chute.open")
    if is_zarr_dir(path):
        return "zarr"
    if is_lmdb_dir(path):
        return "lmdb"
    files = [n for n in names if os.path.isfile(os.path.join(path, n))]
    for kind in ("arrow", "webdataset", "tfrecord"):
        if any(_kind_of_file(n) == kind for n in files):
            return kind
    subdirs = sorted(n for n in names if not n.startswith(".") and os.path.isdir(os.path.join(path, n)))
    if any(_has_images(os.path.join(path, d)) for d in subdirs):
        return "images"
    return None


def _check_protocol(url: str) -> None:
    """A URL whose scheme fsspec does not know is an error saying so (not "cannot tell its kind")."""
    import fsspec

    try:
        fsspec.get_filesystem_class(url.split("://", 1)[0])
    except (ValueError, ImportError) as exc:
        raise ChuteError(f"cannot open {url}: {exc}") from None


def detect_kind(src: str | os.PathLike | Sequence[str | os.PathLike]) -> str:
    """The kind of source ``src`` is (one of :data:`KINDS`), or a ChuteError saying to pass ``kind=``."""
    if isinstance(src, (list, tuple)):
        if not src:
            raise ChuteError("no source given: the list of sources is empty")
        kinds = {detect_kind(part) for part in src}
        if len(kinds) != 1:
            raise ChuteError(f"the sources are of different kinds ({sorted(kinds)}); convert them separately")
        return kinds.pop()
    if not isinstance(src, (str, os.PathLike)):
        if type(src).__module__.startswith("datasets"):
            return "hf"
        raise ChuteError(f"cannot convert a {type(src).__name__}; pass a path (or a datasets.Dataset)")
    path = os.fspath(src)
    if "://" in path:
        _check_protocol(path)
        kind = _kind_of_file(path.split("?", 1)[0])
    elif os.path.isdir(path):
        kind = _kind_of_dir(path)
    elif os.path.isfile(path):
        kind = _kind_of_file(path)
    else:
        matches = sorted({m for name in expand_braces(path) for m in glob.glob(name)})
        if not matches:
            raise ChuteError(f"{path} does not exist")
        found = {_kind_of_file(m) for m in matches}
        kind = found.pop() if len(found) == 1 else None
    if kind is None:
        raise ChuteError(
            f"cannot tell what kind of source {path} is; pass kind= (chute convert --kind) with one of: "
            "index (a .csv/.tsv/.txt list of files), images (class folders of images), arrow "
            "(.parquet/.arrow/.feather files), hf (a Hugging Face save_to_disk directory), numpy "
            "(.npy/.npz), webdataset (.tar shards), jsonl (.jsonl/.ndjson JSON lines), hdf5 (.h5/.hdf5/.nc), zarr "
            "(a Zarr group directory or URL), lmdb (a directory holding data.mdb), tfrecord (.tfrecord files of Examples)"
        )
    return kind
