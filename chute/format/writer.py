"""The dataset writer: samples in, Arrow IPC shards plus a manifest out.

Nothing the writer leaves behind is a valid dataset until it has finished:

1. it takes an exclusive ``flock`` on ``<root>/.chute-write.lock`` (the kernel
   drops it if the process dies), then removes files that dead writers left;
2. each shard is written to a hidden temporary name, flushed to disk, checksummed
   and renamed to ``shard-NNNNN.<token>.arrow`` (the token is new for every
   write, so an old dataset in the same directory keeps its shards intact);
3. ``manifest.json`` is written last, to a temporary name renamed into place;
4. only then are the shards of the dataset it replaced deleted.

A writer that raises, is interrupted or is killed before step 3 leaves no
``manifest.json`` (or the previous one, still pointing at the previous, intact
shards), so ``chute.open`` never accepts a half-written dataset. A writer that
raises also removes its lock file, and the directory if it made it and left it
empty. A full disk (or a file size limit) is a :class:`chute.WriteError` naming
the path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypedDict

import pyarrow as pa

from chute._sizes import parse_size
from chute._version import __version__
from chute.errors import ChuteError, SchemaError, WriteError
from chute.format.builders import make_builder
from chute.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, checksum_file, local_path, parse_manifest
from chute.format.schema import ColumnType, Schema, check_keys, infer_schema

if TYPE_CHECKING:
    from typing_extensions import Unpack


class WriteOptions(TypedDict, total=False):
    """How a dataset is written, written once: ``chute.Writer``, ``chute.write``, the converters' writer and
    ``chute.ray.write`` take these (``chute.storage.write.StoreOptions`` adds where to). See :class:`Writer`."""

    schema: Schema | Mapping[str, ColumnType] | None
    shard_size: int | str
    metadata: Mapping[str, Any] | None
    overwrite: bool
    lookahead: int
    checksum: str
    durable: bool


def write_options(given: Mapping[str, Any], where: str, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``given`` with every :class:`WriteOptions` default filled in (and ``defaults``'); a TypeError naming any
    argument ``where`` does not take."""
    known = {**WRITE_DEFAULTS, **(defaults or {})}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"{where} got unexpected keyword argument(s): {', '.join(unknown)}")
    return {**known, **given}


class Upload(Protocol):
    """Where finished shards and the manifest go when they do not stay in the build directory
    (``chute.storage.upload.Upload``: a URL, or compressed shards); the writer only calls it."""

    def previous(self) -> Manifest | None: ...
    def put(self, path: str, info: ShardInfo) -> ShardInfo: ...
    def commit(self, manifest_text: str, previous: Manifest | None, shards: Any) -> None: ...
    def abort(self) -> None: ...


class Target(NamedTuple):
    """Where a :class:`Writer` writes: ``root`` is the local directory shards are built in (the
    dataset directory itself, or a staging directory ``staging`` to remove when done, whose shards
    ``upload`` puts at ``url``). Made by ``chute.storage.write.destination``."""

    root: str
    url: str
    upload: Upload | None = None
    staging: str | None = None

DEFAULT_SHARD_SIZE = 128 * 2**20
DEFAULT_LOOKAHEAD = 64
#: The default of every :class:`WriteOptions` argument.
WRITE_DEFAULTS: dict[str, Any] = {
    "schema": None, "shard_size": DEFAULT_SHARD_SIZE, "metadata": None, "overwrite": False,
    "lookahead": DEFAULT_LOOKAHEAD, "checksum": "xxh3_128", "durable": True,
}
LOCK_NAME = ".chute-write.lock"
TMP_SUFFIX = ".chute-tmp"
# shard-NNNNN.<token>.arrow; shards written by several processes (chute.ray) add the writer: shard-WWWWW-NNNNN
_SHARD_RE = re.compile(r"shard-\d{5,}(-\d{5,})?\.[0-9a-f]+\.arrow(\.zst)?")
_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_FULL_TEXT = ("No space left on device", "File too large", "Disk quota exceeded")


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the file system took no more bytes (Arrow's I/O errors carry only the text)."""
    return isinstance(exc, OSError) and (exc.errno in _FULL or any(text in str(exc) for text in _FULL_TEXT))


@contextlib.contextmanager
def disk(what: str, where: str):
    """Turn a full disk (or a file size limit) while writing ``what`` into a WriteError naming ``where``."""
    try:
        yield
    except OSError as exc:
        if not _disk_full(exc):
            raise
        raise WriteError(
            f"cannot write {what}: the file system is full or refuses bigger files ({exc}); nothing was "
            f"kept at {where}. Free some space (or raise the limit) and write again, or write elsewhere"
        ) from None


def _fsync_path(path: str) -> None:
    """Flush a file's (or a directory's) contents to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """Turns samples of a known schema into shard files, each one written whole.

    A shard is built in memory, written under a hidden temporary name in
    ``root``, flushed, checksummed and renamed to ``<prefix>NNNNN.<token>.arrow``;
    with ``upload`` it is then uploaded (compressed first if asked) and the local
    file removed. ``shards`` lists the finished shards' manifest entries. This is
    the part of :class:`Writer` that several processes can run at once into one
    dataset (``chute.ray.write``'s tasks); the manifest is someone else's job.
    """

    def __init__(
        self, root: str, schema: Schema, *, token: str, prefix: str = "shard-", shard_size: int = DEFAULT_SHARD_SIZE,
        checksum: str = "xxh3_128", durable: bool = True, upload: Upload | None = None,
    ) -> None:
        if len(schema) == 0:
            raise SchemaError("a dataset needs at least one column")
        self.root, self.schema, self.token, self.prefix = root, schema, token, prefix
        self.shard_size, self.checksum, self.durable, self.upload = max(1, shard_size), checksum, durable, upload
        self.arrow_schema = schema.to_arrow()
        self.builders = [(name, make_builder(name, ctype)) for name, ctype in schema]
        self.names = set(schema.names)
        self.shards: list[ShardInfo] = []
        self.tmp_files: set[str] = set()
        self.rows = 0  # in the shard being built
        self.bytes = 0

    def append(self, sample: Mapping[str, Any], position: int) -> None:
        """Add one sample (``position`` names it in errors); write the shard once it is full."""
        check_keys(sample, self.names, position)
        added = 0
        for name, builder in self.builders:
            added += builder.append(sample[name], position)
        self.rows += 1
        self.bytes += added
        if self.bytes >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """Write the shard being built, if it has rows."""
        if self.rows == 0:
            return
        self.write_batch(pa.record_batch([b.finish() for _, b in self.builders], schema=self.arrow_schema))

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Write ``batch`` (of this writer's schema) as the next shard, whole."""
        name = f"{self.prefix}{len(self.shards):05d}.{self.token}.arrow"
        final = os.path.join(self.root, name)
        tmp = os.path.join(self.root, f".{name}{TMP_SUFFIX}")
        self.tmp_files.add(tmp)
        # One record batch per shard: each fixed-size column is one contiguous buffer.
        with disk(f"shard {name} in {self.root}", self.root):
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, self.arrow_schema) as ipc:
                ipc.write_batch(batch)
            if self.durable:
                _fsync_path(tmp)
        size = os.path.getsize(tmp)
        digest = checksum_file(tmp, self.checksum)
        os.replace(tmp, final)
        self.tmp_files.discard(tmp)
        info = ShardInfo(name, batch.num_rows, size, digest)
        if self.upload is not None:
            try:
                info = self.upload.put(final, info)
            finally:
                os.unlink(final)  # the staged copy (a compressed local dataset keeps only the .zst)
        self.shards.append(info)
        self.rows = 0
        self.bytes = 0

    def discard(self) -> None:
        """Delete every file this shard writer wrote (temporary files, shards, uploads)."""
        if self.upload is not None:
            self.upload.abort()
        for tmp in self.tmp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        for shard in self.shards:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, shard.file))
        self.shards.clear()


class Writer:
    """Writes samples (dicts of column name to value) into a chute dataset at ``path``.

    Use as a context manager; leaving the block normally commits the dataset, an
    exception discards everything this writer wrote::

        with chute.Writer("/data/ds", shard_size="64MB") as w:
            for sample in samples:
                w.append(sample)

    Without ``schema`` the column types are inferred from the first ``lookahead``
    samples (so a column whose shape varies within that window becomes ragged) and
    every later sample is checked against them. ``shard_size`` is the target size
    of one shard in bytes (or a string such as ``"128MB"``), ``metadata`` goes into
    the manifest, ``overwrite`` replaces a dataset already there (once this one is
    complete), ``checksum`` names the shards' hash, ``durable`` fsyncs each file
    before it is renamed (:class:`WriteOptions`).

    This class writes to a local directory (or the ``target`` storage gives it);
    ``chute.Writer`` (chute/storage/write.py) also takes a URL and compression.
    """

    def __init__(self, path: str | os.PathLike, *, target: Target | None = None, **options: Unpack[WriteOptions]) -> None:
        o = write_options(options, "chute.Writer")
        schema = o["schema"]
        if target is None:
            root = os.path.abspath(local_path(os.fspath(path), "write to"))
            target = Target(root, root)
        self.root, self.url, self.upload, self.staging = target
        self.shard_size = max(1, parse_size(o["shard_size"]))
        self.metadata = dict(o["metadata"] or {})
        self.lookahead = max(1, int(o["lookahead"]))
        self.checksum = o["checksum"]
        self.durable = o["durable"]
        self.token = secrets.token_hex(4)
        self.position = 0
        self.schema: Schema | None = None
        self.part: ShardWriter | None = None  # once the schema is known
        self.adopted: list[ShardInfo] = []  # shards other processes wrote (see adopt)
        self.pending: list[Mapping[str, Any]] = []
        self.closed = False
        self._lock_fd: int | None = None
        self._made_root = False  # this writer made the directory: an aborted write removes it if empty
        self._tmp_files: set[str] = set()
        if schema is not None:
            self._set_schema(schema if isinstance(schema, Schema) else Schema.from_dict(dict(schema)))
        self._previous = self._begin(o["overwrite"])

    # ------------------------------------------------------------------ lifecycle

    def _begin(self, overwrite: bool) -> Manifest | None:
        if self.staging is not None:
            assert self.upload is not None  # a staged write has an upload
            previous = self.upload.previous()
            if previous is not None and not overwrite:
                shutil.rmtree(self.staging, ignore_errors=True)
                raise ChuteError(
                    f"{self.url} already holds a chute dataset ({previous.rows} rows); to replace it: "
                    "chute convert --overwrite (overwrite=True in Python)"
                )
            return previous
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ChuteError(f"cannot write a dataset to {self.root}: it is a file, not a directory")
        self._made_root = not os.path.exists(self.root)
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise WriteError(f"cannot create the dataset directory {self.root}: {exc.strerror or exc}") from None
        fd = os.open(os.path.join(self.root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._made_root = False  # not ours to clean
            raise ChuteError(
                f"another process is writing a dataset to {self.root}; wait for it to finish "
                "or write to another directory"
            ) from None
        self._lock_fd = fd
        try:
            previous = self._read_previous()
            if previous is not None and not overwrite:
                raise ChuteError(
                    f"{self.root} already holds a chute dataset ({previous.rows} rows); to replace it: "
                    "chute convert --overwrite (overwrite=True in Python)"
                )
            keep = {s.stored_file for s in previous.shards} if previous else set()
            self._remove_leftovers(keep)
        except BaseException:
            self._unlock(remove=True)
            raise
        return previous

    def _read_previous(self) -> Manifest | None:
        manifest = os.path.join(self.root, MANIFEST_NAME)
        if not os.path.exists(manifest):
            return None
        try:
            with open(manifest, encoding="utf-8") as f:
                return parse_manifest(f.read(), manifest)
        except ChuteError:
            return None  # a damaged manifest: replaced by this write

    def _remove_leftovers(self, keep: set[str]) -> None:
        """Delete temporary files and unreferenced shards that dead writers left."""
        for name in os.listdir(self.root):
            if name.endswith(TMP_SUFFIX) or (_SHARD_RE.fullmatch(name) and name not in keep):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.root, name))

    def _unlock(self, remove: bool = False) -> None:
        """Drop the writer's lock; ``remove``: also its lock file, and the directory if this writer
        made it and nothing else is in it (a failed write leaves nothing behind)."""
        if self._lock_fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, LOCK_NAME))  # while still holding it: no writer sees it half-gone
        os.close(self._lock_fd)  # releases the flock
        self._lock_fd = None
        if remove and self._made_root:
            with contextlib.suppress(OSError):
                os.rmdir(self.root)  # only if empty

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.abort()

    # ------------------------------------------------------------------ samples

    #: What writes this writer's shards: a subclass of :class:`ShardWriter` (``chute.sources._blocks`` feeds
    #: blocks of rows) is made here with the same arguments, so a new writer option reaches it too.
    part_type: type[ShardWriter] = ShardWriter

    def _set_schema(self, schema: Schema) -> None:
        self.part = self.part_type(
            self.root, schema, token=self.token, shard_size=self.shard_size, checksum=self.checksum,
            durable=self.durable, upload=self.upload,
        )
        self.schema = schema

    @property
    def shards(self) -> list[ShardInfo]:
        """The finished shards, in manifest order: this writer's own, then adopted ones."""
        return (self.part.shards if self.part is not None else []) + self.adopted

    def adopt(self, shards: Iterable[ShardInfo]) -> None:
        """List shards that other processes wrote into this dataset (``chute.ray``'s tasks).

        They must be complete files of this writer's schema inside its root (or
        uploaded to its URL); the manifest lists them after this writer's own
        shards. :meth:`abort` does not delete them: their writers clean up.
        """
        if self.schema is None:
            raise ChuteError(f"the writer for {self.url} needs its schema= to adopt shards written elsewhere")
        self.adopted.extend(shards)

    def append(self, sample: Mapping[str, Any]) -> None:
        """Add one sample. Raises SchemaError if it does not fit the schema."""
        if self.closed:
            raise ChuteError(f"the writer for {self.root} is closed")
        if not isinstance(sample, Mapping):
            raise SchemaError(
                f"sample {self.position + len(self.pending)} is a {type(sample).__name__}, not a dict: chute.write "
                "takes an iterable of dicts of column name to value, e.g. {'image': array, 'label': 3}"
            )
        if self.schema is None:
            self.pending.append(sample)
            if len(self.pending) >= self.lookahead:
                self._flush_pending()
            return
        self._add(sample)

    def _flush_pending(self) -> None:
        pending, self.pending = self.pending, []
        self._set_schema(infer_schema(pending, first_position=self.position))
        for sample in pending:
            self._add(sample)

    def _add(self, sample: Mapping[str, Any]) -> None:
        assert self.part is not None  # _set_schema made it
        self.part.append(sample, self.position)
        self.position += 1

    # ------------------------------------------------------------------ commit / abort

    def close(self) -> Manifest:
        """Write the last shard and the manifest; the dataset is valid from here on."""
        if self.closed:
            raise ChuteError(f"the writer for {self.root} is already closed")
        try:
            if self.schema is None:
                if not self.pending:
                    raise ChuteError(
                        f"no samples were written to {self.root} and no schema was given; "
                        "pass schema= to write an empty dataset"
                    )
                self._flush_pending()
            assert self.part is not None and self.schema is not None  # _set_schema set both
            self.part.flush()
            manifest = Manifest(
                schema=self.schema,
                shards=tuple(self.shards),
                metadata=self.metadata,
                arrow_schema=self.schema.to_arrow(),
                created_by=f"chute {__version__}",
            )
            text = manifest.dumps()
        except BaseException:
            self.abort()
            raise
        if self.staging is not None:
            assert self.upload is not None  # a staged write has an upload
            try:
                self.upload.commit(text, self._previous, manifest.shards)
            except BaseException:
                self.abort()
                raise
            self.closed = True
            shutil.rmtree(self.staging, ignore_errors=True)
            return manifest
        target = os.path.join(self.root, MANIFEST_NAME)
        tmp = os.path.join(self.root, f".{MANIFEST_NAME}.{self.token}{TMP_SUFFIX}")
        self._tmp_files.add(tmp)
        try:
            with disk(f"the manifest of {self.root}", self.url), open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                if self.durable:
                    os.fsync(f.fileno())
            os.replace(tmp, target)
            self._tmp_files.discard(tmp)
            if self.durable:
                _fsync_path(self.root)
        except BaseException:
            self.abort()
            raise
        self.closed = True
        if self._previous is not None:
            self._remove_leftovers({s.stored_file for s in self.shards})
        self._unlock()
        return manifest

    def abort(self) -> None:
        """Discard everything this writer wrote; a previous dataset at the path stays valid."""
        if self.closed:
            return
        self.closed = True
        if self.part is not None:
            self.part.discard()
        elif self.upload is not None:
            self.upload.abort()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        for tmp in self._tmp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._unlock(remove=True)
