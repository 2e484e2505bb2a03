"""Sources in remote storage: an index and a JSON lines file served by moto's S3 and by an HTTP server."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute
from chute.cli import main
from chute.sources import convert


def _put(moto_s3, bucket: str, key: str, data: bytes) -> None:
    moto_s3.client().put_object(Bucket=bucket.removeprefix("s3://"), Key=key, Body=data)


def _pickle(value) -> bytes:
    return gzip.compress(pickle.dumps(value))


SAMPLES = [{"x": np.arange(4, dtype=np.float32) + i, "label": i, "meta": {"id": f"s{i}"}} for i in range(6)]
LINES = [{"text": f"line {i}", "score": i / 2, "tags": {"lang": "en"}} if i != 3 else {"text": "line 3", "score": 1.5, "tags": {}}
         for i in range(5)]


def _check_index(ds) -> None:
    assert ds.schema.names == ["path", "x", "label", "meta.id"]
    batch = ds.get_batch(list(range(6)))
    assert np.array_equal(batch["x"].numpy(), np.stack([s["x"] for s in SAMPLES]))
    assert batch["label"].tolist() == list(range(6)) and batch["meta.id"] == [f"s{i}" for i in range(6)]


def _check_lines(ds) -> None:
    assert ds.schema["tags.lang"] == chute.Nullable(chute.String())
    batch = ds.get_batch(list(range(5)))
    assert batch["text"] == [line["text"] for line in LINES]
    assert batch["score"].tolist() == [line["score"] for line in LINES]
    assert batch["tags.lang"] == ["en", "en", "en", None, "en"]


def test_index_and_jsonl_in_s3(moto_s3, s3_bucket, tmp_path, capsys):
    for i, sample in enumerate(SAMPLES):
        _put(moto_s3, s3_bucket, f"data/files/{i}.pkl.gz", _pickle(sample))
    _put(moto_s3, s3_bucket, "data/index.csv", ("path\n" + "".join(f"files/{i}.pkl.gz\n" for i in range(6))).encode())
    _put(moto_s3, s3_bucket, "lines/a.jsonl", "".join(json.dumps(line) + "\n" for line in LINES).encode())
    code = main(["convert", f"{s3_bucket}/data/index.csv", str(tmp_path / "index"), "--allow-pickle", "--workers", "0", "--quiet"])
    assert code == 0, capsys.readouterr().err
    _check_index(chute.open(tmp_path / "index"))
    # to a remote destination too, as chute.write does
    ds = convert(f"{s3_bucket}/lines/a.jsonl", f"{s3_bucket}/out-lines", progress=False, storage_options=moto_s3.storage_options)
    _check_lines(chute.open(f"{s3_bucket}/out-lines", storage_options=moto_s3.storage_options))
    assert ds.root.startswith("s3://") or len(ds) == 5


def test_index_jsonl_and_parquet_over_http(http_server, tmp_path, capsys):
    root, base = http_server.root, http_server.url.rstrip("/")
    (root / "data" / "files").mkdir(parents=True)
    for i, sample in enumerate(SAMPLES):
        (root / "data" / "files" / f"{i}.pkl.gz").write_bytes(_pickle(sample))
    (root / "data" / "index.csv").write_text("path\n" + "".join(f"files/{i}.pkl.gz\n" for i in range(6)))
    (root / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES))
    pq.write_table(pa.table({"a": list(range(5)), "b": [f"v{i}" for i in range(5)]}), root / "t.parquet")
    code = main(["convert", f"{base}/data/index.csv", str(tmp_path / "index"), "--allow-pickle", "--workers", "1", "--quiet"])
    assert code == 0, capsys.readouterr().err
    _check_index(chute.open(tmp_path / "index"))
    code = main(["convert", f"{base}/a.jsonl", str(tmp_path / "lines"), "--quiet"])
    assert code == 0, capsys.readouterr().err
    _check_lines(chute.open(tmp_path / "lines"))
    ds = convert(f"{base}/t.parquet", tmp_path / "pq", progress=False)
    assert ds.get_batch([0, 4])["b"] == ["v0", "v4"]


def test_a_missing_remote_file_is_named(http_server, tmp_path, capsys):
    root, base = http_server.root, http_server.url.rstrip("/")
    (root / "index.csv").write_text("path\nfiles/0.json\n")
    code = main(["convert", f"{base}/index.csv", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "files/0.json does not exist" in err and f"{base}/files/0.json" in err


def test_a_source_file_over_the_read_limit_is_refused_naming_the_setting(http_server, tmp_path, capsys, monkeypatch):
    root, base = http_server.root, http_server.url.rstrip("/")
    (root / "files").mkdir()
    (root / "files" / "0.json").write_text(json.dumps({"x": "y" * 4000}))
    (root / "index.csv").write_text("path\nfiles/0.json\n")
    monkeypatch.setenv("CHUTE_SOURCE_READ_LIMIT", "2KiB")
    code = main(["convert", f"{base}/index.csv", str(tmp_path / "out"), "--workers", "0", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and f"{base}/files/0.json is larger than 2.0 KiB" in err and "CHUTE_SOURCE_READ_LIMIT" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


@pytest.mark.parametrize("how", ["no-length", "huge-length"])
def test_a_source_copy_stops_at_the_size_the_server_gave_and_is_retried(http_server, tmp_path, how, monkeypatch):
    root, base = http_server.root, http_server.url.rstrip("/")
    (root / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES))
    http_server.oversend("a.jsonl", extra=64 << 20, how=how, times=1)
    copies = []
    real = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: copies.append(real(**kw)) or copies[-1])
    ds = convert(f"{base}/a.jsonl", tmp_path / "lines", progress=False)
    _check_lines(ds)
    assert http_server.log.count("a.jsonl") == 2  # the over-sent body, then a whole one
    assert copies and not any(os.path.exists(c) for c in copies)


def test_a_source_copy_that_would_fill_the_disk_is_refused_before_it_starts(http_server, tmp_path, monkeypatch):
    from chute.sources import _remote

    root, base = http_server.root, http_server.url.rstrip("/")
    (root / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LINES))
    monkeypatch.setattr(_remote, "DISK_RESERVE", shutil.disk_usage(tempfile.gettempdir()).free)
    with pytest.raises(chute.ChuteError, match="would leave less than .* free on that disk .* point TMPDIR at a disk with room"):
        convert(f"{base}/a.jsonl", tmp_path / "lines", progress=False)
    assert http_server.log.count("a.jsonl", method="GET") == 0
