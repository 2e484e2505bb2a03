"""Damaged shards, doctored manifests and a full disk: only chute errors, never a crash,
a hang or a wrong value; nothing half-written left behind.

- Single-byte corruptions of every column kind (tests/format/corruption.py), read in
  a child process: with the default ``verify=True`` every outcome is the exact data
  or a ShardError; with ``verify=False`` (structure only) none crashes or hangs.
- Two same-size shards swapped on disk (a cached copy damaged after its download:
  tests/storage/test_cache.py).
- Manifest row counts out of range, not matching the shards, edited in place.
- A file-size limit (EFBIG, as a full disk gives ENOSPC) while writing or converting.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import chute
from tests.format import corruption

CASES = 300


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("corruption") / "ds")
    corruption.write_reference(root)
    return root


# ----------------------------------------------------------------------------- single-byte corruptions


def test_every_corrupted_byte_gives_the_exact_data_or_a_shard_error(every_kind):
    result = corruption.fuzz(every_kind, corruption.make_cases(every_kind, CASES, seed=1))
    assert len(result["outcomes"]) == CASES
    assert result["bad"] == {}, result["counts"]  # no crash, hang, other exception or wrong value


def test_without_checksums_the_structure_checks_prevent_crashes_and_hangs(every_kind):
    """``verify=False`` hashes nothing: a flipped data byte may give a wrong value, but no
    corruption may crash the process, hang it, or escape as anything but a ShardError.

    Exception: the text of a JSON value that is no longer JSON fails in the column
    decoder (json.loads) when the value is read; turning that into a ShardError is
    the decoder's job (chute/format/reader.py), not the structure check's."""
    result = corruption.fuzz(every_kind, corruption.make_cases(every_kind, CASES, seed=2), verify=False)
    counts = result["counts"]
    assert "crash" not in counts and "hang" not in counts, result["bad"]
    escaped = {k: o for k, (_, o) in result["bad"].items() if o.startswith("error:") and not o.startswith("error:JSONDecodeError")}
    assert escaped == {}
    assert counts.get("shard_error", 0) > CASES // 5  # the structure checks do catch a good share


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def test_two_same_size_shards_swapped_on_disk(tmp_path):
    ds = chute.write(({"x": np.full(4, i, np.float32), "y": i} for i in range(40)), tmp_path / "ds", shard_size=400)
    a, b = ds.shards[0], ds.shards[1]
    assert a.bytes == b.bytes and a.rows == b.rows  # same schema, same rows: same size
    root = tmp_path / "ds"
    os.replace(root / a.file, root / "tmp")
    os.replace(root / b.file, root / a.file)
    os.replace(root / "tmp", root / b.file)
    swapped = chute.open(root)  # sizes agree: open does not hash
    with pytest.raises(chute.ShardError, match=f"shard {a.file} .* has checksum .*another shard's file is in its place"):
        swapped[0]
    with pytest.raises(chute.ShardError) as info:
        swapped.verify()
    assert a.file in str(info.value) and b.file in str(info.value)


# ----------------------------------------------------------------------------- manifest row counts


def _manifest(root) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _small(root) -> chute.Dataset:
    return chute.write(({"x": np.arange(3, dtype=np.int64) + i, "t": f"s{i}"} for i in range(30)), root, shard_size=200)


@pytest.mark.parametrize("rows", ["2**62", "2**63-1", "10**30", "1e400", "-1", "7.0", "true", '"7"', "null"])
def test_a_shard_row_count_out_of_range_is_a_manifest_error(tmp_path, rows):
    root = tmp_path / "ds"
    _small(root)
    text = (root / "manifest.json").read_text()
    value = str(eval(rows)) if "*" in rows else rows  # noqa: S307 - test constants
    data = json.loads(text)
    data["shards"][0]["rows"] = "@ROWS@"
    (root / "manifest.json").write_text(json.dumps(data).replace('"@ROWS@"', value))
    with pytest.raises(chute.ManifestError, match=r"field shards\[0\]\.rows must be an integer from 0 to 2\*\*53"):
        chute.open(root)


def test_row_counts_that_add_up_past_the_limit(tmp_path):
    root = tmp_path / "ds"
    _small(root)
    data = _manifest(root)
    for shard in data["shards"]:
        shard["rows"] = 2**52
    data["rows"] = 2**52 * len(data["shards"])
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(chute.ManifestError, match="past 2\\*\\*53 rows"):
        chute.open(root)


def test_the_total_must_be_the_sum_of_the_shards(tmp_path):
    root = tmp_path / "ds"
    _small(root)
    data = _manifest(root)
    data["rows"] += 1
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(chute.ManifestError, match="field rows says 31 but the shards list 30 rows"):
        chute.open(root)


def test_a_non_empty_shard_listed_with_zero_rows_is_refused_at_open(tmp_path):
    """A loader never reads a shard the manifest says is empty: its rows would vanish silently."""
    root = tmp_path / "ds"
    ds = _small(root)
    data = _manifest(root)
    dropped = data["shards"][1]["rows"]
    data["shards"][1]["rows"] = 0
    data["rows"] -= dropped
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(chute.ShardError, match=f"shard {ds.shards[1].file} holds {dropped} rows, the manifest says 0"):
        chute.open(root)


def test_an_edited_row_count_is_caught_by_verify_and_by_the_first_read(tmp_path):
    root = tmp_path / "ds"
    ds = _small(root)
    data = _manifest(root)
    data["shards"][0]["rows"] += 2
    data["rows"] += 2
    (root / "manifest.json").write_text(json.dumps(data))
    edited = chute.open(root)
    with pytest.raises(chute.ShardError, match=f"shard {ds.shards[0].file} holds {ds.shards[0].rows} rows, the manifest says {ds.shards[0].rows + 2}"):
        edited.verify()
    with pytest.raises(chute.ShardError, match="the manifest says"):
        list(chute.Loader(edited, 4))
    cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "chute"), "inspect", str(root), "--verify"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode != 0 and f"holds {ds.shards[0].rows} rows" in cli.stdout + cli.stderr


def test_verify_also_checks_each_shards_schema(tmp_path):
    a = _small(tmp_path / "a")
    b = chute.write(({"x": np.arange(3, dtype=np.int32) + i, "t": f"s{i}"} for i in range(30)), tmp_path / "b", shard_size=200)
    info = a.shards[0]
    shutil.copy(tmp_path / "b" / b.shards[0].file, tmp_path / "a" / info.file)  # another dataset's shard
    data = _manifest(tmp_path / "a")  # with its size and checksum: only the schema tells
    data["shards"][0].update(bytes=b.shards[0].bytes, checksum=b.shards[0].checksum)
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(chute.ShardError, match=f"shard {info.file} has schema"):
        chute.open(tmp_path / "a").verify()


# ----------------------------------------------------------------------------- other manifest damage


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda m: m.update(shards=5), "field shards must be a list"),
        (lambda m: m.update(shards=[5]), r"field shards\[0\] must be an object"),
        (lambda m: m["shards"][0].update(bytes=0), r"field shards\[0\]\.bytes"),
        (lambda m: m["shards"][0].update(checksum="xxh3_128:zz"), r"field shards\[0\]\.checksum"),
        (lambda m: m["shards"][0].pop("rows"), r"field shards\[0\] lacks 'rows'"),
        (lambda m: m.update(columns=[]), "field columns must be a non-empty list"),
        (lambda m: m["columns"][0].update(shape=[2**40, 2**40]), r"field columns\[0\]\.shape"),
        (lambda m: m["columns"][0].update(shape=[-3]), r"field columns\[0\]\.shape"),
        (lambda m: m["columns"][0].update(dtype="complex512"), "field columns is not a valid schema"),
        (lambda m: m.update(arrow_schema="!!not base64"), "field arrow_schema is not a serialised Arrow schema"),
        (lambda m: m.update(arrow_schema="AAAA"), "field arrow_schema is not a serialised Arrow schema"),
        (lambda m: m.update(metadata=[1, 2]), "field metadata must be an object"),
        (lambda m: m.update(format_version=True), "format version True"),
    ],
)
def test_a_damaged_manifest_field_is_named(tmp_path, change, field):
    root = tmp_path / "ds"
    _small(root)
    data = _manifest(root)
    change(data)
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(chute.ManifestError, match=field):
        chute.open(root)


def test_a_manifest_that_is_not_utf8(tmp_path):
    root = tmp_path / "ds"
    _small(root)
    (root / "manifest.json").write_bytes((root / "manifest.json").read_bytes().replace(b'"chute"', b'"ch\xffte"', 1))
    with pytest.raises(chute.ManifestError, match="is not UTF-8 text"):
        chute.open(root)


def test_deeply_nested_json_is_a_manifest_error(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(chute.ManifestError, match="not valid JSON"):
        chute.open(root)


# ----------------------------------------------------------------------------- writing: full disk, bad samples, paths


_WRITE_UNDER_A_LIMIT = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    import chute

    how, dst, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    if how == "write":
        # two ~100 KB shards are written and renamed, then one holding a 200 KB value passes the limit
        rows = [{"b": bytes([i % 7]) * 1_000} for i in range(200)] + [{"b": b"x" * 200_000}]
        chute.write(rows, dst, shard_size=100_000, overwrite=True)
    else:
        from chute.cli import main
        sys.argv = ["chute", "convert", sys.argv[4], dst, "--shard-size", "1MB", "--quiet"]
        sys.exit(main())
    """
)


def _write_under_a_file_size_limit(how: str, dst, limit: int, *extra: str) -> subprocess.CompletedProcess:
    """Run a write in a child whose files may not grow past ``limit`` bytes (RLIMIT_FSIZE: EFBIG,
    what a full disk's ENOSPC is to the writer)."""
    return subprocess.run([sys.executable, "-c", _WRITE_UNDER_A_LIMIT, how, str(dst), str(limit), *extra],
                          capture_output=True, text=True, timeout=300)


def test_a_write_that_fills_the_disk_is_a_write_error_and_leaves_nothing(tmp_path):
    dst = tmp_path / "new"
    result = _write_under_a_file_size_limit("write", dst, 150_000)
    assert result.returncode != 0
    assert "WriteError" in result.stderr and str(dst) in result.stderr and "file system is full" in result.stderr
    assert not dst.exists()  # the directory the writer made is gone with its lock file and shards


def test_a_full_disk_during_overwrite_keeps_the_previous_dataset(tmp_path):
    dst = tmp_path / "ds"
    before = chute.write(({"b": bytes([i])} for i in range(10)), dst)
    result = _write_under_a_file_size_limit("write", dst, 150_000)
    assert "WriteError" in result.stderr
    assert sorted(os.listdir(dst)) == sorted(["manifest.json", before.shards[0].file])  # no lock file, no temporaries
    assert len(chute.open(dst)) == 10


def test_a_convert_that_fills_the_disk(tmp_path):
    src = tmp_path / "arrays.npy"
    np.save(src, np.zeros((400, 1000), np.uint8))
    dst = tmp_path / "out"
    result = _write_under_a_file_size_limit("convert", dst, 200_000, str(src))
    assert result.returncode != 0
    assert str(dst) in result.stderr and "file system is full" in result.stderr
    assert not dst.exists()


def test_samples_that_are_not_dicts(tmp_path):
    for samples, kind in (([1, 2], "int"), (["a"], "str"), ([(1, 2)], "tuple"), ([None], "NoneType")):
        with pytest.raises(chute.SchemaError, match=f"sample 0 is a {kind}, not a dict: chute.write takes an iterable of dicts"):
            chute.write(samples, tmp_path / kind)
        assert not (tmp_path / kind).exists()


def test_a_failed_write_leaves_no_lock_file(tmp_path):
    with pytest.raises(chute.SchemaError):
        chute.write([{"x": 1}, {"x": "two"}], tmp_path / "ds", lookahead=1)
    assert not (tmp_path / "ds").exists()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    with pytest.raises(chute.SchemaError):
        chute.write([{"x": 1}, {"x": "two"}], tmp_path / "kept", lookahead=1)
    assert os.listdir(tmp_path / "kept") == ["notes.txt"]  # a folder the writer did not make stays, as it was


def test_a_tilde_in_paths_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    written = chute.write(({"x": i} for i in range(5)), "~/data/ds")
    assert written.root == str(tmp_path / "data" / "ds") and (tmp_path / "data" / "ds" / "manifest.json").exists()
    assert len(chute.open("~/data/ds")) == 5


# ----------------------------------------------------------------------------- fuzzed manifests


def test_fuzzed_manifests_give_only_chute_errors(tmp_path_factory):
    """A few hundred fuzzed manifests (benchmarks/fuzz_manifest.py runs many more)."""
    from hypothesis import HealthCheck, given, settings

    from tests.format import manifest_fuzz

    root = str(tmp_path_factory.mktemp("fuzz") / "ds")
    base = manifest_fuzz.write_base(root)
    outcomes: dict[str, int] = {}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(manifest_fuzz.changes(base))
    def case(text: str) -> None:
        try:
            manifest_fuzz.open_and_read(root, text)
            outcomes["opened"] = outcomes.get("opened", 0) + 1
        except chute.ChuteError as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1

    case()
    assert outcomes.get("ManifestError", 0) > 100, outcomes  # the fuzz did reach the checks
