"""``chute doctor``: check the machine for what makes data loading slow or fail, and say what to change.

Two steps, so that tests (and users) can check a situation they cannot create:
:func:`gather` reads the facts of this machine into an :class:`Environment`
(CPUs, memory, ``/dev/shm``, open-file limit, torch and CUDA, fsspec
backends, the cache directory); :func:`check` turns an ``Environment`` (real
or made up) and an optional dataset into :class:`Check` results, each ``ok``,
``info``, ``warn`` (works, but slower or fragile: here is the change) or
``fail`` (will not work as is). Nothing is imported eagerly: backends are
looked up with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import platform
import resource
import shutil
import sys
from typing import Any

from chute._sizes import format_size

#: fsspec backends: (module, URL schemes, pip package / chute extra to install).
BACKENDS = (
    ("s3fs", "s3://", "pip install 'chute[s3]' (s3fs)"),
    ("gcsfs", "gs://", "pip install 'chute[gcs]' (gcsfs)"),
    ("aiohttp", "http(s)://", "pip install 'chute[http]' (aiohttp)"),
    ("adlfs", "az://, abfs://", "pip install adlfs"),
)
SCHEME_MODULE = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp", "az": "adlfs", "abfs": "adlfs"}

FD_HEADROOM = 256  # descriptors for everything but mapped shards (sockets, pipes, logs, torch)
SHM_FLOOR = 256 << 20  # below this, workers="processes" is fragile whatever the batch
CACHE_FLOOR = 10 << 30  # free space in the cache directory below which remote datasets thrash
STATUSES = ("ok", "info", "warn", "fail")


@dataclasses.dataclass(frozen=True)
class Check:
    """One finding: what was checked, what was found, and what to change (empty when nothing)."""

    name: str
    status: str  # "ok" | "info" | "warn" | "fail"
    found: str
    advice: str = ""

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Environment:
    """The facts :func:`check` looks at. ``None`` means "could not be read here"."""

    python: str
    platform: str
    cpus: int  # CPUs this process may run on (affinity)
    cpus_machine: int
    cpu_quota: float | None  # cgroup CPU quota in cores, if limited
    mem_total: int | None
    mem_available: int | None
    mem_limit: int | None  # cgroup memory limit, if limited
    shm_total: int | None
    shm_free: int | None
    nofile_soft: int
    nofile_hard: int
    torch: str
    cuda_available: bool
    cuda_version: str | None
    cuda_devices: list[str]
    pinned_memory: str | None  # None: fine (or no CUDA); else why pinning failed
    backends: dict[str, bool]  # module -> installed
    cache_dir: str
    cache_free: int | None
    cache_total: int | None


def gather(cache_dir: str | os.PathLike | None = None) -> Environment:
    """Read the facts of this machine and process."""
    import torch

    cpus_machine = os.cpu_count() or 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = cpus_machine
    meminfo = _meminfo()
    shm = _disk("/dev/shm")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cuda = torch.cuda.is_available()
    devices: list[str] = []
    pinned: str | None = None
    if cuda:
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:
            pinned = str(exc).splitlines()[0]
    cache = os.path.abspath(os.fspath(cache_dir)) if cache_dir is not None else _default_cache_dir()
    space = _disk(_existing_parent(cache))
    return Environment(
        python=sys.version.split()[0],
        platform=platform.platform(),
        cpus=cpus,
        cpus_machine=cpus_machine,
        cpu_quota=_cpu_quota(),
        mem_total=meminfo.get("MemTotal"),
        mem_available=meminfo.get("MemAvailable"),
        mem_limit=_memory_limit(),
        shm_total=shm[0] if shm else None,
        shm_free=shm[1] if shm else None,
        nofile_soft=_limit(soft),
        nofile_hard=_limit(hard),
        torch=torch.__version__,
        cuda_available=cuda,
        cuda_version=torch.version.cuda,
        cuda_devices=devices,
        pinned_memory=pinned,
        backends={module: importlib.util.find_spec(module) is not None for module, _, _ in BACKENDS},
        cache_dir=cache,
        cache_free=space[1] if space else None,
        cache_total=space[0] if space else None,
    )


def check(
    env: Environment,
    dataset: Any = None,
    *,
    batch_size: int = 256,
    prefetch: int | None = None,
    workers: int | None = None,
    seq_len: int | None = None,
    pack: str = "concat",
) -> list[Check]:
    """Every check, in the order they print. ``dataset``: a :class:`chute.Dataset` (local or remote), or None.

    ``batch_size``, ``prefetch`` and ``workers`` size what ``workers="processes"``
    needs in ``/dev/shm`` (defaults: the Loader's: prefetch 2 per worker, workers =
    the usable CPUs, at most 8). A token dataset is sized from the sequences training reads
    (``seq_len``, ``pack``: ``chute.tokens.sequences``), not from its documents.
    """
    checks = [
        Check("python", "info", f"Python {env.python} on {env.platform}"),
        _cpus(env),
        _memory(env, dataset),
        _shm(env, _batches_of(dataset, seq_len, pack), batch_size, prefetch, workers),
        _open_files(env, dataset),
        _torch(env),
        _pinned(env),
        *_backends(env, dataset),
        _cache(env, dataset),
    ]
    return [c for c in checks if c is not None]


def exit_code(checks: list[Check]) -> int:
    """0 unless a check failed hard."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def format_checks(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"  {c.status.upper():4s}  {c.name:{width}s}  {c.found}")
        if c.advice:
            lines.append(f"  {'':4s}  {'':{width}s}  -> {c.advice}")
    warned = sum(c.status == "warn" for c in checks)
    failed = sum(c.status == "fail" for c in checks)
    summary = "all good" if not (warned or failed) else f"{failed} failed, {warned} warning(s): see the lines marked ->"
    return "\n".join(lines) + f"\n\n{summary}"


# --------------------------------------------------------------------------- the checks


def _cpus(env: Environment) -> Check:
    found = f"{env.cpus} usable by this process (affinity), {env.cpus_machine} in the machine"
    if env.cpu_quota is not None and env.cpu_quota < env.cpus:
        return Check(
            "CPUs", "warn", found + f"; the container's CPU quota is {env.cpu_quota:g} core(s)",
            f"threads beyond {max(1, int(env.cpu_quota))} only add contention: pass workers=chute.Workers(max_count={max(1, int(env.cpu_quota))}) "
            "to chute.Loader (the autotuner's CPU budget), or raise the quota (docker --cpus)",
        )
    if env.cpus < env.cpus_machine:
        return Check("CPUs", "info", found + "; chute's autotuner stays within the usable ones")
    return Check("CPUs", "ok", found)


def _memory(env: Environment, dataset: Any) -> Check:
    available = env.mem_available
    if env.mem_limit is not None and (available is None or env.mem_limit < available):
        available = env.mem_limit
    if env.mem_total is None:
        return Check("memory", "info", "could not read /proc/meminfo")
    found = f"{format_size(env.mem_total)} total, {format_size(env.mem_available or 0)} available"
    if env.mem_limit is not None:
        found += f", container limit {format_size(env.mem_limit)}"
    if dataset is None:
        return Check("memory", "ok", found)
    size = dataset.nbytes
    found += f"; dataset {format_size(size)}"
    if available is not None and size > available:
        return Check(
            "memory", "warn", found + " does not fit in the page cache",
            "every epoch reads from storage, not RAM: expect disk or network speed (see `chute bench`); "
            "a faster local disk, or a cache_dir on one for remote data, is what helps",
        )
    return Check("memory", "ok", found + " fits in the page cache: epochs after the first read from RAM")


def _batches_of(dataset: Any, seq_len: int | None, pack: str) -> Any:
    """What a Loader's batches are made of: a token dataset's sequences (``seq_len``), else the dataset itself."""
    if dataset is None or seq_len is None:
        return dataset
    from chute.tokens import sequences

    return sequences(dataset, seq_len, pack=pack)


def _shm(env: Environment, dataset: Any, batch_size: int, prefetch: int | None, workers: int | None) -> Check:
    if env.shm_total is None:
        return Check("/dev/shm", "warn", "not found", "workers='processes' needs POSIX shared memory; use workers='threads'")
    found = f"{format_size(env.shm_total)} total, {format_size(env.shm_free or 0)} free"
    workers = workers or min(8, env.cpus)
    prefetch = prefetch or 2 * workers
    if dataset is not None and len(dataset):
        batch_bytes = int(dataset.nbytes / len(dataset) * batch_size)
        need = int(prefetch * batch_bytes * 1.25)
        unit = "sequence" if hasattr(dataset, "seq_len") else "sample"
        found += f"; workers='processes' needs about {format_size(need)} (prefetch {prefetch} x batch {batch_size} x {format_size(batch_bytes // batch_size)}/{unit}, +25%)"
        if isinstance(getattr(dataset, "metadata", None), dict) and "tokens" in dataset.metadata:
            found += " (sized from documents: pass --seq-len L to size it from the sequences training reads)"
        if env.shm_free is not None and need > env.shm_free:
            return Check(
                "/dev/shm", "warn", found,
                "with workers='processes' use a smaller prefetch or batch_size, or enlarge /dev/shm "
                "(docker: --shm-size=2g; kubernetes: an emptyDir with medium: Memory); workers='threads' needs none",
            )
        return Check("/dev/shm", "ok", found)
    if env.shm_total < SHM_FLOOR:
        return Check(
            "/dev/shm", "warn", found + " (docker's default is 64 MB)",
            "workers='processes' needs prefetch x batch bytes here: enlarge it (docker: --shm-size=2g) or use workers='threads'",
        )
    return Check("/dev/shm", "ok", found)


def _open_files(env: Environment, dataset: Any) -> Check:
    found = f"limit {_count(env.nofile_soft)} (hard {_count(env.nofile_hard)})"
    if dataset is None:
        if env.nofile_soft < 1024:
            return Check("open files", "warn", found, f"chute keeps one descriptor per open shard: raise it with `ulimit -n {min(env.nofile_hard, 65536)}`")
        return Check("open files", "ok", found)
    shards = len(dataset.shards)
    need = shards + FD_HEADROOM
    found += f"; {shards:,} shard(s): chute maps each with one open descriptor, about {need:,} needed"
    if env.nofile_hard < need:
        return Check(
            "open files", "fail", found,
            f"the hard limit is below that: ask for a higher one (limits.conf / systemd LimitNOFILE / docker --ulimit nofile={need}:{need}), "
            "or rewrite the dataset with larger shards (chute convert --shard-size 256MiB)",
        )
    if env.nofile_soft < need:
        return Check("open files", "warn", found, f"raise it before training: `ulimit -n {min(env.nofile_hard, max(need, 4096))}`")
    return Check("open files", "ok", found)


def _torch(env: Environment) -> Check:
    if not env.cuda_available:
        cuda = f" (built with CUDA {env.cuda_version})" if env.cuda_version else " (CPU build)"
        return Check("torch", "info", f"torch {env.torch}{cuda}; no CUDA device visible: batches stay on the CPU")
    return Check("torch", "ok", f"torch {env.torch}, CUDA {env.cuda_version}, {len(env.cuda_devices)} device(s): {', '.join(env.cuda_devices)}")


def _pinned(env: Environment) -> Check:
    if not env.cuda_available:
        return Check("pinned memory", "info", "not used on the CPU (device=None): nothing to check")
    if env.pinned_memory:
        return Check(
            "pinned memory", "warn", f"allocating pinned memory failed: {env.pinned_memory}",
            "device copies will not overlap with compute; check `ulimit -l` and the container's memlock limit",
        )
    return Check("pinned memory", "ok", "available: device=... copies overlap with compute")


def _backends(env: Environment, dataset: Any) -> list[Check]:
    scheme = _scheme(dataset)
    wanted = SCHEME_MODULE.get(scheme) if scheme else None
    installed = [f"{schemes} ({module})" for module, schemes, _ in BACKENDS if env.backends.get(module)]
    missing = [f"{schemes}: {how}" for module, schemes, how in BACKENDS if not env.backends.get(module)]
    checks = [Check("remote storage", "ok" if installed else "info", "fsspec backends installed: " + (", ".join(installed) or "none (local paths and file:// only)"))]
    if wanted is not None and not env.backends.get(wanted):
        how = next(h for m, _, h in BACKENDS if m == wanted)
        checks.append(Check("remote storage", "fail", f"the dataset is at {scheme}:// but {wanted} is not installed", how))
    elif missing:
        checks.append(Check("remote storage", "info", "to read more: " + "; ".join(missing)))
    return checks


def _cache(env: Environment, dataset: Any) -> Check:
    found = f"{env.cache_dir}"
    if env.cache_free is None:
        return Check("cache dir", "warn", found + ": no such file system", "set CHUTE_CACHE_DIR (or cache_dir=) to a writable local disk")
    found += f": {format_size(env.cache_free)} free of {format_size(env.cache_total or 0)}"
    if not os.access(_existing_parent(env.cache_dir), os.W_OK):
        return Check("cache dir", "fail", found + ", not writable", "set CHUTE_CACHE_DIR (or cache_dir=) to a directory you can write")
    remote = _scheme(dataset) not in (None, "", "file")
    if remote and dataset.nbytes > env.cache_free:
        return Check(
            "cache dir", "warn", found + f"; the dataset is {format_size(dataset.nbytes)}",
            "pass cache_limit= below the free space (chute evicts what is used furthest ahead) or point CHUTE_CACHE_DIR at a bigger disk",
        )
    if env.cache_free < CACHE_FLOOR:
        return Check("cache dir", "warn", found, "remote datasets are cached here: free some space or set CHUTE_CACHE_DIR to a bigger local disk")
    return Check("cache dir", "ok", found)


# --------------------------------------------------------------------------- reading the machine


def _default_cache_dir() -> str:
    try:
        from chute.storage.node.cache import default_cache_dir
    except ImportError:  # a chute without remote storage
        base = os.environ.get("CHUTE_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "chute"
        )
        return os.path.abspath(base)
    return os.path.abspath(default_cache_dir())


def _existing_parent(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _disk(path: str) -> tuple[int, int] | None:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.total, usage.free


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def _cpu_quota() -> float | None:
    """The cgroup CPU quota in cores (cgroup v2 ``cpu.max`` or v1 ``cfs_quota_us``), or None."""
    text = _read("/sys/fs/cgroup/cpu.max")
    if text:
        quota, _, period = text.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_us, period_us = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if quota_us and period_us and int(quota_us) > 0:
        return int(quota_us) / int(period_us)
    return None


def _memory_limit() -> int | None:
    """The cgroup memory limit in bytes, or None if there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = _read(path)
        if text and text != "max" and text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


def _limit(value: int) -> int:
    return (1 << 62) if value == resource.RLIM_INFINITY else int(value)


def _count(value: int) -> str:
    return "unlimited" if value >= (1 << 62) else f"{value:,}"


def _scheme(dataset: Any) -> str | None:
    if dataset is None:
        return None
    root = str(getattr(dataset, "root", ""))
    return root.split("://", 1)[0].lower() if "://" in root else ""
