"""Text corpora read as chunks of documents, for tokenizing in worker processes.

A source (JSON lines, Parquet/Arrow files, a Hugging Face dataset, a folder of
``.txt`` files) is read in this process into **chunks** of about ``chunk_bytes``
of text, in order; a chunk is small and picklable, and ``chunk.texts()`` (run in
a worker) turns it into its documents' strings, raising a :class:`TextError`
that names the file and line (or row) for a missing key, a value that is not a
string, or a line that is not JSON. Decoding JSON and UTF-8 is work that holds
the GIL, so it happens in the workers, beside the tokenizing.

=====================================================  ======================================
source                                                 documents
=====================================================  ======================================
``.jsonl`` / ``.ndjson`` / ``.json`` (+ ``.gz``,       one per line: ``line[text_key]``
``.zst``, ``.bz2``, ``.xz``)
``.parquet`` / ``.arrow`` / ``.feather`` file          one per row: column ``text_key``
folder with ``dataset_info.json`` / ``state.json`` /   one per row of the (``split``) dataset,
``dataset_dict.json`` (``save_to_disk``)                column ``text_key``
folder of any of the above (searched recursively,      files in sorted path order
sorted; ``split`` keeps the files of that split)
folder of ``.txt`` files (recursively), or one         one per file, the whole file (UTF-8)
``.txt`` file
=====================================================  ======================================
"""

from __future__ import annotations

import bz2
import dataclasses
import glob
import gzip
import io
import json
import lzma
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from chute.errors import ChuteError

CHUNK_BYTES = 1 << 20
"""Text per chunk handed to a worker: big enough that pickling is noise, small enough to spread the work."""

COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz")
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
ARROW_EXTENSIONS = (".parquet", ".pq", ".arrow", ".feather", ".ipc")
TXT_EXTENSIONS = (".txt",)
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
KINDS = ("jsonl", "arrow", "hf", "txt")


class TextError(ChuteError):
    """A document cannot be read as text: a missing key, a value that is not a string, bad JSON or UTF-8."""


# --------------------------------------------------------------------------- chunks (picklable)


@dataclasses.dataclass
class JsonLines:
    """Lines ``first_line, first_line + 1, ...`` (1-based) of a JSON-lines file, as bytes."""

    path: str
    first_line: int
    lines: list[bytes]
    key: str

    def texts(self) -> list[str]:
        texts = []
        for i, line in enumerate(self.lines):
            if not line.strip():  # a blank line (often the last) is no document
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise TextError(f"{self._line(i)}: not valid JSON ({exc}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise TextError(f"{self._line(i)}: a JSON {_json_type(record)}, not an object with a {self.key!r} key")
            if self.key not in record:
                keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
                raise TextError(f"{self._line(i)}: no {self.key!r} key (its keys: {keys}); name the text's key with --text-key")
            text = record[self.key]
            if not isinstance(text, str):
                raise TextError(f"{self._line(i)}: {self.key!r} is a JSON {_json_type(text)}, not a string")
            texts.append(text)
        return texts

    def origin(self, i: int) -> str:
        """Where document ``i`` of the chunk is (blank lines hold none)."""
        lines = [n for n, line in enumerate(self.lines) if line.strip()]
        return self._line(lines[i])

    def _line(self, n: int) -> str:
        return f"{self.path} line {self.first_line + n}"


@dataclasses.dataclass
class ArrowTexts:
    """Rows ``first_row, ...`` (0-based) of a string column of ``where``."""

    where: str
    column: str
    first_row: int
    array: pa.Array

    def texts(self) -> list[str]:
        if self.array.null_count:
            row = self.first_row + self.array.is_null().to_pylist().index(True)
            raise TextError(f"{self.where} row {row}: column {self.column!r} is null, not a string")
        return self.array.to_pylist()

    def origin(self, i: int) -> str:
        return f"{self.where} row {self.first_row + i}"


@dataclasses.dataclass
class TextFiles:
    """Whole ``.txt`` files, one document each."""

    paths: list[str]

    def texts(self) -> list[str]:
        texts = []
        for path in self.paths:
            with open(path, "rb") as f:
                data = f.read()
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise TextError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
        return texts

    def origin(self, i: int) -> str:
        return self.paths[i]


Chunk = JsonLines | ArrowTexts | TextFiles


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


# --------------------------------------------------------------------------- sources


@dataclasses.dataclass
class TextSource:
    """A corpus: its kind, what it is made of (for metadata), its document count if known, and its chunks."""

    kind: str
    files: list[str]
    documents: int | None
    text_key: str
    dataset: Any = None  # a datasets.Dataset (kind "hf")
    where: str = ""

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
        """The source's documents as chunks of about ``chunk_bytes`` of text, in order."""
        chunk_bytes = max(1, int(chunk_bytes))
        if self.kind == "jsonl":
            for path in self.files:
                yield from _jsonl_chunks(path, self.text_key, chunk_bytes)
        elif self.kind == "txt":
            yield from _txt_chunks(self.files, chunk_bytes)
        elif self.kind == "arrow":
            from chute.sources.arrow import ArrowFile

            for path in self.files:
                file = ArrowFile.open(path)
                yield from _arrow_chunks(file.batches([self.text_key]), path, self.text_key, chunk_bytes)
        else:
            from chute.sources.hf import _batches

            yield from _arrow_chunks(_batches(self.dataset, [self.text_key]), self.where, self.text_key, chunk_bytes)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"kind": self.kind, "text_key": self.text_key}
        if self.files:
            meta["file_count"] = len(self.files)
            meta["files"] = [os.path.basename(f) for f in self.files[:1000]]  # the first 1,000: a manifest stays small
        return meta


def open_text_source(src: Any, *, text_key: str = "text", kind: str | None = None, split: str | None = None) -> TextSource:
    """The text corpus at ``src`` (a path, a glob, a list of paths, or a ``datasets.Dataset``), checked up front:
    files exist, Parquet/Arrow/HF column ``text_key`` exists and holds strings."""
    if kind is not None and kind not in KINDS:
        raise ChuteError(f"unknown text source kind {kind!r}; use one of {', '.join(KINDS)}")
    if not isinstance(src, (str, os.PathLike, list, tuple)):
        if type(src).__module__.startswith("datasets"):
            return _hf_source(src, text_key, split)
        raise ChuteError(f"cannot read text from a {type(src).__name__}; pass a path (or a datasets.Dataset)")
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(src) and kind in (None, "hf"):
        if kind == "hf" or any(os.path.exists(os.path.join(src, m)) for m in HF_MARKERS):
            return _hf_source(src, text_key, split)
    files = _list_files(src, split)
    if kind is None:
        kinds = _kinds(files)
        if len(kinds) > 1:  # plain .json files beside Parquet or .txt files are metadata, not a corpus
            files = [f for f in files if not f.lower().endswith(".json")]
            kinds = _kinds(files)
        if len(kinds) > 1:
            raise ChuteError(f"{_name(src)} mixes kinds of text files ({', '.join(sorted(kinds))}); convert them separately or pass kind=")
        if not kinds:
            raise ChuteError(
                f"{_name(src)} holds no text files chute reads: JSON lines ({'/'.join(JSONL_EXTENSIONS)}, optionally "
                f"{'/'.join(COMPRESSED)}), Parquet/Arrow ({'/'.join(ARROW_EXTENSIONS)}), .txt files, or a Hugging Face "
                "save_to_disk folder"
            )
        kind = kinds.pop()
    files = [f for f in files if _kind_of(f) == kind] if len(files) > 1 else files
    if kind == "arrow":
        return _arrow_source(files, text_key)
    return TextSource(kind, files, len(files) if kind == "txt" else None, text_key)


def _kinds(files: list[str]) -> set[str]:
    """The kinds of text file among ``files`` (those chute does not read have none)."""
    return {kind for f in files if (kind := _kind_of(f)) is not None}


def _name(src: Any) -> str:
    return os.fspath(src) if isinstance(src, (str, os.PathLike)) else f"the {len(src)} sources"


def _kind_of(path: str) -> str | None:
    name = path.lower()
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            return "jsonl" if name.endswith(JSONL_EXTENSIONS) else None
    if name.endswith(JSONL_EXTENSIONS):
        return "jsonl"
    if name.endswith(ARROW_EXTENSIONS):
        return "arrow"
    if name.endswith(TXT_EXTENSIONS):
        return "txt"
    return None


def _in_split(relative: str, split: str) -> bool:
    """Whether a file of a Hugging Face folder layout belongs to ``split`` (``train/...``, ``train-00000-of-...``)."""
    parts = relative.replace(os.sep, "/").split("/")
    return split in parts[:-1] or parts[-1].startswith((f"{split}-", f"{split}_", f"{split}."))


def _list_files(src: Any, split: str | None) -> list[str]:
    if isinstance(src, (list, tuple)):
        if not src:
            raise ChuteError("no source given: the list of sources is empty")
        return [f for part in src for f in _list_files(part, split)]
    path = os.fspath(src)
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        found = []
        for folder, dirnames, filenames in os.walk(path, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            found += [os.path.join(folder, n) for n in filenames if not n.startswith(".") and _kind_of(n)]
        found.sort(key=lambda f: os.path.relpath(f, path).split(os.sep))
        if split is not None:
            found = [f for f in found if _in_split(os.path.relpath(f, path), split)]
            if not found:
                raise ChuteError(f"{path} holds no files of split {split!r} (a folder named {split} or files named {split}-*)")
        if not found:
            raise ChuteError(f"{path} holds no text files chute reads (.jsonl[.gz|.zst], .parquet, .arrow, .txt)")
        return found
    matches = sorted(glob.glob(path, recursive=True))
    if not matches:
        raise ChuteError(f"{path} does not exist")
    return matches


def _check_text_type(dtype: pa.DataType, column: str, where: str) -> None:
    if not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or getattr(pa.types, "is_string_view", lambda t: False)(dtype)):
        raise TextError(f"{where}: column {column!r} holds {dtype}, not text (strings); choose the text column with --text-key")


def _arrow_source(files: list[str], text_key: str) -> TextSource:
    from chute.sources.arrow import ArrowFile

    rows = 0
    for path in files:
        file = ArrowFile.open(path)
        if text_key not in file.schema.names:
            raise TextError(f"{path} has no column {text_key!r} (its columns: {', '.join(file.schema.names)}); name the text column with --text-key")
        _check_text_type(file.schema.field(text_key).type, text_key, path)
        rows += file.rows
    return TextSource("arrow", files, rows, text_key)


def _hf_source(src: Any, text_key: str, split: str | None) -> TextSource:
    from chute.sources.hf import load_hf

    dataset, where, _ = load_hf(src, split)
    if text_key not in dataset.column_names:
        raise TextError(f"{where} has no column {text_key!r} (its columns: {', '.join(dataset.column_names)}); name the text column with --text-key")
    _check_text_type(dataset.data.schema.field(text_key).type, text_key, where)
    files = [os.fspath(src)] if isinstance(src, (str, os.PathLike)) else []
    return TextSource("hf", files, len(dataset), text_key, dataset=dataset.select_columns([text_key]), where=where)


# --------------------------------------------------------------------------- readers


def _open_text_file(path: str) -> io.BufferedIOBase:
    """``path`` opened for reading bytes, decompressed by its extension."""
    name = path.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError:
            raise ChuteError(f"{path}: reading .zst files needs the zstandard package: pip install 'chute[zstd]'") from None
        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


def _jsonl_chunks(path: str, key: str, chunk_bytes: int) -> Iterator[JsonLines]:
    lines: list[bytes] = []
    size = 0
    first = 1
    try:
        with _open_text_file(path) as f:
            for number, line in enumerate(f, start=1):
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    yield JsonLines(path, first, lines, key)
                    lines, size, first = [], 0, number + 1
    except (OSError, EOFError, lzma.LZMAError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            raise
        raise TextError(f"{path}: cannot read it ({type(exc).__name__}: {exc}); is the file complete?") from None
    except Exception as exc:  # zstandard.ZstdError
        if type(exc).__module__.startswith("zstandard"):
            raise TextError(f"{path}: cannot decompress it ({exc}); is the file complete?") from None
        raise
    if lines:
        yield JsonLines(path, first, lines, key)


def _txt_chunks(paths: Sequence[str], chunk_bytes: int) -> Iterator[TextFiles]:
    group: list[str] = []
    size = 0
    for path in paths:
        group.append(path)
        size += os.path.getsize(path)
        if size >= chunk_bytes:
            yield TextFiles(group)
            group, size = [], 0
    if group:
        yield TextFiles(group)


def _arrow_chunks(batches: Iterator[pa.RecordBatch], where: str, column: str, chunk_bytes: int) -> Iterator[ArrowTexts]:
    pending: list[pa.Array] = []
    size = first = row = 0
    for batch in batches:
        array = batch.column(batch.schema.get_field_index(column))
        per_row = max(1, array.nbytes // max(1, len(array)))
        start = 0
        while start < len(array):
            take = min(len(array) - start, max(1, (chunk_bytes - size) // per_row))
            pending.append(array.slice(start, take))
            size += take * per_row
            start += take
            row += take
            if size >= chunk_bytes:
                # a copy (concat): a pickled slice would carry the whole batch's buffers
                yield ArrowTexts(where, column, first, pa.concat_arrays(pending))
                pending, size, first = [], 0, row
    if pending:
        yield ArrowTexts(where, column, first, pa.concat_arrays(pending))
