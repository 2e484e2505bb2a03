"""Bad input is refused with a message naming the sample, column or shard; failed writes leave nothing valid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import chute
from chute.format.writer import LOCK_NAME
from tests.conftest import image_samples


def _write_small(path, n=40, shard_size=600):
    return chute.write(image_samples(n), path, shard_size=shard_size)


def _manifest(path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _rewrite_manifest(path, change) -> None:
    data = _manifest(path)
    change(data)
    (path / "manifest.json").write_text(json.dumps(data))


def _leftovers(path) -> list[str]:
    """What a write left in ``path`` besides a committed dataset's lock file (a failed write
    removes the folder it made)."""
    if not os.path.exists(path):
        return []
    return sorted(n for n in os.listdir(path) if n != LOCK_NAME)


# ----------------------------------------------------------------------------- schema


def test_schema_mismatch_names_position_column_expected_and_found(tmp_path):
    samples = list(image_samples(100))
    samples.append({"image": np.zeros((3, 8, 7), np.uint8), "label": 100})
    with pytest.raises(chute.SchemaError) as error:
        chute.write(samples, tmp_path / "ds")
    message = str(error.value)
    assert "sample 100" in message and "column 'image'" in message
    assert "uint8 tensor of shape (3, 8, 8)" in message and "shape (3, 8, 7)" in message
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"image": np.full((3, 8, 8), 0.5, np.float32), "label": 1}, "float32 array"),  # not exactly uint8
        ({"image": np.zeros((3, 8, 8), np.uint8), "label": "one"}, "expected int64 scalar, found str"),
        ({"image": np.zeros((3, 8, 8), np.uint8), "label": None}, "found NoneType"),
        ({"image": np.zeros((3, 8, 8), np.uint8)}, "missing column(s) ['label']"),
        ({"image": np.zeros((3, 8, 8), np.uint8), "label": 1, "extra": 2}, "unexpected column(s) ['extra']"),
        ([1, 2], "sample 70 is a list"),
    ],
)
def test_later_sample_that_does_not_fit(tmp_path, bad, expected):
    samples = [*image_samples(70), bad]
    with pytest.raises(chute.SchemaError, match="sample 70") as error:
        chute.write(samples, tmp_path / "ds")
    assert expected in str(error.value)


def test_none_in_first_sample_is_explained(tmp_path):
    with pytest.raises(chute.SchemaError, match="not nullable"):
        chute.write([{"x": None}], tmp_path / "ds")


def test_unsupported_values(tmp_path):
    with pytest.raises(chute.SchemaError, match="cannot store a value of type object"):
        chute.write([{"x": object()}], tmp_path / "a")
    with pytest.raises(chute.SchemaError, match="complex128"):
        chute.write([{"x": np.zeros(3, np.complex128)}], tmp_path / "b")
    with pytest.raises(chute.ChuteError, match="no samples"):
        chute.write([], tmp_path / "c")


def test_empty_dataset_with_declared_schema(tmp_path):
    ds = chute.write([], tmp_path / "ds", schema={"x": chute.Tensor("float32", (2,))})
    assert len(ds) == 0 and ds.get_batch([])["x"].shape == (0, 2)


# ----------------------------------------------------------------------------- manifest and shards


def test_unknown_format_version(tmp_path):
    _write_small(tmp_path / "ds")
    _rewrite_manifest(tmp_path / "ds", lambda m: m.update(format_version=99))
    with pytest.raises(chute.ManifestError, match="format version 99.*reads version 1"):
        chute.open(tmp_path / "ds")


@pytest.mark.parametrize(
    ("file", "expected"),
    [("../outside.arrow", "escapes the dataset root"), ("a/../../x.arrow", "escapes"), ("/etc/passwd", "is absolute"), ("..", "escapes")],
)
def test_shard_path_escaping_the_root(tmp_path, file, expected):
    _write_small(tmp_path / "ds")
    _rewrite_manifest(tmp_path / "ds", lambda m: m["shards"][0].update(file=file))
    with pytest.raises(chute.ManifestError, match=expected) as error:
        chute.open(tmp_path / "ds")
    assert "shard 0" in str(error.value)


def test_symlinked_shard_pointing_outside_is_refused(tmp_path):
    ds = _write_small(tmp_path / "ds")
    outside = tmp_path / "outside.arrow"
    first = tmp_path / "ds" / ds.shards[0].file
    os.replace(first, outside)
    os.symlink(outside, first)
    with pytest.raises(chute.ManifestError, match="resolves outside the dataset root"):
        chute.open(tmp_path / "ds")


def test_missing_shard(tmp_path):
    ds = _write_small(tmp_path / "ds")
    os.unlink(tmp_path / "ds" / ds.shards[1].file)
    with pytest.raises(chute.ShardError, match=f"shard {ds.shards[1].file} is missing"):
        chute.open(tmp_path / "ds")


def test_truncated_shard_caught_at_open(tmp_path):
    ds = _write_small(tmp_path / "ds")
    path = tmp_path / "ds" / ds.shards[2].file
    os.truncate(path, ds.shards[2].bytes - 100)
    with pytest.raises(chute.ShardError, match=f"{ds.shards[2].file} is {ds.shards[2].bytes - 100} bytes.*truncated"):
        chute.open(tmp_path / "ds")


def test_truncated_shard_with_doctored_manifest_caught_at_first_read(tmp_path):
    ds = _write_small(tmp_path / "ds")
    info = ds.shards[0]
    os.truncate(tmp_path / "ds" / info.file, info.bytes // 2)
    _rewrite_manifest(tmp_path / "ds", lambda m: m["shards"][0].update(bytes=info.bytes // 2))
    reopened = chute.open(tmp_path / "ds")  # sizes agree: open is O(shards) and does not read data
    with pytest.raises(chute.ShardError, match=f"{info.file} .* has checksum .* the manifest says"):
        reopened.get_batch([0])  # verified when first read
    with pytest.raises(chute.ShardError, match="checksum"):
        reopened.verify()
    unverified = chute.open(tmp_path / "ds", verify=False)  # structure only: still refused
    with pytest.raises(chute.ShardError, match=f"{info.file} is not a readable Arrow IPC file"):
        unverified.get_batch([0])


def test_corrupted_byte_caught_by_verify(tmp_path):
    ds = _write_small(tmp_path / "ds")
    info = ds.shards[1]
    path = tmp_path / "ds" / info.file
    with open(path, "r+b") as f:
        f.seek(info.bytes // 2)
        byte = f.read(1)
        f.seek(info.bytes // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    reopened = chute.open(tmp_path / "ds")  # checksums are checked on demand, not at open
    with pytest.raises(chute.ShardError) as error:
        reopened.verify()
    message = str(error.value)
    assert info.file in message and "checksum" in message and "corrupt" in message
    assert ds.shards[0].file not in message


def test_not_a_dataset(tmp_path):
    with pytest.raises(chute.ManifestError, match="does not exist"):
        chute.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(chute.ManifestError, match="has no manifest.json.*writer did not finish"):
        chute.open(tmp_path / "empty")
    (tmp_path / "empty" / "manifest.json").write_text("{not json")
    with pytest.raises(chute.ManifestError, match="not valid JSON"):
        chute.open(tmp_path / "empty")


def test_shard_from_another_dataset_is_refused(tmp_path):
    a = _write_small(tmp_path / "a", n=5, shard_size=10**6)
    chute.write(({"x": i} for i in range(5)), tmp_path / "b")
    b_manifest = _manifest(tmp_path / "b")
    a_manifest = _manifest(tmp_path / "a")
    os.replace(tmp_path / "b" / b_manifest["shards"][0]["file"], tmp_path / "a" / a.shards[0].file)
    _rewrite_manifest(tmp_path / "a", lambda m: m["shards"][0].update(bytes=b_manifest["shards"][0]["bytes"]))
    assert a_manifest["shards"][0]["file"] == a.shards[0].file
    with pytest.raises(chute.ShardError, match="another shard's file is in its place"):
        chute.open(tmp_path / "a").get_batch([0])  # its checksum
    with pytest.raises(chute.ShardError, match="does not belong to this dataset"):
        chute.open(tmp_path / "a", verify=False).get_batch([0])  # its schema


# ----------------------------------------------------------------------------- atomic writes


def test_existing_dataset_needs_overwrite(tmp_path):
    first = _write_small(tmp_path / "ds")
    with pytest.raises(chute.ChuteError, match="already holds a chute dataset.*overwrite=True"):
        _write_small(tmp_path / "ds")
    second = chute.write(({"x": i} for i in range(3)), tmp_path / "ds", overwrite=True)
    assert len(second) == 3
    assert _leftovers(tmp_path / "ds") == sorted(["manifest.json", second.shards[0].file])
    assert all(not (tmp_path / "ds" / s.file).exists() for s in first.shards)


def test_exception_mid_write_leaves_nothing_and_previous_dataset_survives(tmp_path):
    def failing(n):
        yield from image_samples(n)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        chute.write(failing(50), tmp_path / "new", shard_size=600)
    assert _leftovers(tmp_path / "new") == []  # no shards, no temporaries, no manifest

    old = _write_small(tmp_path / "old")
    with pytest.raises(RuntimeError):
        chute.write(failing(50), tmp_path / "old", shard_size=600, overwrite=True)
    survivor = chute.open(tmp_path / "old")
    survivor.verify()
    assert len(survivor) == len(old)


def test_keyboard_interrupt_mid_write(tmp_path):
    def interrupted():
        yield from image_samples(30)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        chute.write(interrupted(), tmp_path / "ds", shard_size=600)
    assert _leftovers(tmp_path / "ds") == []
    assert len(_write_small(tmp_path / "ds")) == 40


def test_second_concurrent_writer_is_refused(tmp_path):
    with chute.Writer(tmp_path / "ds") as writer:
        writer.append({"x": 1})
        with pytest.raises(chute.ChuteError, match="another process is writing"):
            chute.Writer(tmp_path / "ds")
    assert len(chute.open(tmp_path / "ds")) == 1


def test_writer_killed_with_sigkill_leaves_no_valid_dataset(tmp_path):
    target = tmp_path / "ds"
    script = textwrap.dedent(
        f"""
        import sys, numpy as np, chute
        def samples():
            for i in range(10**9):
                if i == 200:  # several shards are complete, one is half-built
                    print("ready", flush=True)
                yield {{"x": np.full(64, i, np.int64)}}
        chute.write(samples(), {str(target)!r}, shard_size=4096)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()
    assert any(name.endswith(".arrow") for name in os.listdir(target))  # it did write shards
    with pytest.raises(chute.ManifestError, match="has no manifest.json"):
        chute.open(target)
    ds = chute.write(({"x": np.full(64, i, np.int64)} for i in range(10)), target, shard_size=4096)
    assert ds.get_batch([9])["x"][0, 0].item() == 9
    assert _leftovers(target) == sorted(["manifest.json", *(s.file for s in ds.shards)])  # the dead writer's files are gone


def test_urls_chute_cannot_serve_say_what_to_do(tmp_path):
    with pytest.raises(chute.ChuteError, match=r"cannot open gs://bucket/ds: it needs gcsfs \(pip install 'chute\[gcs\]'\)"):
        chute.open("gs://bucket/ds", cache_dir=tmp_path / "cache")
    with pytest.raises(chute.ChuteError, match="cannot open nosuchproto://x/ds"):
        chute.open("nosuchproto://x/ds", cache_dir=tmp_path / "cache")
    with pytest.raises(chute.ChuteError, match="cannot write to https://host/ds: HTTP servers are read-only"):
        chute.write([{"x": 1}], "https://host/ds")
    ds = chute.write([{"x": 1}], f"file://{tmp_path / 'ds'}")  # file:// is a local path
    assert ds.cache is None and chute.open(f"file://{ds.root}")[0] == {"x": 1}
