"""Small datasets, epochs and cache/server bookkeeping shared by the remote-storage tests.

The reference for every remote epoch is the same epoch read from local disk:
``epoch_columns`` concatenates a whole pass column by column, so two passes are
equal sample for sample (values and order) exactly when their columns are equal.
"""

from __future__ import annotations

import collections
import fcntl
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

import chute

ROWS = 4000
DIM = 64
SHARD_SIZE = 20_000  # bytes per shard: ~53 shards of ~21 KB for ROWS x DIM float32
BATCH = 32  # divides ROWS: no partial last batch
SEED = 3
STALL_S = 30.0  # seconds without a batch before a test's loader gives up

#: Files under a cache directory that hold no shard bytes (locks, the dataset's URL, the sharing processes).
_BOOKKEEPING = re.compile(r"(^|/)(locks/.*|source|\.chute-cache\.lock|\.chute-cache\.journal(\.[0-9a-f]+\.tmp)?|source\.[0-9a-f]+\.tmp)$|^\.chute-members/")
_SHARD_FILE = re.compile(r"/(shard-\d+\.[0-9a-f]+\.arrow(?:\.zst)?)$")


def samples(n: int = ROWS, seed: int = 0) -> Iterator[dict[str, Any]]:
    """``n`` samples with a random float vector, an int label and a variable-length id."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield {"x": rng.standard_normal(DIM, dtype=np.float32), "y": i, "tag": f"s{i}-{'z' * (i % 5)}"}


def write_dataset(path: str, n: int = ROWS, **kwargs: Any) -> chute.Dataset:
    """``samples(n)`` written to ``path`` (a directory or a URL) in ~20 KB shards."""
    kwargs.setdefault("shard_size", SHARD_SIZE)
    return chute.write(samples(n), path, **kwargs)


def epoch_columns(batches: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A pass's batches joined column by column (tensors concatenated, lists extended)."""
    out: dict[str, list[Any]] = collections.defaultdict(list)
    for batch in batches:
        for name, value in batch.items():
            out[name].append(value)
    return {
        name: torch.cat(parts) if isinstance(parts[0], torch.Tensor) else [v for part in parts for v in part]
        for name, parts in out.items()
    }


def assert_same_epoch(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Every column equal, value for value and in the same order."""
    assert sorted(got) == sorted(want)
    for name in want:
        if isinstance(want[name], torch.Tensor):
            assert got[name].dtype == want[name].dtype, name
            assert got[name].shape == want[name].shape, name
            assert torch.equal(got[name], want[name]), f"column {name} differs"
        else:
            assert got[name] == want[name], f"column {name} differs"


def loader(ds: chute.Dataset, batch_size: int = BATCH, **kwargs: Any) -> chute.Loader:
    """The loader every test compares: shuffled, seeded, BATCH rows per batch.

    A pass that gets no batch for STALL_S seconds raises (the hang watchdog), so a
    download that hangs fails the test instead of stopping the run.
    """
    kwargs.setdefault("shuffle", True)
    kwargs.setdefault("seed", SEED)
    kwargs.setdefault("watchdog", chute.Watchdog(STALL_S, on_stall="raise"))
    return chute.Loader(ds, batch_size, **kwargs)


def stated_minimum(url: str, cache_dir: str, **kwargs: Any) -> int:
    """The cache_limit a loader of the dataset at ``url`` (default settings, or ``kwargs``) says it
    needs (its CacheFullError's figure)."""
    small = chute.open(url, cache_dir=cache_dir, cache_limit=30_000)
    try:
        loader(small, **kwargs)
    except chute.CacheFullError as exc:
        match = re.search(r"at least ([\d,]+) bytes", str(exc))
        assert match, exc
        return int(match.group(1).replace(",", ""))
    raise AssertionError(f"a cache of 30,000 bytes was enough for {url}: use a larger dataset")


def cache_bytes(cache_dir: str, *, locked: bool = False) -> int:
    """Bytes of shard data under ``cache_dir``: complete shards and ``.part`` downloads, not locks.

    Counted holding the cache lock (``.chute-cache.lock``, see chute/storage/node/cache.py),
    which every reservation, eviction and rename into place also holds: the count
    is a state the cache was really in, not a listing torn by a concurrent rename.
    ``locked``: the caller holds it already.
    """
    if not os.path.isdir(cache_dir):
        return 0
    fd = os.open(os.path.join(cache_dir, ".chute-cache.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not locked:
            fcntl.flock(fd, fcntl.LOCK_EX)
        total = 0
        for dirpath, _, files in os.walk(cache_dir):
            for name in files:
                path = os.path.join(dirpath, name)
                if _BOOKKEEPING.search(os.path.relpath(path, cache_dir)):
                    continue
                try:
                    total += os.path.getsize(path)
                except FileNotFoundError:
                    pass  # a failed download's .part, removed while we looked
        return total
    finally:
        os.close(fd)


def overgrown_parts(cache_dir: str) -> list[str]:
    """The ``.part`` downloads under ``cache_dir`` larger than the bytes their name reserves (a download
    written past its shard's size). Call it holding the cache lock, or accept a file removed meanwhile."""
    out = []
    for directory, _, files in os.walk(cache_dir):
        for name in files:
            if not name.endswith(".part"):
                continue
            reserved = name[: -len(".part")].rsplit(".", 2)
            try:
                if len(reserved) == 3 and os.path.getsize(os.path.join(directory, name)) > int(reserved[1]):
                    out.append(name)
            except (FileNotFoundError, ValueError):
                pass
    return out


class CacheChecker:
    """Samples a cache directory every ``interval`` seconds until :meth:`stop`: the bytes it holds, counted
    under the cache lock (``cache_bytes``), against ``limit``, and every ``.part`` against its reservation."""

    def __init__(self, cache_dir: str, limit: int, interval: float = 0.003) -> None:
        self.cache_dir, self.limit, self.interval = cache_dir, limit, interval
        self.samples = 0
        self.over: list[int] = []  # bytes held, in the samples over the limit
        self.overgrown: list[str] = []  # .part files seen past their reserved size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-cache-checker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            used = cache_bytes(self.cache_dir)
            self.overgrown += overgrown_parts(self.cache_dir)
            self.samples += 1
            if used > self.limit:
                self.over.append(used)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the checker is stuck on the cache lock"

    def __enter__(self) -> CacheChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def assert_held(self) -> None:
        """The cache never held more than its limit, and no download outgrew its reservation."""
        assert self.samples > 0
        assert not self.over, f"the cache held {max(self.over):,} bytes > limit {self.limit:,}"
        assert not self.overgrown, f"downloads written past their shard's size: {sorted(set(self.overgrown))}"


def journal_files(cache_dir: str) -> dict[str, int] | None:
    """What the cache's journal (chute/storage/node/ledger.py) counts as it reads now, ``{"<key>/<file>":
    bytes}``, read without syncing (a sync may scan, and a scan changes the directory); None: no journal."""
    from chute.storage.node.ledger import JOURNAL

    try:
        with open(os.path.join(cache_dir, JOURNAL), encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return None
    counted: dict[str, int] = {}
    for line in lines[1:]:  # (the first names the file: "# <hex>")
        op, _, rest = line.partition(" ")
        if op == "+":
            key, _, size = rest.rpartition(" ")
            counted[key] = int(size)
        else:
            counted.pop(rest, None)
    return counted


def part_files(cache_dir: str) -> list[str]:
    """Every unfinished download (``.part`` file) under ``cache_dir``."""
    return sorted(os.path.join(d, f) for d, _, files in os.walk(cache_dir) for f in files if f.endswith(".part"))


def shard_gets(server: Any, status: int | None = None) -> collections.Counter[str]:
    """GET requests the test server logged per shard file (query strings ignored)."""
    counts: collections.Counter[str] = collections.Counter()
    for entry in server.requests:
        if entry.method != "GET" or (status is not None and entry.status != status):
            continue
        match = _SHARD_FILE.search(entry.path.split("?", 1)[0])
        if match:
            counts[match.group(1)] += 1
    return counts


def chute_threads() -> list[str]:
    """Names of live threads chute started (fsspec's own IO threads are not chute's)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("chute-"))


def local_epochs(root: str, epochs: int = 2, batch_size: int = BATCH, **kwargs: Any) -> list[dict[str, Any]]:
    """The reference: ``epochs`` consecutive passes over the local dataset at ``root``."""
    ld = loader(chute.open(root), batch_size, **kwargs)
    return [epoch_columns(ld) for _ in range(epochs)]


def fast_retries(ds: chute.Dataset, attempts: int = 8, base: float = 0.01, cap: float = 0.05) -> None:
    """Shorten the backoff of ``ds``'s downloads so that fault tests stay fast.

    The default policy rides out ~20 s of outage; the tests only need the retries
    to happen, not to wait. The number of attempts is what the test is about.
    """
    from chute.storage.net.remote import RetryPolicy

    ds.cache.remote.retry = RetryPolicy(attempts=attempts, base=base, cap=cap)


def child_epoch(url: str, cache_dir: str, out: str) -> None:
    """One process of the shared-cache test: open ``url``, say "ready", wait for the
    go line on stdin, run one epoch through ``cache_dir``, save its columns to ``out``
    and print the cache's stats as JSON."""
    import json
    import sys

    ds = chute.open(url, cache_dir=cache_dir)
    print("ready", flush=True)
    sys.stdin.readline()
    torch.save(epoch_columns(loader(ds)), out)
    print(json.dumps(ds.cache.stats()), flush=True)


if __name__ == "__main__":
    import sys

    child_epoch(*sys.argv[1:4])


def native_stacks(pid: int) -> str:
    """Every thread's native stack of a hung process (gdb, where installed): a hang in C code, e.g.
    at interpreter exit, shows no Python frame in faulthandler's dump."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return ""
    try:
        done = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "gdb timed out"
    return "native stacks (gdb):\n" + "\n".join(line for line in done.stdout.splitlines() if line.startswith(("#", "Thread")))
