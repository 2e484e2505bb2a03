"""TFRecord files of tf.train.Example records, read without TensorFlow: plain and gzipped, lists, globs, URLs;
both CRCs of every record checked."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

import chute
from chute.cli import main
from chute.sources import convert

pytest.importorskip("google.protobuf")
pytest.importorskip("google_crc32c")

from chute.sources._example_pb import Example  # noqa: E402  (after the skips)
from chute.sources.tfrecord import frame  # noqa: E402


def example(i: int) -> bytes:
    """A record as TF pipelines write them: an encoded image, a label, a fixed-length embedding, variable tokens,
    a list of words, and a weight that some records lack."""
    ex = Example()
    f = ex.features.feature
    f["image/encoded"].bytes_list.value.append(b"\xff\xd8" + bytes([i % 256]) * (5 + i % 7))
    f["label"].int64_list.value.append(i % 10)
    f["embedding"].float_list.value.extend((np.arange(4, dtype=np.float32) + i / 4).tolist())
    f["tokens"].int64_list.value.extend(range(i, i + i % 5))
    f["words"].bytes_list.value.extend([w.encode() for w in ["a", "bé", "c"][: i % 4]])
    if i % 3:
        f["weight"].float_list.value.append(i / 2)
    return ex.SerializeToString()


def write(path, records: range, *, compress: bool = False) -> None:
    data = b"".join(frame(example(i)) for i in records)
    path.write_bytes(gzip.compress(data) if compress else data)


def check(ds, records: range) -> None:
    assert dict(ds.schema) == {
        "embedding": chute.Tensor("float32", (4,)), "image/encoded": chute.Bytes(), "label": chute.Scalar("int64"),
        "tokens": chute.Ragged("int64", 1), "weight": chute.Nullable(chute.Scalar("float32")), "words": chute.Json(),
    }
    rows = []
    for batch in chute.Loader(ds, batch_size=33, shuffle=False):
        for j in range(len(batch["label"])):
            rows.append({k: v[j] for k, v in batch.items()})
    assert len(rows) == len(records)
    for row, i in zip(rows, records):
        assert row["image/encoded"] == b"\xff\xd8" + bytes([i % 256]) * (5 + i % 7)
        assert int(row["label"]) == i % 10
        assert row["embedding"].tolist() == (np.arange(4, dtype=np.float32) + i / 4).tolist()
        assert row["tokens"].tolist() == list(range(i, i + i % 5))
        assert row["words"] == ["a", "bé", "c"][: i % 4]
        assert (row["weight"] is None) if i % 3 == 0 else float(row["weight"]) == i / 2


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_tfrecord_file_of_examples_converts_with_no_option(tmp_path, capsys, compress):
    write(tmp_path / "train.tfrecord", range(500), compress=compress)
    code = main(["convert", str(tmp_path / "train.tfrecord"), str(tmp_path / "ds"), "--workers", "2", "--quiet"])
    assert code == 0, capsys.readouterr().err
    check(chute.open(tmp_path / "ds"), range(500))


def test_several_files_by_list_glob_and_directory_keep_their_order(tmp_path, monkeypatch):
    monkeypatch.setattr("chute.sources.tfrecord.PART_BYTES", 2000)  # several parts per file: reader processes share a file
    (tmp_path / "d").mkdir()
    write(tmp_path / "d" / "a-0.tfrecord", range(0, 120))
    write(tmp_path / "d" / "a-1.tfrecord.gz", range(120, 200), compress=True)
    write(tmp_path / "d" / "a-2.tfrecord", range(200, 330))
    check(convert(tmp_path / "d", tmp_path / "dir", workers=2, progress=False), range(330))
    check(convert(str(tmp_path / "d" / "a-*"), tmp_path / "glob", kind="tfrecord", workers=0, progress=False), range(330))
    files = [tmp_path / "d" / "a-2.tfrecord", tmp_path / "d" / "a-0.tfrecord"]
    ds = convert(files, tmp_path / "list", workers=2, progress=False)
    assert ds.get_batch([0, 130])["label"].tolist() == [200 % 10, 0]  # the list's order
    assert ds.metadata["source"] == {"kind": "tfrecord", "files": ["a-2.tfrecord", "a-0.tfrecord"]}


def test_a_damaged_record_is_named_and_nothing_is_written(tmp_path):
    write(tmp_path / "ok.tfrecord", range(50))
    data = bytearray((tmp_path / "ok.tfrecord").read_bytes())
    third = sum(len(frame(example(i))) for i in range(2))
    data[third + 20] ^= 0xFF  # a byte of record 2's data
    (tmp_path / "bad.tfrecord").write_bytes(bytes(data))
    with pytest.raises(chute.ShardError, match=r"bad.tfrecord record 2: the data's CRC does not match; the file is truncated or damaged"):
        convert(tmp_path / "bad.tfrecord", tmp_path / "ds", workers=0, progress=False)
    (tmp_path / "short.tfrecord").write_bytes(bytes(data[: third + 30]))
    with pytest.raises(chute.ShardError, match=r"short.tfrecord record 2: the file ends inside a record of \d+ bytes"):
        convert(tmp_path / "short.tfrecord", tmp_path / "ds", workers=0, progress=False)
    data = bytearray((tmp_path / "ok.tfrecord").read_bytes())
    data[third + 3] ^= 0x01  # record 2's length
    (tmp_path / "len.tfrecord").write_bytes(bytes(data))
    with pytest.raises(chute.ShardError, match=r"len.tfrecord record 2: the length's CRC does not match"):
        convert(tmp_path / "len.tfrecord", tmp_path / "ds", workers=2, progress=False)
    assert not (tmp_path / "ds").exists()


def test_a_feature_of_two_kinds_is_an_error_naming_both_records(tmp_path):
    first, second = Example(), Example()
    first.features.feature["v"].int64_list.value.append(1)
    second.features.feature["v"].float_list.value.append(1.5)
    (tmp_path / "mixed.tfrecord").write_bytes(frame(first.SerializeToString()) + frame(second.SerializeToString()))
    with pytest.raises(chute.SchemaError, match=r"feature 'v' is a float_list in mixed.tfrecord record 1 but a int64_list in "
                                                r"mixed.tfrecord record 0"):
        convert(tmp_path / "mixed.tfrecord", tmp_path / "ds", workers=0, progress=False)
    ds = convert(tmp_path / "mixed.tfrecord", tmp_path / "ds", column_types={"v": chute.Json()}, workers=0, progress=False)
    assert [ds[0]["v"], ds[1]["v"]] == [[1], [1.5]]


def test_tfrecords_in_s3_and_over_http(moto_s3, s3_bucket, http_server, tmp_path, capsys):
    write(tmp_path / "train.tfrecord", range(80))
    data = (tmp_path / "train.tfrecord").read_bytes()
    moto_s3.client().put_object(Bucket=s3_bucket.removeprefix("s3://"), Key="tf/train-0.tfrecord", Body=data)
    ds = convert(f"{s3_bucket}/tf/train-0.tfrecord", tmp_path / "s3", storage_options=moto_s3.storage_options, progress=False)
    check(ds, range(80))
    (http_server.root / "train.tfrecord").write_bytes(data)
    code = main(["convert", http_server.url.rstrip("/") + "/train.tfrecord", str(tmp_path / "http"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    check(chute.open(tmp_path / "http"), range(80))
