"""Checksum markers (``<chute cache dir>/verified/``) hold after the first read.

A marker says "this exact file matched its checksum": keyed by device, inode,
size, mtime and ctime of the descriptor the reader maps, and hashed by reading
that descriptor. Changing a shard in any way a program can (in place with its
mtime restored, deleted and restored from a damaged copy with its times kept)
makes the next process hash it again; markers of files that are gone do not
pile up; a file swapped between the mapping and the hash is caught.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

import chute
from chute.format import validate


def _samples(n=60, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {"x": rng.standard_normal(16).astype(np.float32), "y": i}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "chute-cache"
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(path))
    return path


def _markers(cache_dir) -> list[str]:
    root = cache_dir / "verified"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def _read_in_another_process(root) -> str:
    """A new process (no in-process memory of checks) reads every row; its error or "ok"."""
    code = ("import chute, sys\nds = chute.open(sys.argv[1])\n"
            "try:\n    ds.get_batch(list(range(len(ds))))\n    print('ok')\n"
            "except chute.ShardError as exc:\n    print('ShardError', exc)\n")
    done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x5A]))


def test_a_byte_flipped_in_place_with_its_mtime_restored_is_caught(tmp_path, cache_dir):
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    assert _read_in_another_process(ds.root) == "ok"  # hashed once: markers written
    assert _markers(cache_dir)
    info = ds.shards[0]
    path = os.path.join(ds.root, info.file)
    st = os.stat(path)
    _flip(path, info.bytes // 2)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same inode, size and mtime
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino == st.st_ino
    out = _read_in_another_process(ds.root)
    assert out.startswith("ShardError") and info.file in out and "checksum" in out


def test_a_shard_deleted_and_restored_from_a_damaged_copy_with_its_times_kept_is_caught(tmp_path, cache_dir):
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    assert _read_in_another_process(ds.root) == "ok"
    info = ds.shards[1]
    path = os.path.join(ds.root, info.file)
    backup = tmp_path / "backup.arrow"
    shutil.copy2(path, backup)
    _flip(backup, info.bytes // 3)  # the backup decayed
    shutil.copystat(path, backup)
    os.unlink(path)
    shutil.copy2(backup, path)  # `cp -p`: mtime kept (and often the freed inode reused)
    assert os.stat(path).st_mtime_ns == os.stat(backup).st_mtime_ns
    out = _read_in_another_process(ds.root)
    assert out.startswith("ShardError") and info.file in out and "checksum" in out


def test_markers_of_rewritten_datasets_do_not_pile_up(tmp_path, cache_dir):
    root = tmp_path / "ds"
    for k in range(10):
        ds = chute.write(_samples(seed=k), root, shard_size=600, overwrite=True)
        shards = len(ds.shards)
        assert shards >= 3
        ds.get_batch(list(range(len(ds))))  # verified: one marker per shard
        ds.close()
    assert 0 < len(_markers(cache_dir)) <= shards, _markers(cache_dir)  # 10 writes: the last one's markers only
    shutil.rmtree(root)  # the dataset is gone: so are its markers, at the next look into verified/
    other = chute.write(_samples(), tmp_path / "other", shard_size=600)
    other.get_batch([0])
    assert len(_markers(cache_dir)) == 1


def test_a_verified_datasets_first_read_looks_into_its_own_bucket_only(tmp_path, cache_dir, monkeypatch):
    """A process's first read of a dataset this machine verified reads that dataset's markers and nothing of the
    other datasets' buckets (one read each: a first batch's wait grew with every dataset ever verified here);
    the buckets of datasets that are gone go when a bucket is added."""
    others = [chute.write(_samples(), tmp_path / f"other{k}", shard_size=600) for k in range(3)]
    for other in others:
        other.get_batch([0])
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    ds.get_batch(list(range(len(ds))))
    assert _read_in_another_process(ds.root) == "ok"
    read = []
    real_read = validate._read
    with monkeypatch.context() as patch:
        patch.setattr(validate, "_read", lambda path: read.append(path) or real_read(path))
        again = chute.open(ds.root)  # a new process's view: no check of this dataset done yet
        again.get_batch(list(range(len(again))))
    assert again._checks.hashed == 0
    own = os.path.dirname(validate._marker_path(os.path.join(ds.root, ds.shards[0].file)))
    assert read and {os.path.dirname(path) for path in read} == {own}
    shutil.rmtree(others[0].root)  # gone: its bucket goes when the next bucket is added
    assert len(os.listdir(cache_dir / "verified")) == 4
    chute.write(_samples(), tmp_path / "new", shard_size=600).get_batch([0])
    buckets = {(cache_dir / "verified" / b / ".dir").read_text() for b in os.listdir(cache_dir / "verified")}
    assert buckets == {os.path.realpath(d) for d in (others[1].root, others[2].root, ds.root, tmp_path / "new")}


def test_the_hash_covers_the_bytes_the_reader_maps_not_what_the_path_names_later(tmp_path, cache_dir):
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    info = ds.shards[0]
    path = os.path.join(ds.root, info.file)
    damaged = tmp_path / "damaged.arrow"
    shutil.copy2(path, damaged)
    _flip(damaged, info.bytes // 2)
    good = tmp_path / "good.arrow"
    shutil.copy2(path, good)
    os.replace(damaged, path)
    mapped = pa.memory_map(path, "r")  # the reader maps the damaged file ...
    os.replace(good, path)  # ... and the path names the good one when the hash runs
    checks = validate.ShardChecks(verify=True)
    with pytest.raises(chute.ShardError, match="checksum"):
        checks.bytes(mapped, path, info, "test")
    mapped.close()
    again = pa.memory_map(path, "r")  # the good file mapped: it passes, and its marker is the good file's
    checks.bytes(again, path, info, "test")
    again.close()
    assert _read_in_another_process(ds.root) == "ok"


def test_a_process_waits_for_another_hashing_the_same_shard_instead_of_hashing_it_again(tmp_path, cache_dir,
                                                                                         monkeypatch):
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    info = ds.shards[0]
    path = os.path.join(ds.root, info.file)
    marker = validate._marker_path(path)
    waiting, go = threading.Event(), threading.Event()

    def pause(seconds):  # the waiter's poll: say it is waiting, then wait for the test's go
        waiting.set()
        assert go.wait(60)

    monkeypatch.setattr(validate, "_pause", pause)
    mapped = pa.memory_map(path, "r")
    checks = validate.ShardChecks(verify=True)
    errors = []

    def read():
        try:
            checks.bytes(mapped, path, info, "test")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    with validate._hashing(marker):  # "another process" is hashing shard 0
        reader = threading.Thread(target=read)
        reader.start()
        assert waiting.wait(60), "the reader hashed the shard instead of waiting for the lock"
        record = validate._record(validate._identity(mapped.fileno()), info.checksum)
        validate._write_marker(marker, record, os.path.dirname(os.path.realpath(path)))
    go.set()
    reader.join(60)
    mapped.close()
    assert not reader.is_alive() and not errors
    assert checks.hashed == 0  # it read the other's marker


_HASH_COUNT = """
import chute, os, sys, time
while not os.path.exists(sys.argv[2]):  # every process starts reading at once
    time.sleep(0.001)
ds = chute.open(sys.argv[1])
ds.get_batch(list(range(len(ds))))
print(ds._checks.hashed)
"""


def test_processes_opening_a_dataset_at_once_hash_each_shard_once_in_all(tmp_path, cache_dir):
    ds = chute.write(_samples(400), tmp_path / "ds", shard_size=2_000)
    gate = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _HASH_COUNT, ds.root, str(gate)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ)) for _ in range(4)]
    gate.touch()
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        counts.append(int(out))
    assert sum(counts) == len(ds.shards), counts  # once per shard on the machine, not once per process
    assert len(_markers(cache_dir)) == len(ds.shards)
    shutil.rmtree(ds.root)  # gone: its markers and lock files go at the next look into verified/
    chute.write(_samples(), tmp_path / "other", shard_size=600).get_batch([0])
    left = [p.name for p in (cache_dir / "verified").rglob("*") if p.is_file() and p.name != ".dir"]
    assert len(left) == 2 and sorted(n.endswith(".lock") for n in left) == [False, True], left


def test_shards_checked_ahead_skip_the_one_another_process_is_hashing(tmp_path, cache_dir):
    """The ranks of a job open the same shards at once: each hashes those nobody else is hashing, side by side,
    instead of all queueing on the first; the busy one is left to its first read (which waits for that marker)."""
    ds = chute.write(_samples(), tmp_path / "ds", shard_size=600)
    assert len(ds.shards) >= 3
    busy = validate._marker_path(os.path.join(ds.root, ds.shards[0].file))
    with validate._hashing(busy) as held:  # "another process" is hashing shard 0
        assert held
        ds.check_ahead([0, 1, 2])
    assert ds._checks.hashed == 2
    assert _markers(cache_dir) == sorted(os.path.relpath(validate._marker_path(os.path.join(ds.root, ds.shards[i].file)),
                                                         cache_dir / "verified") for i in (1, 2))
    ds.get_batch(list(range(len(ds))))  # shard 0 is hashed by its first read; 1 and 2 are not hashed again
    assert ds._checks.hashed == len(ds.shards)
    assert _read_in_another_process(ds.root) == "ok"
