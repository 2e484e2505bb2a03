"""Convert JSON lines files (``.jsonl``, ``.ndjson``, gzipped or not; local or a URL) into a chute dataset.

One line is one sample. A line holding an object whose keys are record fields
(the usual ``{"text": ..., "label": ..., "meta": {...}}``) gives one column per
key, nested objects dotted names (``meta.lang``); a key some lines lack makes a
nullable column. Lists of numbers are arrays (a tensor column when every line
has the same shape, else ragged). Any other line (a list, a string, objects with
keys that vary from line to line) is the column ``data``. The types come from
every line: the files are read twice, once for the types, once to write (a
remote file is downloaded once, to a temporary copy).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import chute
from chute.errors import ChuteError
from chute.format.infer import InferenceError, Summary, extract
from chute.format.schema import ColumnType
from chute.sources._dicts import DATA_COLUMN, plan_columns, rounded, rounding
from chute.sources._hints import from_inference
from chute.sources._progress import Progress
from chute.sources._remote import is_remote, local_copy
from chute.sources._write import DEFAULT_SHARD_SIZE, write_samples

JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
API = "from_jsonl() / convert()"


def _lines(path: str, name: str) -> Iterator[tuple[str, Any]]:
    """``(place, value)`` for each non-blank line of the file at ``path`` (``name`` in messages)."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            place = f"{name} line {number}"
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ChuteError(
                    f"{place}: not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); JSON lines are "
                    f"UTF-8: convert the file (e.g. iconv -f LATIN1 -t UTF-8 {name}) or fix the line"
                ) from None
            if not line.strip():
                continue
            try:
                yield place, json.loads(line)
            except ValueError as exc:
                raise ChuteError(f"{place}: not a JSON value ({exc}); fix the line or remove it") from None


def from_jsonl(
    src: str | os.PathLike | Sequence[str | os.PathLike],
    dst: str | os.PathLike,
    *,
    column_types: Mapping[str, ColumnType] | None = None,
    cast: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    progress: bool = True,
) -> chute.Dataset:
    """Convert one JSON lines file, or a list of them (local paths or URLs), in order.

    ``column_types`` declares some columns' types (``{"emb": chute.Tensor("float32",
    (768,))}``); values cast into them when exact, and ``cast=True`` also rounds floats.
    """
    given: Sequence[Any] = src if isinstance(src, (list, tuple)) else [src]
    sources = [os.fspath(s) for s in given]
    if not sources:
        raise ChuteError("no JSON lines file given")
    declared = dict(column_types or {})
    options = dict(storage_options or {})
    with contextlib.ExitStack() as stack:
        files = []
        for source in sources:
            if is_remote(source):
                files.append((stack.enter_context(local_copy(source, options)), source))
            elif not os.path.isfile(source):
                raise ChuteError(f"JSON lines file {source} does not exist" if not os.path.exists(source)
                                 else f"{source} is not a file; pass a .jsonl file (or a list of them)")
            else:
                files.append((source, source))
        places: list[str] = []
        summary = Summary()
        for path, name in files:
            for place, value in _lines(path, os.path.basename(name)):
                summary.add({DATA_COLUMN: value}, len(places))
                places.append(place)
        if not places:
            raise ChuteError(f"{', '.join(sources)} hold(s) no lines; there is nothing to convert")
        columns = plan_columns(summary, declared, [], places, API)
        schema = {c.name: c.ctype for c in columns}
        rounds = rounding(schema) if cast else None

        def samples() -> Iterator[tuple[dict[str, Any], str]]:
            for path, name in files:
                for place, value in _lines(path, os.path.basename(name)):
                    yield rounded(extract({DATA_COLUMN: value}, columns), rounds), place

        try:
            return write_samples(
                samples(), dst,
                progress=Progress(len(places), "chute convert (jsonl)", enabled=progress, unit="lines"),
                schema=schema,
                metadata={"source": {"kind": "jsonl", "files": [name if is_remote(name) else os.path.basename(name) for _, name in files]}},
                shard_size=shard_size, overwrite=overwrite, storage_options=options,
            )
        except InferenceError as exc:
            raise from_inference(exc, exc.detail, API, declared=declared) from None
