"""A randomized stress test of the node cache shared between processes (chute/storage/node/README.md).

Each round draws, from one printed seed: 2 to 8 member processes, each with its
own shuffle seed, window and batch size; a cache limit between the documented
minimum (the largest minimum any member's loader states) and three times it;
and a schedule of ``kill -9`` and ``SIGSTOP``/``SIGCONT`` aimed at the members
while they read. It checks the protocol's invariants:

* the bytes under the cache directory never pass the limit (a checker samples
  them, under the cache lock, every few milliseconds for the whole round);
* every member that was not killed reads every epoch exactly: every sample
  once, in the order a local read of the same settings gives;
* nothing a killed member left (its ``.part`` download, its lease) stops the
  others: the survivors finish within the round's bound, and afterwards no
  ``.part`` file and no member file is left once a scan has run.

Members exit normally once they have closed their loader and dataset, as a
user's program does. A round that passes its bound (a member hung while reading,
or at interpreter exit) fails naming the members still running and where they
are, with every live member's thread stacks (SIGUSR1 -> faulthandler, and the
native stacks with gdb where installed) instead of hanging CI. To replay a failure, run with
the seed it printed: ``CHUTE_STRESS_SEED=<seed> pytest tests/storage/test_stress.py``
(the kill/stop timing follows the seed, but the processes' own timing does not:
a replay reproduces the configuration, not necessarily the interleaving).
``CHUTE_STRESS_ROUNDS`` sets how many rounds run (default 2).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import chute
from tests.servers import REPO_ROOT
from tests.storage._helpers import assert_same_epoch, cache_bytes, epoch_columns, native_stacks, part_files, samples
from tests.storage._stress_child import CLOSED

ROWS = 800
SHARD_SIZE = 12_000  # ~44 rows a shard, 19 shards
EPOCHS = 2
ROUNDS = int(os.environ.get("CHUTE_STRESS_ROUNDS", "2"))
#: Seconds the members of a round may take to start (import torch, open the dataset): generous, as
#: 8 processes starting at once on a busy 2-core machine took over 150 s here.
START_S = 400.0
#: Seconds a round may take once its members have started (~10-120 s on a loaded 2-core machine).
ROUND_S = 240.0
#: Seconds between the checker's samples of the cache's bytes.
SAMPLE_S = 0.003


@dataclasses.dataclass
class Member:
    seed: int
    window: int
    batch: int
    out: str
    proc: subprocess.Popen | None = None
    stderr: str = ""
    killed: bool = False


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("stress") / "ds"
    chute.write(samples(ROWS), str(root), shard_size=SHARD_SIZE)
    return str(root)


def _minimum(url: str, probe_dir: str, window: int, batch: int) -> int:
    """The minimum a loader with these settings states for the cache (its CacheFullError)."""
    ds = chute.open(url, cache_dir=probe_dir, cache_limit=1 << 40)
    tiny = max(s.bytes for s in ds.shards)
    ds = chute.open(url, cache_dir=probe_dir, cache_limit=tiny)
    try:
        chute.Loader(ds, batch, shuffle=chute.Shuffle(window=window), seed=0).close()
    except chute.CacheFullError as exc:
        match = re.search(r"at least ([\d,]+) bytes", str(exc))
        assert match, exc
        return int(match.group(1).replace(",", ""))
    return tiny


class Checker:
    """Samples the bytes under the cache directory (holding the cache lock) until stopped."""

    def __init__(self, cache_dir: str, limit: int) -> None:
        self.cache_dir, self.limit = cache_dir, limit
        self.samples = 0
        self.over: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-stress-checker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            used = cache_bytes(self.cache_dir)
            self.samples += 1
            if used > self.limit:
                self.over.append(used)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the checker is stuck on the cache lock"


def _chaos(rng: random.Random, members: list[Member], stop: threading.Event, log: list[str]) -> None:
    """Until ``stop``: now and then kill -9 a member (at most half of them) or stop it for a while."""
    kills = len(members) // 2
    while not stop.wait(rng.uniform(0.1, 1.0)):
        live = [m for m in members if m.proc.poll() is None and not m.killed]
        if not live:
            return
        victim = rng.choice(live)
        if kills and rng.random() < 0.3:
            kills -= 1
            victim.killed = True
            log.append(f"kill -9 seed={victim.seed}")
            victim.proc.send_signal(signal.SIGKILL)
        else:
            pause = rng.uniform(0.02, 0.6)
            log.append(f"stop seed={victim.seed} {pause:.2f}s")
            victim.proc.send_signal(signal.SIGSTOP)
            stop.wait(pause)
            victim.proc.send_signal(signal.SIGCONT)


def _dump_and_fail(members: list[Member], why: str, round_seed: int, log: list[str]) -> None:
    live = [m for m in members if m.proc.poll() is None]
    for m in live:
        m.proc.send_signal(signal.SIGCONT)
    native = {m.seed: native_stacks(m.proc.pid) for m in live}
    for m in live:
        m.proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's Python stack to its stderr
    time.sleep(2.0)  # let the dumps be written (a fixed pause on the failure path only)
    for m in members:
        if m.proc.poll() is None:
            m.proc.kill()
        m.proc.wait(30)
    dumps = "\n".join(
        f"--- member seed={m.seed} window={m.window} batch={m.batch} rc={m.proc.returncode} killed={m.killed}\n"
        f"files: {sorted(os.listdir(m.out))}\n{_stderr(m)[-6000:]}\n{native.get(m.seed, '')[-6000:]}" for m in members
    )
    pytest.fail(f"CHUTE_STRESS_SEED={round_seed}: {why}\nchaos: {log}\n{dumps}")


def _stuck(members: list[Member]) -> str:
    """Which members are still running, and where: a member that wrote that it had closed
    everything is hung at interpreter exit (members exit normally, as a user's program does)."""
    out = []
    for m in members:
        if m.proc.poll() is not None:
            continue
        saved = sorted(f for f in os.listdir(m.out) if f.endswith(".pt"))
        where = "hung at interpreter exit, after closing" if CLOSED in _stderr(m) else f"still reading (saved: {saved})"
        out.append(f"member seed={m.seed} pid={m.proc.pid} {where}")
    return "; ".join(out) or "none still running"


def _stderr(m: Member) -> str:
    path = os.path.join(m.out, "stderr")
    with open(path, errors="replace") as f:
        return f.read()


def _round(round_seed: int, url: str, dataset: str, tmp_path) -> str:
    rng = random.Random(round_seed)
    n = rng.randint(2, 8)
    seeds = rng.sample(range(1000), n)  # distinct: distinct passes (equal passes are one job's ranks)
    members = []
    for k, seed in enumerate(seeds):
        out = tmp_path / f"r{round_seed}-m{k}"
        out.mkdir()
        members.append(Member(seed, rng.randint(1, 3), rng.choice([16, 25, 32, 50]), str(out)))
    minimum = max(_minimum(url, str(tmp_path / "probe"), m.window, m.batch) for m in members)
    limit = int(minimum * rng.choice([1.0, 1.0, 1.3, 2.0, 3.0]))
    cache_dir = str(tmp_path / f"cache-{round_seed}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    deadline = time.monotonic() + START_S
    checker = Checker(cache_dir, limit)
    stop_chaos = threading.Event()
    log: list[str] = []
    chaos = None
    try:
        for m in members:
            m.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.storage._stress_child", url, cache_dir, str(limit), str(m.seed),
                 str(m.window), str(m.batch), str(EPOCHS), m.out],
                cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(os.path.join(m.out, "stderr"), "w"), text=True,
            )
        for m in members:
            ready, _, _ = select.select([m.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = m.proc.stdout.readline() if ready else ""
            if line != "ready\n":
                _dump_and_fail(members, f"member seed={m.seed} did not start: {line!r}", round_seed, log)
        for m in members:
            m.proc.stdin.write("go\n")
            m.proc.stdin.flush()
        deadline = time.monotonic() + ROUND_S
        chaos = threading.Thread(target=_chaos, args=(random.Random(rng.random()), members, stop_chaos, log),
                                 name="test-stress-chaos", daemon=True)
        chaos.start()
        for m in members:
            try:
                m.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_chaos.set()
                chaos.join(10)
                _dump_and_fail(members, f"the round did not end within {ROUND_S} s (limit {limit:,}, minimum {minimum:,}): "
                               f"{_stuck(members)}", round_seed, log)
    finally:
        stop_chaos.set()
        if chaos is not None:
            chaos.join(10)
        for m in members:
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
                m.proc.kill()
                m.proc.wait(30)
        checker.stop()
    where = f"CHUTE_STRESS_SEED={round_seed} (n={n}, limit {limit:,}, minimum {minimum:,}, chaos {log})"
    assert checker.samples > 0
    assert not checker.over, f"{where}: the cache held {max(checker.over):,} bytes > limit {limit:,}"
    for m in members:
        if m.killed:
            continue
        assert m.proc.returncode == 0, f"{where}: member seed={m.seed} failed:\n{_stderr(m)[-6000:]}"
        want = chute.Loader(chute.open(dataset), m.batch, shuffle=chute.Shuffle(window=m.window), seed=m.seed)
        for epoch in range(EPOCHS):
            got = torch.load(os.path.join(m.out, f"epoch-{epoch}.pt"))
            assert_same_epoch(got, epoch_columns(want))
    from chute.storage.node.ledger import scan

    scan(cache_dir)  # the next member's scan removes what a killed one left
    assert part_files(cache_dir) == [], where
    assert cache_bytes(cache_dir) <= limit, where
    from chute.storage.node.share import Sharing

    Sharing(cache_dir, limit)._others()  # the next member's look removes the killed ones' files
    members_dir = os.path.join(cache_dir, ".chute-members")
    assert not os.path.isdir(members_dir) or os.listdir(members_dir) == [], where
    return where


@pytest.mark.slow
def test_members_killed_and_stopped_at_random_never_break_the_cache(http_server, dataset, tmp_path):
    shutil.copytree(dataset, http_server.root / "ds")
    url = http_server.url + "ds"
    master = int(os.environ.get("CHUTE_STRESS_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"CHUTE_STRESS_SEED={master}")
    rng = random.Random(master)
    for k in range(ROUNDS):
        round_seed = master if k == 0 else rng.randrange(1 << 30)
        print(f"round {k}: CHUTE_STRESS_SEED={round_seed}", flush=True)
        print("  ", _round(round_seed, url, dataset, tmp_path), flush=True)
