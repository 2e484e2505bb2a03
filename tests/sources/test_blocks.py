"""The array and record sources' write path takes chute.Writer's options from their one definition: a new writer
option reaches the block writer with nothing to copy by hand."""

from __future__ import annotations

import inspect
import typing

import numpy as np
import pytest

import chute
from chute.format.schema import Scalar, Tensor
from chute.format.writer import WRITE_DEFAULTS, ShardWriter
from chute.sources._blocks import BlockShards, BlockWriter, write_blocks
from chute.sources._progress import Progress
from chute.storage.write import STORE_DEFAULTS, StoreOptions, Writer

SCHEMA = {"x": Tensor("float32", (3,)), "label": Scalar("int64")}


def _blocks(rows: int = 50):
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    yield {"x": x, "label": np.arange(rows)}, rows, "block 0"


def test_every_writer_option_reaches_the_block_shards_as_the_writer_passes_it(tmp_path):
    options = set(typing.get_type_hints(StoreOptions))
    assert options == set(WRITE_DEFAULTS) | set(STORE_DEFAULTS)  # every option has its default
    given = {"schema": SCHEMA, "shard_size": "1KB", "checksum": "blake2b", "durable": False, "lookahead": 7}
    plain, blocks = Writer(tmp_path / "a", **given), BlockWriter(tmp_path / "b", **given)
    try:
        assert type(plain.part) is ShardWriter and type(blocks.part) is BlockShards
        arguments = [p for p in inspect.signature(ShardWriter.__init__).parameters if p not in ("self", "token")]
        for name in arguments:  # the same constructor arguments, whatever ShardWriter comes to take
            mine, theirs = getattr(blocks.part, name), getattr(plain.part, name)
            assert mine == theirs or (name == "root" and mine.endswith("b")), name
    finally:
        plain.abort()
        blocks.abort()


def test_write_blocks_takes_every_writer_option_and_no_other(tmp_path):
    ds = write_blocks(_blocks(), tmp_path / "ds", progress=Progress(50, "", enabled=False), schema=SCHEMA,
                      shard_size="256B", checksum="blake2b", compression="zstd", metadata={"k": 1}, durable=False)
    assert len(ds) == 50 and ds.metadata == {"k": 1} and len(ds.shards) > 1
    assert all(s.checksum.startswith("blake2b:") and s.compression == "zstd" for s in ds.shards)
    assert ds.get_batch([49])["label"].tolist() == [49]
    ds.close()
    with pytest.raises(TypeError, match="write_blocks got unexpected keyword argument"):
        write_blocks(_blocks(), tmp_path / "other", progress=Progress(50, "", enabled=False), schema=SCHEMA, nope=1)
    with pytest.raises(TypeError, match="write_blocks needs schema="):
        write_blocks(_blocks(), tmp_path / "other", progress=Progress(50, "", enabled=False))
    assert not (tmp_path / "other").exists()
    assert chute.open(tmp_path / "ds").schema.names == ["x", "label"]


@pytest.mark.parametrize("block_rows", [1, 13, 500])
@pytest.mark.parametrize("json", [False, True], ids=["str-bytes", "and-json"])  # (JSON: appended one by one)
def test_blocks_of_str_and_bytes_are_cut_into_the_shards_the_per_sample_writer_makes(tmp_path, block_rows, json):
    rng = np.random.default_rng(1)
    rows = [{"name": "n" * int(rng.integers(0, 90)), "raw": bytes(int(rng.integers(0, 300))), "label": i,
             **({"tags": ["a"] * (i % 3)} if json else {})} for i in range(500)]
    expected = chute.write(rows, tmp_path / "samples", shard_size="2KB")
    schema = dict(expected.schema)

    def blocks():
        for a in range(0, len(rows), block_rows):
            part = rows[a : a + block_rows]
            block = {name: [r[name] for r in part] for name in schema}
            block["label"] = np.asarray(block["label"])
            yield block, len(part), f"rows {a}"

    ds = write_blocks(blocks(), tmp_path / "blocks", progress=Progress(len(rows), "", enabled=False), schema=schema,
                      shard_size="2KB")
    assert [s.rows for s in ds.shards] == [s.rows for s in expected.shards] and len(ds.shards) > 5
    got = ds.get_batch(np.arange(500), columnar=True)
    want = expected.get_batch(np.arange(500), columnar=True)
    assert all(got[name] == want[name] for name in schema if name != "label")
    assert got["label"].tolist() == list(range(500))
