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
from typing import Any, ClassVar

import pyarrow as pa

from chute.errors import ChuteError, TextError

CHUNK_BYTES = 1 << 20
"""Text per chunk handed to a worker: big enough that pickling is noise, small enough to spread the work."""

COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz")
JSONL_EXTENSIONS = (".jsonl", ".ndjson", ".json")
ARROW_EXTENSIONS = (".parquet", ".pq", ".arrow", ".feather", ".ipc")
TXT_EXTENSIONS = (".txt",)
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
KINDS = ("jsonl", "arrow", "hf", "txt")


ERRORS = ("strict", "replace", "ignore", "backslashreplace", "skip")
"""What to do with bytes that do not decode: Python's error handlers, or ``skip`` the document (counted, recorded)."""

UNDECODABLE = "not decodable"
"""Why a document skipped with ``errors="skip"`` was skipped (the manifest's record of skipped documents)."""


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How documents are read: the fields kept beside the text, the text's encoding and what to do with bad bytes."""

    keep: tuple[str, ...] = ()
    encoding: str = "utf-8"
    errors: str = "strict"

    def decode(self, data: bytes, where: str) -> str | None:
        """``data`` as text; None when it does not decode and ``errors="skip"``; else a TextError saying what to do."""
        try:
            return data.decode(self.encoding, "strict" if self.errors == "skip" else self.errors)
        except UnicodeDecodeError as exc:
            if self.errors == "skip":
                return None
            raise TextError(
                f"{where}: not {self.encoding.upper()} text (byte {exc.start}: {exc.reason}); if the corpus is in another "
                f"encoding name it with --encoding / encoding= (e.g. latin-1); --errors replace / errors='replace' "
                "replaces what does not decode with U+FFFD, --errors skip / errors='skip' skips such documents "
                "(counted, and recorded in the dataset's metadata)"
            ) from None


@dataclasses.dataclass
class Documents:
    """What a chunk holds: the texts of its documents, where each is (its file, and its line or row) and its kept
    fields; and the documents that could not be read (``skipped``: file, line or row, why)."""

    texts: list[str]
    files: list[str]  # as recorded (relative to the corpus given)
    lines: list[int]
    kept: dict[str, list[Any]]
    skipped: list[tuple[str, int, str]]
    paths: list[str]  # as messages name them (the files as given)

    def place(self, i: int, kind: str) -> str:
        """Where document ``i`` is, as messages name it."""
        return origin(self.paths[i], self.lines[i], kind)


# --------------------------------------------------------------------------- chunks (picklable)


@dataclasses.dataclass
class JsonLines:
    """Lines ``first_line, first_line + 1, ...`` (1-based) of a JSON-lines file, as bytes (``name``: the file as
    recorded in the dataset, relative to the corpus given)."""

    path: str
    name: str
    first_line: int
    lines: list[bytes]
    key: str
    options: ReadOptions = ReadOptions()
    kind: ClassVar[str] = "jsonl"

    def read(self) -> Documents:
        out = Documents([], [], [], {k: [] for k in self.options.keep}, [], [])
        for i, line in enumerate(self.lines):
            if not line.strip():  # a blank line (often the last) is no document
                continue
            number = self.first_line + i
            text = self.options.decode(line, self._line(i))
            if text is None:
                out.skipped.append((self.name, number, UNDECODABLE))
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                raise TextError(f"{self._line(i)}: not valid JSON ({exc}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise TextError(f"{self._line(i)}: a JSON {_json_type(record)}, not an object with a {self.key!r} key")
            if self.key not in record:
                keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
                raise TextError(f"{self._line(i)}: no {self.key!r} key (its keys: {keys}); name the text's key with --text-key")
            value = record[self.key]
            if not isinstance(value, str):
                raise TextError(f"{self._line(i)}: {self.key!r} is a JSON {_json_type(value)}, not a string")
            out.texts.append(value)
            out.files.append(self.name)
            out.paths.append(self.path)
            out.lines.append(number)
            for k in self.options.keep:
                out.kept[k].append(record.get(k))  # a line without the field keeps null
        return out

    def _line(self, n: int) -> str:
        return f"{self.path} line {self.first_line + n}"


@dataclasses.dataclass
class ArrowTexts:
    """Rows ``first_row, ...`` (0-based) of a string column of ``where`` (and the ``kept`` columns' same rows)."""

    where: str
    name: str
    column: str
    first_row: int
    array: pa.Array
    kept: dict[str, pa.Array] = dataclasses.field(default_factory=dict)
    kind: ClassVar[str] = "arrow"

    def read(self) -> Documents:
        if self.array.null_count:
            row = self.first_row + self.array.is_null().to_pylist().index(True)
            raise TextError(f"{self.where} row {row}: column {self.column!r} is null, not a string")
        texts = self.array.to_pylist()
        kept = {k: a.to_pylist() for k, a in self.kept.items()}
        rows = list(range(self.first_row, self.first_row + len(texts)))
        return Documents(texts, [self.name] * len(texts), rows, kept, [], [self.where] * len(texts))


@dataclasses.dataclass
class TextFiles:
    """Whole ``.txt`` files, one document each (``names``: as recorded, relative to the corpus given)."""

    paths: list[str]
    names: list[str]
    options: ReadOptions = ReadOptions()
    kind: ClassVar[str] = "txt"

    def read(self) -> Documents:
        out = Documents([], [], [], {}, [], [])
        for path, name in zip(self.paths, self.names):
            with open(path, "rb") as f:
                text = self.options.decode(f.read(), path)
            if text is None:
                out.skipped.append((name, 0, UNDECODABLE))
                continue
            out.texts.append(text)
            out.files.append(name)
            out.paths.append(path)
            out.lines.append(0)
        return out


Chunk = JsonLines | ArrowTexts | TextFiles


def origin(file: str, line: int, kind: str) -> str:
    """A document's place as messages name it: ``corpus.jsonl line 41``, ``corpus.parquet row 3``, ``texts/a.txt``."""
    if kind == "jsonl":
        return f"{file} line {line}"
    if kind == "txt":
        return file
    return f"{file} row {line}"


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


# --------------------------------------------------------------------------- sources


@dataclasses.dataclass
class TextSource:
    """A corpus: its kind, what it is made of (for metadata), its document count if known, and its chunks.

    ``base`` is the folder the files are named from in the dataset (the folder given, or the files' common folder):
    a document's recorded file is its path relative to it, never an absolute path of this machine."""

    kind: str
    files: list[str]
    documents: int | None
    text_key: str
    dataset: Any = None  # a datasets.Dataset (kind "hf")
    where: str = ""
    base: str = ""
    options: ReadOptions = ReadOptions()

    def name(self, path: str) -> str:
        return os.path.relpath(path, self.base).replace(os.sep, "/") if self.base else os.path.basename(path)

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Chunk]:
        """The source's documents as chunks of about ``chunk_bytes`` of text, in order."""
        chunk_bytes = max(1, int(chunk_bytes))
        columns = [self.text_key, *self.options.keep]
        if self.kind == "jsonl":
            for path in self.files:
                yield from _jsonl_chunks(path, self.name(path), self.text_key, chunk_bytes, self.options)
        elif self.kind == "txt":
            yield from _txt_chunks(self.files, [self.name(p) for p in self.files], chunk_bytes, self.options)
        elif self.kind == "arrow":
            from chute.sources.arrow import ArrowFile

            for path in self.files:
                file = ArrowFile.open(path)
                yield from _arrow_chunks(file.batches(columns), path, self.name(path), columns, chunk_bytes)
        else:
            from chute.sources.hf import _batches

            yield from _arrow_chunks(_batches(self.dataset, columns), self.where, self.where_name, columns, chunk_bytes)

    @property
    def where_name(self) -> str:
        """A Hugging Face dataset as recorded: its folder's name (or the split), never an absolute path."""
        return os.path.basename(os.path.normpath(self.files[0])) if self.files else self.where

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"kind": self.kind, "text_key": self.text_key}
        if self.options.keep:
            meta["keep"] = list(self.options.keep)
        if self.options.encoding != "utf-8" or self.options.errors != "strict":
            meta["encoding"], meta["errors"] = self.options.encoding, self.options.errors
        if self.files:
            meta["file_count"] = len(self.files)
            meta["files"] = [self.name(f) for f in self.files[:1000]]  # the first 1,000: a manifest stays small
        return meta


def open_text_source(
    src: Any, *, text_key: str = "text", kind: str | None = None, split: str | None = None,
    options: ReadOptions = ReadOptions(),
) -> TextSource:
    """The text corpus at ``src`` (a path, a glob, a list of paths, or a ``datasets.Dataset``), checked up front:
    files exist, Parquet/Arrow/HF column ``text_key`` (and the kept columns) exist and hold strings."""
    if kind is not None and kind not in KINDS:
        raise ChuteError(f"unknown text source kind {kind!r}; use one of {', '.join(KINDS)}")
    _check_options(options, text_key)
    source = _open(src, text_key, kind, split, options.keep)
    if source.kind == "txt" and options.keep:
        raise ChuteError(f"{_name(src)}: --keep / keep= names fields of JSON lines or columns of Parquet, Arrow and "
                         "Hugging Face datasets; a .txt file is one document with no fields (its file is recorded anyway)")
    source.options = options
    if source.files and not source.base and not (isinstance(src, (str, os.PathLike)) and os.path.isfile(src)):
        given = os.fspath(src) if isinstance(src, (str, os.PathLike)) else ""
        source.base = given if given and os.path.isdir(given) else os.path.commonpath(
            [os.path.dirname(os.path.abspath(f)) for f in source.files]
        )
    return source


def _check_options(options: ReadOptions, text_key: str) -> None:
    import codecs

    if options.errors not in ERRORS:
        raise ChuteError(f"errors must be one of {', '.join(ERRORS)}, got {options.errors!r}")
    try:
        codecs.lookup(options.encoding)
    except LookupError:
        raise ChuteError(f"unknown text encoding {options.encoding!r} (--encoding / encoding=); e.g. utf-8, latin-1, cp1252") from None
    reserved = [k for k in options.keep if k in (text_key, "tokens", "source_file", "source_line")]
    if reserved or len(set(options.keep)) != len(options.keep):
        raise ChuteError(f"--keep / keep= names {list(options.keep)}: each field once, and not the text's key nor "
                         "'tokens', 'source_file' or 'source_line' (the dataset's own columns)")


def _open(src: Any, text_key: str, kind: str | None, split: str | None, keep: Sequence[str]) -> TextSource:
    if not isinstance(src, (str, os.PathLike, list, tuple)):
        if type(src).__module__.startswith("datasets"):
            return _hf_source(src, text_key, split, keep)
        raise ChuteError(f"cannot read text from a {type(src).__name__}; pass a path (or a datasets.Dataset)")
    if isinstance(src, (str, os.PathLike)) and os.path.isdir(src) and kind in (None, "hf"):
        if kind == "hf" or any(os.path.exists(os.path.join(src, m)) for m in HF_MARKERS):
            return _hf_source(src, text_key, split, keep)
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
        return _arrow_source(files, text_key, keep)
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


def _arrow_source(files: list[str], text_key: str, keep: Sequence[str]) -> TextSource:
    from chute.sources.arrow import ArrowFile

    rows = 0
    for path in files:
        file = ArrowFile.open(path)
        for column in (text_key, *keep):
            if column not in file.schema.names:
                option = "name the text column with --text-key" if column == text_key else "--keep names columns to keep"
                raise TextError(f"{path} has no column {column!r} (its columns: {', '.join(file.schema.names)}); {option}")
        _check_text_type(file.schema.field(text_key).type, text_key, path)
        rows += file.rows
    return TextSource("arrow", files, rows, text_key)


def _hf_source(src: Any, text_key: str, split: str | None, keep: Sequence[str]) -> TextSource:
    from chute.sources.hf import load_hf

    dataset, where, _ = load_hf(src, split)
    for column in (text_key, *keep):
        if column not in dataset.column_names:
            option = "name the text column with --text-key" if column == text_key else "--keep names columns to keep"
            raise TextError(f"{where} has no column {column!r} (its columns: {', '.join(dataset.column_names)}); {option}")
    _check_text_type(dataset.data.schema.field(text_key).type, text_key, where)
    files = [os.fspath(src)] if isinstance(src, (str, os.PathLike)) else []
    return TextSource("hf", files, len(dataset), text_key, dataset=dataset.select_columns([text_key, *keep]), where=where)


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


def _jsonl_chunks(path: str, name: str, key: str, chunk_bytes: int, options: ReadOptions) -> Iterator[JsonLines]:
    lines: list[bytes] = []
    size = 0
    first = 1
    try:
        with _open_text_file(path) as f:
            for number, line in enumerate(f, start=1):
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    yield JsonLines(path, name, first, lines, key, options)
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
        yield JsonLines(path, name, first, lines, key, options)


def _txt_chunks(paths: Sequence[str], names: Sequence[str], chunk_bytes: int, options: ReadOptions) -> Iterator[TextFiles]:
    group: list[int] = []
    size = 0
    for i, path in enumerate(paths):
        group.append(i)
        size += os.path.getsize(path)
        if size >= chunk_bytes:
            yield TextFiles([paths[j] for j in group], [names[j] for j in group], options)
            group, size = [], 0
    if group:
        yield TextFiles([paths[j] for j in group], [names[j] for j in group], options)


def _arrow_chunks(
    batches: Iterator[pa.RecordBatch], where: str, name: str, columns: Sequence[str], chunk_bytes: int
) -> Iterator[ArrowTexts]:
    """Chunks of the text column ``columns[0]`` (and the kept ``columns[1:]``) of about ``chunk_bytes`` of text."""
    column, keep = columns[0], list(columns[1:])
    pending: list[pa.RecordBatch] = []
    size = first = row = 0

    def chunk() -> ArrowTexts:
        # a copy (concat): a pickled slice would carry the whole batch's buffers
        table = pa.Table.from_batches(pending).combine_chunks()
        arrays = {c: table.column(c).chunk(0) if table.column(c).num_chunks else pa.array([], table.schema.field(c).type)
                  for c in columns}
        return ArrowTexts(where, name, column, first, arrays[column], {k: arrays[k] for k in keep})

    for batch in batches:
        batch = batch.select(list(columns))
        array = batch.column(0)
        per_row = max(1, array.nbytes // max(1, len(array)))
        start = 0
        while start < len(array):
            take = min(len(array) - start, max(1, (chunk_bytes - size) // per_row))
            pending.append(batch.slice(start, take))
            size += take * per_row
            start += take
            row += take
            if size >= chunk_bytes:
                yield chunk()
                pending, size, first = [], 0, row
    if pending:
        yield chunk()
