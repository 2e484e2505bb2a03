"""chute.ray: Ray tasks write a chute dataset that chute reads back whole; a failed job leaves none."""

from __future__ import annotations

import os

import numpy as np
import pytest

ROWS = 20_000
ROW_BYTES = 3 * 4 * 4 + 8  # x: uint8[3, 4, 4], id: int64


def _rows(batch):
    ids = batch["id"]
    x = (ids[:, None, None, None] * 7 + np.arange(48).reshape(1, 3, 4, 4)) % 251
    return {"id": ids, "x": x.astype(np.uint8), "name": np.array([f"row-{i}" for i in ids], dtype=object)}


def _expected_x(ids: np.ndarray) -> np.ndarray:
    return ((ids[:, None, None, None] * 7 + np.arange(48).reshape(1, 3, 4, 4)) % 251).astype(np.uint8)


def _source(ray, rows: int = ROWS, blocks: int = 8):
    return ray.data.range(rows, override_num_blocks=blocks).map_batches(_rows, batch_size=1000)


def test_several_tasks_write_several_shards_and_every_row_comes_back_once(local_ray, tmp_path):
    import chute.ray

    ds = chute.ray.write(_source(local_ray), tmp_path / "ds", shard_size=2500 * ROW_BYTES)

    assert len(ds) == ROWS
    tasks = {s.file.split("-")[1] for s in ds.shards}
    assert len(tasks) >= 2 and len(ds.shards) > len(tasks)  # several tasks, several shards each
    assert ds.schema == chute.Schema.from_dict({"id": chute.Scalar("int64"), "x": chute.Tensor("uint8", (3, 4, 4)), "name": chute.String()})
    reopened = chute.open(tmp_path / "ds")
    reopened.verify()  # sizes and checksums as listed
    batch = reopened.get_batch(np.arange(ROWS))
    ids = batch["id"].numpy()
    assert sorted(ids.tolist()) == list(range(ROWS))
    np.testing.assert_array_equal(batch["x"].numpy(), _expected_x(ids))
    assert batch["name"][:3] == [f"row-{i}" for i in ids[:3]]
    assert sorted(os.listdir(tmp_path / "ds")) == sorted([".chute-write.lock", "manifest.json", *(s.file for s in ds.shards)])
    reopened.close()
    ds.close()


def test_a_shard_is_byte_for_byte_what_chute_write_makes(local_ray, tmp_path):
    import chute.ray

    ds = chute.ray.write(_source(local_ray, 3000, 2), tmp_path / "ray", shard_size=10**9)
    first = ds.shards[0]
    rows = ds.get_batch(np.arange(first.rows))
    samples = ({"id": int(i), "x": x.numpy(), "name": n} for i, x, n in zip(rows["id"], rows["x"], rows["name"]))
    same = chute.write(samples, tmp_path / "plain", schema=ds.schema, shard_size=10**9)
    with open(tmp_path / "ray" / first.file, "rb") as a, open(tmp_path / "plain" / same.shards[0].file, "rb") as b:
        assert a.read() == b.read()
    assert same.shards[0].checksum == first.checksum
    ds.close()
    same.close()


def test_a_task_failing_mid_write_leaves_no_dataset(local_ray, tmp_path):
    import chute.ray

    def fail_late(batch):
        if (batch["id"] >= 15_000).any():
            raise RuntimeError("source unreadable at row 15000")
        return _rows(batch)

    source = local_ray.data.range(ROWS, override_num_blocks=8).map_batches(fail_late, batch_size=500)
    with pytest.raises(Exception, match="source unreadable at row 15000"):
        chute.ray.write(source, tmp_path / "ds", shard_size=500 * ROW_BYTES)
    assert not os.path.exists(tmp_path / "ds")  # shards written before the failure, the lock file and the folder: gone
    with pytest.raises(chute.ManifestError, match="does not exist"):
        chute.open(tmp_path / "ds")


def test_a_failed_overwrite_keeps_the_previous_dataset(local_ray, tmp_path):
    import chute.ray

    before = chute.write(({"id": i} for i in range(10)), tmp_path / "ds")
    before.close()

    def fail(batch):
        raise RuntimeError("no")

    with pytest.raises(chute.ChuteError, match="already holds a chute dataset"):
        chute.ray.write(_source(local_ray, 100, 1), tmp_path / "ds")
    with pytest.raises(Exception, match="no"):
        chute.ray.write(local_ray.data.range(100).map_batches(fail), tmp_path / "ds", overwrite=True)
    after = chute.open(tmp_path / "ds")
    assert after.get_batch(np.arange(10))["id"].tolist() == list(range(10))
    after.close()


def test_a_row_that_does_not_fit_the_schema_fails_naming_the_column(local_ray, tmp_path):
    import chute.ray

    def bad(batch):
        # 0.5 has no exact uint8 value: refused (an exact cast, such as 0.0, would be taken)
        return {"id": batch["id"], "x": np.full((len(batch["id"]), 2), 0.5, np.float32)}

    with pytest.raises(Exception, match="column 'x': expected uint8 tensor"):
        chute.ray.write(
            local_ray.data.range(50).map_batches(bad), tmp_path / "ds",
            schema={"id": chute.Scalar("int64"), "x": chute.Tensor("uint8", (2,))},
        )
    assert not os.path.exists(tmp_path / "ds" / "manifest.json")


def test_round_trip_through_chute_ray_read(local_ray, tmp_path):
    import chute.ray

    samples = [
        {"image": np.full((2, 3), i % 256, np.uint8), "label": i, "blob": bytes([i % 256]) * (i % 5), "tokens": np.arange(i % 7, dtype=np.int32)}
        for i in range(1000)
    ]
    schema = {"image": chute.Tensor("uint8", (2, 3)), "label": chute.Scalar("int64"), "blob": chute.Bytes(), "tokens": chute.Ragged("int32")}
    ds = chute.write(samples, tmp_path / "ds", schema=schema, shard_size=4000)
    assert len(ds.shards) > 2
    rows = sorted(chute.ray.read(tmp_path / "ds", shards_per_task=2).take_all(), key=lambda r: r["label"])
    assert [r["label"] for r in rows] == list(range(1000))
    for row, sample in zip(rows, samples):
        np.testing.assert_array_equal(row["image"], sample["image"])
        assert bytes(row["blob"]) == sample["blob"]
        np.testing.assert_array_equal(row["tokens"], sample["tokens"])
    again = chute.ray.write(chute.ray.read(ds), tmp_path / "again", schema=ds.schema)
    assert sorted(again.get_batch(np.arange(1000))["label"].tolist()) == list(range(1000))
    ds.close()
    again.close()


def test_write_to_s3_then_open(local_ray, moto_s3, s3_bucket, tmp_path):
    import chute.ray

    url = s3_bucket + "/ray"
    chute.ray.write(_source(local_ray, 4000, 4), url, shard_size=1000 * ROW_BYTES, storage_options=moto_s3.storage_options)
    ds = chute.open(url, cache_dir=tmp_path / "cache", storage_options=moto_s3.storage_options)
    ids = ds.get_batch(np.arange(4000))["id"].numpy()
    assert sorted(ids.tolist()) == list(range(4000))
    keys = {o["Key"] for o in moto_s3.client().list_objects_v2(Bucket=s3_bucket[5:])["Contents"]}
    assert keys == {"ray/manifest.json", *(f"ray/{s.file}" for s in ds.shards)}
    ds.close()


def test_small_blocks_are_coalesced_into_shards_of_shard_size(local_ray, tmp_path):
    """200 blocks of 10 rows with a shard size above their total: one shard, not 200."""
    import chute.ray

    source = local_ray.data.range(2000, override_num_blocks=200).map_batches(_rows, batch_size=10)
    ds = chute.ray.write(source, tmp_path / "ds", shard_size="4MB")
    assert len(ds) == 2000 and len(ds.shards) == 1
    assert sorted(ds.get_batch(np.arange(2000))["id"].tolist()) == list(range(2000))
    ds.close()
