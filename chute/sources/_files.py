"""Reading one file's content by its extension (the index converter's per-file step).

=========================  ==============================================
extension                  value
=========================  ==============================================
``.pkl`` ``.pickle``       the unpickled object (only with allow_pickle)
``.json``                  the parsed JSON value
``.npy``                   the array (``np.load(allow_pickle=False)``)
image extensions           the encoded bytes, not decoded
anything else              the raw bytes
=========================  ==============================================

A trailing ``.gz`` means "gunzip first, then look at the inner extension", so
``12.pkl.gz`` is a gzipped pickle and ``a.jpg.gz`` gives the JPEG's bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
from typing import Any

import numpy as np

from chute.errors import ChuteError, PickleRefusedError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
PICKLE_EXTENSIONS = frozenset({".pkl", ".pickle"})

PICKLE_RISK = (
    "unpickling runs arbitrary code stored in the file, so a malicious or corrupted "
    "file can take over this process"
)


def inner_extension(path: str) -> str:
    """The lower-case extension that decides how ``path`` is read (``a/1.pkl.gz`` -> ``.pkl``)."""
    name = os.path.basename(path).lower()
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    return os.path.splitext(name)[1]


def is_pickle(path: str) -> bool:
    return inner_extension(path) in PICKLE_EXTENSIONS


def pickle_refused(path: str, count: int, source: str) -> PickleRefusedError:
    """The error for a source holding pickles when the caller did not opt in.

    ``path`` is the first pickle file (with where it is listed), ``count`` how many there are.
    """
    others = f" and {count - 1} more pickle file(s)" if count > 1 else ""
    return PickleRefusedError(
        f"{source} lists pickle file {path}{others}; chute does not unpickle by default because "
        f"{PICKLE_RISK}. If you trust every file, opt in with allow_pickle=True "
        "(chute convert --allow-pickle)"
    )


def read_bytes(path: str) -> bytes:
    """The file's bytes, gunzipped if its name ends in ``.gz``."""
    with open(path, "rb") as f:
        raw = f.read()
    # one read, then decompress in memory: GzipFile's many small reads cost more than that on a small file
    # (docs/benchmarks.md, "Design figures")
    return gzip.decompress(raw) if path.lower().endswith(".gz") else raw


def load_file(path: str, *, allow_pickle: bool = False, storage_options: dict[str, Any] | None = None) -> Any:
    """The content of the file at ``path`` (a local path or a URL), decoded according to its extension (see module doc)."""
    ext = inner_extension(path)
    if ext in PICKLE_EXTENSIONS and not allow_pickle:
        raise pickle_refused(path, 1, "the source")  # callers check up front; this is a backstop
    if "://" in path:
        from chute.sources._remote import read_url

        raw = read_url(path, storage_options)
        raw = gzip.decompress(raw) if path.lower().endswith(".gz") else raw
    else:
        raw = read_bytes(path)
    if ext in PICKLE_EXTENSIONS:
        return unpickle(raw)
    if ext == ".json":
        return json.loads(raw)
    if ext == ".npy":
        return load_npy(raw)
    return raw


def unpickle(raw: bytes) -> Any:
    """The object pickled in ``raw``: every source's pickles (files, LMDB values) go through here, and only
    after the caller checked that the user opted in (``allow_pickle``)."""
    return pickle.loads(raw)


def load_npy(raw: bytes) -> np.ndarray:
    """The array of ``.npy`` bytes, never unpickling (object arrays are refused)."""
    return np.load(io.BytesIO(raw), allow_pickle=False)


def load_indexed_file(item: tuple[str, str, str], *, allow_pickle: bool, storage_options: dict[str, Any] | None = None) -> Any:
    """``load_file`` for one index entry ``(where, path as written, resolved path)``.

    ``where`` names the entry ("index.csv row 12"); errors start with it and name the
    path, so the user can find the bad entry.
    """
    where, written, path = item
    try:
        return load_file(path, allow_pickle=allow_pickle, storage_options=storage_options)
    except FileNotFoundError:
        raise ChuteError(
            f"{where}: file {written} does not exist (resolved to {path}); fix the index "
            "or restore the file"
        ) from None
    except ChuteError:
        raise
    except Exception as exc:  # a damaged file: bad gzip, bad JSON, unloadable pickle
        kind = inner_extension(path) or "raw"
        raise ChuteError(
            f"{where}: cannot read {written} ({path}) as a {kind} file: {type(exc).__name__}: {exc}"
        ) from None
