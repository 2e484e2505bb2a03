"""``chute doctor`` through its function API: made-up machines give the findings and the changes to make."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import chute
from chute.tools import doctor

GiB = 1 << 30


def _env(**changes) -> doctor.Environment:
    """A healthy machine, then ``changes``."""
    env = doctor.Environment(
        python="3.11.7", platform="Linux", cpus=8, cpus_machine=8, cpu_quota=None,
        mem_total=64 * GiB, mem_available=48 * GiB, mem_limit=None, shm_total=32 * GiB, shm_free=32 * GiB,
        nofile_soft=65536, nofile_hard=65536, torch="2.13.0", cuda_available=False, cuda_version=None,
        cuda_devices=[], pinned_memory=None, backends={"s3fs": True, "gcsfs": True, "aiohttp": True, "adlfs": True},
        cache_dir="/tmp", cache_free=500 * GiB, cache_total=1000 * GiB,
    )
    return dataclasses.replace(env, **changes)


class FakeDataset:
    """What the checks read of a dataset: root, shards, size, rows."""

    def __init__(self, root: str, shards: int, nbytes: int, rows: int) -> None:
        self.root, self.shards, self.nbytes, self._rows = root, [object()] * shards, nbytes, rows

    def __len__(self) -> int:
        return self._rows


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks if not (c.name == "remote storage" and c.status == "info")}


def test_a_healthy_machine_passes_every_check():
    checks = doctor.check(_env())
    names = [c.name for c in checks]
    for name in ("python", "CPUs", "memory", "/dev/shm", "open files", "torch", "pinned memory", "remote storage", "cache dir"):
        assert name in names
    assert {c.status for c in checks} <= {"ok", "info"}
    assert doctor.exit_code(checks) == 0
    assert doctor.format_checks(checks).endswith("all good")


def test_an_open_file_limit_below_the_shard_count_says_ulimit():
    ds = FakeDataset("/data/ds", shards=3000, nbytes=100 * GiB, rows=1_000_000)
    check = _by_name(doctor.check(_env(nofile_soft=1024, nofile_hard=65536), ds))["open files"]
    assert check.status == "warn"
    assert "limit 1,024 (hard 65,536); 3,000 shard(s)" in check.found and "3,256 needed" in check.found
    assert check.advice == "raise it before training: `ulimit -n 4096`"
    hard = doctor.check(_env(nofile_soft=1024, nofile_hard=2048), ds)
    assert _by_name(hard)["open files"].status == "fail" and "--ulimit nofile=3256:3256" in _by_name(hard)["open files"].advice
    assert doctor.exit_code(hard) == 1


def test_a_small_dev_shm_names_the_size_workers_need():
    ds = FakeDataset("/data/ds", shards=4, nbytes=1000 * 100 * 1024, rows=1000)  # 100 KiB per sample
    check = _by_name(doctor.check(_env(shm_total=64 << 20, shm_free=64 << 20), ds, batch_size=256, prefetch=4))["/dev/shm"]
    assert check.status == "warn"
    assert "workers='processes' needs about 125.0 MiB (prefetch 4 x batch 256 x 100.0 KiB/sample" in check.found
    assert "--shm-size" in check.advice
    no_dataset = _by_name(doctor.check(_env(shm_total=64 << 20, shm_free=64 << 20)))["/dev/shm"]
    assert no_dataset.status == "warn" and "docker's default is 64 MB" in no_dataset.found


def test_a_dataset_bigger_than_memory_and_a_cpu_quota_are_flagged():
    ds = FakeDataset("/data/ds", shards=100, nbytes=100 * GiB, rows=10)
    checks = _by_name(doctor.check(_env(cpu_quota=2.0), ds))
    assert checks["memory"].status == "warn" and "does not fit in the page cache" in checks["memory"].found
    assert checks["CPUs"].status == "warn" and "workers=chute.Workers(max_count=2)" in checks["CPUs"].advice


def test_a_remote_dataset_without_its_backend_fails_with_the_install_line():
    ds = FakeDataset("s3://bucket/ds", shards=10, nbytes=GiB, rows=10)
    checks = doctor.check(_env(backends={"s3fs": False, "gcsfs": False, "aiohttp": True, "adlfs": False}), ds)
    failed = [c for c in checks if c.status == "fail"]
    assert [c.name for c in failed] == ["remote storage"]
    assert "s3:// but s3fs is not installed" in failed[0].found and failed[0].advice == "pip install 'chute[s3]' (s3fs)"
    assert doctor.exit_code(checks) == 1


def test_a_remote_dataset_bigger_than_the_cache_disk_suggests_a_cache_limit(tmp_path):
    ds = FakeDataset("https://example.org/ds", shards=10, nbytes=2000 * GiB, rows=10)
    check = _by_name(doctor.check(_env(cache_dir=str(tmp_path)), ds))["cache dir"]
    assert check.status == "warn" and "cache_limit=" in check.advice


def test_gather_reads_this_machine(tmp_path):
    env = doctor.gather(tmp_path / "not-yet" / "cache")
    assert env.cpus >= 1 and env.nofile_soft >= 1 and env.torch
    assert env.cache_dir.endswith("not-yet/cache") and env.cache_free is not None  # measured on the nearest existing parent
    assert set(env.backends) == {"s3fs", "gcsfs", "aiohttp", "adlfs"}


def test_a_real_dataset_is_sized(tmp_path):
    ds = chute.write(({"x": np.zeros(1000, np.uint8)} for _ in range(50)), tmp_path / "ds", shard_size=10_000)
    checks = _by_name(doctor.check(doctor.gather(tmp_path), ds, batch_size=8, prefetch=2))
    assert f"{len(ds.shards)} shard(s)" in checks["open files"].found
    assert "prefetch 2 x batch 8" in checks["/dev/shm"].found
    assert "fits in the page cache" in checks["memory"].found


@pytest.mark.parametrize("status", ["ok", "info", "warn", "fail"])
def test_statuses_print_in_capitals(status):
    text = doctor.format_checks([doctor.Check("thing", status, "found it", "do this" if status in ("warn", "fail") else "")])
    assert f"{status.upper():4s}  thing  found it" in text
    assert ("-> do this" in text) == (status in ("warn", "fail"))
