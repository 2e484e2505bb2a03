"""The WebDataset converter: members grouped by key, columns by extension, tars in sorted order."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from source_data import image_bytes, no_dataset_at

import chute
from chute.errors import ChuteError
from chute.sources import from_webdataset
from chute.sources.webdataset import expand_braces, split_name


def _write_tar(path, samples: list[tuple[str, dict[str, bytes]]], mode: str = "w") -> None:
    with tarfile.open(path, mode) as tar:
        for key, fields in samples:
            for field, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _samples(first: int, n: int) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (
            f"train/{i:06d}",
            {
                "jpg": image_bytes("JPEG", seed=i),
                "cls": f"{i % 10}\n".encode(),
                "json": json.dumps({"id": i, "tags": ["x"] * (i % 3)}).encode(),
                "txt": f"caption {i} ✓".encode(),
                "seg.png": image_bytes("PNG", seed=1000 + i),
            },
        )
        for i in range(first, first + n)
    ]


def test_samples_grouped_decoded_and_in_sorted_tar_order(tmp_path, no_fd_leak):
    src = tmp_path / "shards"
    src.mkdir()
    _write_tar(src / "shard-000002.tar", _samples(20, 10))
    _write_tar(src / "shard-000000.tar", _samples(0, 12))
    _write_tar(src / "shard-000001.tar.gz", _samples(12, 8), mode="w:gz")
    ds = from_webdataset(src, tmp_path / "out", progress=False)
    ds.verify()
    s = ds.schema
    assert s.names == ["__key__", "jpg", "cls", "json", "txt", "seg.png"]
    assert s["cls"] == chute.Scalar("int64") and s["json"] == chute.Json() and s["txt"] == chute.String()
    assert s["jpg"] == chute.Bytes() and s["seg.png"] == chute.Bytes()
    assert len(ds) == 30
    expected = dict(_samples(0, 30))
    for i in range(30):
        row = ds[i]
        assert row["__key__"] == f"train/{i:06d}"
        fields = expected[row["__key__"]]
        assert row["jpg"] == fields["jpg"] and row["seg.png"] == fields["seg.png"]
        assert row["cls"] == i % 10
        assert row["json"] == {"id": i, "tags": ["x"] * (i % 3)}
        assert row["txt"] == f"caption {i} ✓"


def test_brace_pattern_and_glob(tmp_path):
    for k in range(3):
        _write_tar(tmp_path / f"s-{k:02d}.tar", _samples(4 * k, 4))
    ds = from_webdataset(str(tmp_path / "s-{00..01}.tar"), tmp_path / "braces", progress=False)
    assert [ds[i]["cls"] for i in range(len(ds))] == list(range(8))
    ds = from_webdataset(str(tmp_path / "s-*.tar"), tmp_path / "glob", progress=False)
    assert len(ds) == 12
    assert expand_braces("a{8..10}b{0..1}") == ["a8b0", "a8b1", "a9b0", "a9b1", "a10b0", "a10b1"]
    assert expand_braces("s{08..10}") == ["s08", "s09", "s10"]


def test_a_sample_missing_a_field_names_the_tar_and_key(tmp_path):
    samples = _samples(0, 6)
    del samples[4][1]["json"]
    _write_tar(tmp_path / "a.tar", samples)
    with pytest.raises(ChuteError) as info:
        from_webdataset(tmp_path / "a.tar", tmp_path / "out", shard_size=100, progress=False)
    message = str(info.value)
    assert "a.tar" in message and "train/000004" in message and "json" in message
    assert no_dataset_at(tmp_path / "out")


def test_keys_split_at_the_first_dot_of_the_file_name(tmp_path):
    assert split_name("dir.v2/sub/0001.seg.png") == ("dir.v2/sub/0001", "seg.png")
    assert split_name("0001.jpg") == ("0001", "jpg")
    assert split_name("README") is None
    assert split_name("dir/.hidden") is None


def test_scattered_key_and_bad_cls_are_errors(tmp_path):
    samples = _samples(0, 3)
    _write_tar(tmp_path / "scattered.tar", samples + [samples[0]])
    with pytest.raises(ChuteError, match="appears twice"):
        from_webdataset(tmp_path / "scattered.tar", tmp_path / "out", progress=False)
    samples[1][1]["cls"] = b"dog"
    _write_tar(tmp_path / "badcls.tar", samples)
    with pytest.raises(ChuteError, match=r"badcls\.tar, sample 'train/000001': field 'cls'"):
        from_webdataset(tmp_path / "badcls.tar", tmp_path / "out", progress=False)
    _write_tar(tmp_path / "empty.tar", [])
    with pytest.raises(ChuteError, match="no samples"):
        from_webdataset(tmp_path / "empty.tar", tmp_path / "out", progress=False)
