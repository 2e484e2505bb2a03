"""``chute.ray.write``: Ray tasks write a chute dataset's shards in parallel; the driver commits it.

    driver: Writer (lock, overwrite check, leftovers) ──► Ray write tasks ──► manifest (on_write_complete)
    task i: blocks ──► chute's ShardWriter ──► shard-<i>-<n>.<token>.arrow at the destination ──► entries

Each write task converts its blocks to samples and writes them with chute's own
shard writer (:class:`chute.format.writer.ShardWriter`), straight into the
dataset directory or, for a URL, from a local staging directory to the object
store; it returns the manifest entries of its shards. The driver lists them in
task order and writes the manifest last, so the dataset appears whole or not at
all. When the job fails (or is interrupted on the driver), the driver deletes
every file named with this write's token; a task still running then may leave a
stray shard, never a manifest, and the next write to the place removes it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

import chute
from chute._sizes import parse_size
from chute.errors import ChuteError, SchemaError
from chute.format.manifest import Manifest, ShardInfo
from chute.format.schema import Schema
from chute.format.writer import TMP_SUFFIX, ShardWriter
from chute.ray.columns import block_samples, chute_schema, plan_block_columns
from chute.storage.net.remote import Remote, is_remote
from chute.storage.write import Writer, destination, store_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from chute.sources.parts import SourcePlan
    from chute.storage.write import StoreOptions


class ChuteDatasink(Datasink):
    """A Ray Data Datasink that writes a chute dataset at ``path`` (a directory or an fsspec URL).

    Use :func:`write`, or ``ray_dataset.write_datasink(ChuteDatasink(path, schema=...))``.
    ``schema`` is the chute schema every task writes (``chute.ray.write`` derives it
    from the Ray dataset when not given). After the write, ``manifest`` is the
    committed manifest.
    """

    def __init__(
        self, path: str | os.PathLike, *, plan: SourcePlan | None = None, parts_per_write: int | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        if options.get("schema") is None:
            raise TypeError("ChuteDatasink needs schema= (chute.ray.write derives it from the Ray dataset)")
        o = store_options(options, "ChuteDatasink")
        self.path = os.fspath(path)
        self.plan = plan  # chute convert --ray: the blocks hold part numbers of this plan
        self.parts_per_write = parts_per_write  # with a plan: how many parts make about one shard
        schema = o["schema"]
        self.schema = schema if isinstance(schema, Schema) else Schema.from_dict(dict(schema))
        self.shard_size = max(1, parse_size(o["shard_size"]))
        self.metadata = dict(o["metadata"] or {})
        self.overwrite = o["overwrite"]
        self.compression = o["compression"]
        self.storage_options = dict(o["storage_options"] or {})
        self.durable = o["durable"]
        self.token = secrets.token_hex(4)  # names every file this write makes, so a failed write can find them
        self.manifest: Manifest | None = None
        self._writer: Writer | None = None  # the driver's: lock, overwrite check, manifest

    @property
    def min_bytes_per_write(self) -> int | None:
        """Ray bundles blocks until a write task has about a shard's worth: small blocks are coalesced,
        not written as a shard each (200 blocks of 10 rows made 200 shards)."""
        return self.shard_size if self.plan is None else None

    @property
    def min_rows_per_write(self) -> int | None:
        """With a plan, the blocks hold part numbers: a write task takes enough parts for about one shard."""
        return self.parts_per_write if self.plan is not None else None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_writer"] = None  # tasks never commit; the driver's writer holds a lock
        return state

    # ------------------------------------------------------------------ driver

    def open(self) -> None:
        """Take the destination (runs on the driver before any task; idempotent)."""
        if self._writer is None:
            self._writer = Writer(
                self.path, schema=self.schema, shard_size=self.shard_size, metadata=self.metadata,
                overwrite=self.overwrite, compression=self.compression, storage_options=self.storage_options,
                durable=self.durable,
            )

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        self.open()

    def on_write_complete(self, write_result: WriteResult) -> None:
        self.open()  # an empty dataset has no first bundle, hence no on_write_start
        assert self._writer is not None  # open() made it
        reports = sorted((r for r in write_result.write_returns if r), key=lambda r: r["task"])
        shards = [ShardInfo(**entry) for report in reports for entry in report["shards"]]
        try:
            self._check_visible(shards)
            self._writer.adopt(shards)
            self.manifest = self._writer.close()
        except BaseException:
            self.abort()
            raise
        self._sweep(keep={s.stored_file for s in shards})  # shards of failed attempts of retried tasks

    def on_write_failed(self, error: Exception) -> None:
        self.abort()

    def abort(self) -> None:
        """Delete what this write made (a previous dataset at the destination stays valid).

        The tasks' shards first, then the writer's own files: it removes the
        destination folder too if it made it and nothing else is left in it.
        """
        self._sweep(keep=set())
        if self._writer is not None:
            self._writer.abort()

    def _check_visible(self, shards: list[ShardInfo]) -> None:
        """A local destination must be one file system for every node: check the driver sees each shard."""
        assert self._writer is not None  # the driver's, made by open()
        if is_remote(self._writer.url):
            return
        for info in shards:
            path = os.path.join(self._writer.root, info.stored_file)
            size = os.path.getsize(path) if os.path.exists(path) else None
            if size != (info.stored_bytes or info.bytes):
                raise ChuteError(
                    f"shard {info.stored_file} that a Ray task wrote is not in {self._writer.root} on the driver's "
                    "node; on a cluster, write to a file system every node shares or to an object store URL"
                )

    def _sweep(self, keep: set[str]) -> None:
        """Delete the files named with this write's token, except ``keep``."""
        mine = re.compile(rf"\.?shard-\d{{5,}}(-\d{{5,}})?\.{self.token}\.arrow(\.zst)?({re.escape(TMP_SUFFIX)})?")
        url = self._writer.url if self._writer is not None else self.path
        if not is_remote(url):
            root = os.path.abspath(url.removeprefix("file://"))
            names = os.listdir(root) if os.path.isdir(root) else []
            for name in names:
                if mine.fullmatch(name) and name not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(root, name))
            return
        remote = Remote(url, self.storage_options)
        with contextlib.suppress(Exception):  # listing is best effort: the manifest is what makes a dataset
            for path in remote.fs.ls(remote.path(""), detail=False):
                name = path.rstrip("/").rsplit("/", 1)[-1]
                if mine.fullmatch(name) and name not in keep:
                    remote.remove(name)

    # ------------------------------------------------------------------ tasks

    def write(self, blocks: Iterable[Block], ctx) -> dict[str, Any]:
        """One write task: its blocks as shards ``shard-<task>-<n>.<token>.arrow``; their manifest entries."""
        task = int(ctx.task_idx)
        root, url, upload, staging = destination(self.path, self.storage_options, self.compression)
        if staging is None:
            os.makedirs(root, exist_ok=True)
        part = ShardWriter(
            root, self.schema, token=self.token, prefix=f"shard-{task:05d}-", shard_size=self.shard_size,
            durable=self.durable, upload=upload,
        )
        where = f"chute.ray.write task {task} (to {url})"
        try:
            for position, (sample, origin) in enumerate(self._samples(blocks, where)):
                try:
                    part.append(sample, position)
                except SchemaError as exc:
                    raise SchemaError(f"{where}: {exc} [sample {position} of the task is {origin}]") from None
            part.flush()
        except BaseException:
            part.discard()
            raise
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        return {"task": task, "shards": [s.to_json() for s in part.shards]}

    def _samples(self, blocks: Iterable[Block], where: str) -> Iterator[tuple[dict[str, Any], str]]:
        """The task's ``(sample, origin)`` pairs: its blocks' rows, or the rows of the parts they name."""
        if self.plan is not None:
            for block in blocks:
                parts: Any = BlockAccessor.for_block(block).to_numpy("part")  # one column: an array
                for number in parts.tolist():
                    yield from self.plan.read(self.plan.parts[number])
            return
        columns = None
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if columns is None:
                columns = plan_block_columns(table.schema, self.schema, where)
            for sample in block_samples(table, columns, where):
                yield sample, where

    def get_name(self) -> str:
        return "ChuteWrite"


def write(
    ray_dataset: ray.data.Dataset, path: str | os.PathLike, *, concurrency: int | None = None, **options: Unpack[StoreOptions],
) -> chute.Dataset:
    """Write ``ray_dataset`` as a chute dataset at ``path`` with Ray tasks, and open it.

    ``path`` is a local directory (on a cluster: one every node shares) or an
    fsspec URL (``s3://bucket/prefix``; ``storage_options`` go to fsspec). Each
    Ray write task writes its rows as shards of about ``shard_size`` bytes
    straight to the destination; the manifest is written last, by this process,
    once every task has finished. If the job fails, nothing valid is left (and a
    dataset that was at ``path`` stays as it was).

    Without ``schema`` the chute column types come from the Ray dataset's schema
    (Ray's tensor columns become tensors of that shape; see
    :mod:`chute.ray.columns`); a row that does not fit fails the write with a
    :class:`chute.SchemaError` naming the column. Rows are in the order of the
    Ray write tasks (set ``DataContext.execution_options.preserve_order`` for
    the Ray dataset's own order).
    """
    store_options(options, "chute.ray.write")
    if options.get("schema") is None:
        arrow_schema = _arrow_schema(ray_dataset)
        if arrow_schema is None:
            raise ChuteError(f"cannot write {path}: the Ray dataset has no schema (is it empty?); pass schema=")
        options["schema"] = chute_schema(plan_block_columns(arrow_schema, None, f"chute.ray.write to {os.fspath(path)}"))
    return run(ray_dataset, ChuteDatasink(path, **options), concurrency)


def run(ray_dataset: ray.data.Dataset, sink: ChuteDatasink, concurrency: int | None = None) -> chute.Dataset:
    """Write ``ray_dataset`` through ``sink``; the committed dataset, opened."""
    sink.open()  # an existing dataset or a concurrent writer is refused before any task runs
    try:
        ray_dataset.write_datasink(sink, concurrency=concurrency)
    except BaseException:  # write_datasink calls on_write_failed for an Exception only, not for Ctrl-C
        sink.abort()
        raise
    from chute.storage.open import open_dataset

    assert sink._writer is not None  # the write committed through it
    return open_dataset(sink._writer.url, storage_options=sink.storage_options)


def _arrow_schema(ray_dataset: ray.data.Dataset) -> pa.Schema | None:
    """The Ray dataset's Arrow schema (Ray runs its first block when it is not known)."""
    schema = ray_dataset.schema()
    if schema is None:
        return None
    base = getattr(schema, "base_schema", schema)
    if not isinstance(base, pa.Schema):
        raise ChuteError(f"the Ray dataset's blocks are not Arrow tables ({type(base).__name__}); pass schema=")
    return base
