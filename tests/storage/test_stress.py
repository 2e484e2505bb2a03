"""A randomized stress test of the node cache shared between processes (chute/storage/node/README.md).

Each round draws, from one printed seed: 2 to 8 member processes, each with its
own shuffle seed, window and batch size; a cache limit between the documented
minimum (the largest minimum any member's loader states) and three times it; a
schedule of ``kill -9`` and ``SIGSTOP``/``SIGCONT`` aimed at the members from
outside while they read; and, inside each member, a schedule at the protocol's
own steps (chute/storage/node/steps.py, run by tests/storage/_stress_steps.py):
seeded pauses where a ``.part`` was just reserved (the cache lock held), where a
download is verified and not yet renamed, and where a lease was given back and
its waiters not yet rung, and for some members a death exactly there.

It checks the README's eight invariants:

1. never over the byte limit: a checker samples the bytes under the cache
   directory, under the cache lock, every few milliseconds for the whole round,
   and every ``.part`` against the size it reserves;
2. leases fit the limit: the same checker reads the member files under the same
   lock and adds up the live members' leases;
3. never evict what is held: each member checks that a shard's file at its last
   release is the one it first held (same inode);
4. each shard is downloaded once per node at a time: the server's log has no
   two complete GETs of one shard that overlap in time;
5. no lost reservation after ``kill -9``: afterwards the journal agrees with the
   directory, and once a scan has run no ``.part`` and no member file is left;
6. no wait while holding what another needs: a member that waits for its turn
   holds nothing (checked in the member at each wait), and no round deadlocks;
7. progress whenever the limit is at least the stated minimum: every member that
   was not killed reads every epoch exactly (every sample once, in the order a
   local read of the same settings gives), within the round's bound;
8. wake-ups, not polls: a wait that nobody woke lasted the whole dead-peer check.

Members exit normally once they have closed their loader and dataset, as a
user's program does. A round that passes its bound (a member hung while reading,
or at interpreter exit) fails naming the members still running and where they
are, with every live member's thread stacks (SIGUSR1 -> faulthandler, and the
native stacks with gdb where installed) instead of hanging CI. To replay a failure, run with
the seed it printed: ``CHUTE_STRESS_SEED=<seed> pytest tests/storage/test_stress.py``
(the schedules follow the seed, but the processes' own timing does not: a replay
reproduces the configuration, not necessarily the interleaving).
``CHUTE_STRESS_ROUNDS`` sets how many rounds run (default 2: CI's), ``CHUTE_STRESS_ROUND_S``
the bound of a round in seconds (default 240; a replay loop may lower it to fail faster).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import re
import selectors
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
from tests.storage._helpers import (
    assert_same_epoch,
    cache_bytes,
    epoch_columns,
    journal_files,
    native_stacks,
    overgrown_parts,
    part_files,
    samples,
)
from tests.storage._stress_child import CLOSED, STEPS
from tests.storage._stress_steps import VIOLATION

ROWS = 800
SHARD_SIZE = 12_000  # ~44 rows a shard, 19 shards
EPOCHS = 2
ROUNDS = int(os.environ.get("CHUTE_STRESS_ROUNDS", "2"))
#: Seconds the members of a round may take to start (import torch, open the dataset): generous, as
#: 8 processes starting at once on a busy 2-core machine took over 150 s here.
START_S = 400.0
#: Seconds a round may take once its members have started (~10-120 s on a loaded 2-core machine).
ROUND_S = float(os.environ.get("CHUTE_STRESS_ROUND_S", "240"))
#: Seconds between the checker's samples of the cache's bytes.
SAMPLE_S = 0.003


@dataclasses.dataclass
class Member:
    seed: int
    window: int
    batch: int
    out: str
    schedule: dict = dataclasses.field(default_factory=dict)  # at the protocol's steps (tests/storage/_stress_steps.py)
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


def _sample(cache_dir: str) -> tuple[int, int]:
    """``(bytes, leases)``: the bytes under the cache directory and the sum of its live members' leases,
    both read in one hold of the cache lock (as every change to either is made)."""
    from chute.storage.node.share import MEMBERS_DIR, cache_lock

    with cache_lock(cache_dir):
        used = cache_bytes(cache_dir, locked=True)
        leases = 0
        members = os.path.join(cache_dir, MEMBERS_DIR)
        for name in os.listdir(members) if os.path.isdir(members) else []:
            if name.endswith(".bell"):
                continue
            try:
                fd = os.open(os.path.join(members, name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    continue  # its owner died: its lease is free (the next member's look removes the file)
                except BlockingIOError:
                    pass
                try:
                    leases += int(json.loads(os.pread(fd, 1 << 20, 0))["lease"])
                except (ValueError, KeyError):
                    pass  # a file being made (never, under the lock) or foreign
            finally:
                os.close(fd)
    return used, leases


def _listing(cache_dir: str) -> str:
    """Every file under ``cache_dir`` but the locks, with its size, and what the journal counts (call holding
    the cache lock): what a failure of invariant 1 shows."""
    files = []
    for dirpath, _, names in os.walk(cache_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            if "/locks/" in path:
                continue
            try:
                files.append(f"{os.path.relpath(path, cache_dir)} {os.path.getsize(path):,}")
            except FileNotFoundError:
                pass
    counted = journal_files(cache_dir)
    journal = "none" if counted is None else f"{sum(counted.values()):,} bytes in {sorted(counted.items())}"
    return f"files {sorted(files)}; journal {journal}"


class Checker:
    """Samples the cache (holding the cache lock) until stopped: its bytes and its live leases against the
    limit (invariants 1 and 2), and every ``.part`` against its reservation."""

    def __init__(self, cache_dir: str, limit: int) -> None:
        self.cache_dir, self.limit = cache_dir, limit
        self.samples = 0
        self.over: list[int] = []
        self.leases_over: list[int] = []
        self.overgrown: list[str] = []
        self.first_over = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-stress-checker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            if not os.path.isdir(self.cache_dir):
                continue
            used, leases = _sample(self.cache_dir)
            self.overgrown += overgrown_parts(self.cache_dir)
            self.samples += 1
            if used > self.limit:
                if not self.over:  # what the cache held then, with the journal's count (read under the same lock)
                    self.first_over = _listing(self.cache_dir)
                self.over.append(used)
            if leases > self.limit:
                self.leases_over.append(leases)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the checker is stuck on the cache lock"


def _overlapping_downloads(requests: list) -> list[str]:
    """Shards two complete GETs of which overlap in time in the server's log (invariant 4: the download
    lock is held from before a GET is sent until after its body is read, so complete GETs of one shard
    by different holders never overlap; a GET cut short, by a kill or a cancel, is not a download)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in requests:
        if r.method == "GET" and r.status == 200 and r.complete and "/shard-" in r.path:
            spans.setdefault(r.path, []).append((r.start, r.end))
    out = []
    for path, found in spans.items():
        found.sort()
        if any(later[0] < earlier[1] for earlier, later in zip(found, found[1:])):
            out.append(path)
    return out


def _journal_differs(cache_dir: str) -> str | None:
    """Where the journal (chute/storage/node/ledger.py) and the directory disagree, after every member is gone
    and before any scan (invariant 5: every change was journaled under the lock, a killed member's too)."""
    from chute.storage.node.ledger import PART_SUFFIX, part_of
    from chute.storage.node.share import cache_lock

    with cache_lock(cache_dir):
        journal = journal_files(cache_dir)
        if journal is None:
            return None  # invalidated (a write that failed): the next look scans
        there: dict[str, int] = {}
        for entry in os.scandir(cache_dir):
            if entry.is_dir() and os.path.isdir(os.path.join(entry.path, "locks")):
                for item in os.scandir(entry.path):
                    if item.name.endswith(PART_SUFFIX):
                        there[f"{entry.name}/{item.name}"] = part_of(item.name)[1]
                    elif item.name.endswith(".arrow"):
                        there[f"{entry.name}/{item.name}"] = item.stat().st_size
    if journal != there:
        return f"journal {sorted(journal.items())} != directory {sorted(there.items())}"
    return None


def _chaos(rng: random.Random, members: list[Member], stop: threading.Event, log: list[str]) -> None:
    """Until ``stop``: now and then kill -9 a member (at most half of them, counting the deaths the members'
    own schedules hold) or stop it for a while."""
    kills = len(members) // 2 - sum(1 for m in members if m.schedule.get("kill"))
    while not stop.wait(rng.uniform(0.1, 1.0)):
        live = [m for m in members if m.proc.poll() is None and not m.killed]
        if not live:
            return
        victim = rng.choice(live)
        if kills > 0 and rng.random() < 0.3:
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
        m.proc.send_signal(signal.SIGUSR2)  # what it holds (tests/storage/_stress_child.py's dump_state)
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


def _schedule(rng: random.Random, kill: bool) -> dict:
    """A member's schedule at the protocol's steps (tests/storage/_stress_steps.py): seeded pauses at the
    fault-injection points and, with ``kill``, a death at one of them."""
    schedule = {"seed": rng.randrange(1 << 30), "pause": rng.choice([0.0, 0.1, 0.3]), "pause_ms": rng.choice([5, 30])}
    if kill:
        schedule["kill"] = [rng.choice(["reserved", "downloaded", "gave-back"]), rng.randint(1, 4)]
    return schedule


def _round(round_seed: int, server, dataset: str, tmp_path) -> str:
    url = server.url + "ds"
    rng = random.Random(round_seed)
    n = rng.randint(2, 8)
    seeds = rng.sample(range(1000), n)  # distinct: distinct passes (equal passes are one job's ranks)
    doomed = rng.randrange(n) if rng.random() < 0.5 else -1  # one member may die at a protocol step
    members = []
    for k, seed in enumerate(seeds):
        out = tmp_path / f"r{round_seed}-m{k}"
        out.mkdir()
        members.append(Member(seed, rng.randint(1, 3), rng.choice([16, 25, 32, 50]), str(out), _schedule(rng, k == doomed)))
    minimum = max(_minimum(url, str(tmp_path / "probe"), m.window, m.batch) for m in members)
    limit = int(minimum * rng.choice([1.0, 1.0, 1.3, 2.0, 3.0]))
    cache_dir = str(tmp_path / f"cache-{round_seed}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
               CHUTE_CACHE_STEPS="tests.storage._stress_steps:step")
    server.log.clear()
    deadline = time.monotonic() + START_S
    checker = Checker(cache_dir, limit)
    stop_chaos = threading.Event()
    log: list[str] = []
    chaos = None
    try:
        for m in members:
            with open(os.path.join(m.out, "stderr"), "w") as stderr:  # the child keeps its own descriptor
                m.proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.storage._stress_child", url, cache_dir, str(limit), str(m.seed),
                     str(m.window), str(m.batch), str(EPOCHS), m.out],
                    cwd=REPO_ROOT, env=dict(env, CHUTE_STRESS_SCHEDULE=json.dumps(m.schedule)), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=stderr, text=True,
                )
        for m in members:
            with selectors.DefaultSelector() as waiting:  # (not select(): a long test run may hold fds past 1024)
                waiting.register(m.proc.stdout, selectors.EVENT_READ)
                ready = waiting.select(max(0.0, deadline - time.monotonic()))
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
            if m.proc is not None:
                for pipe in (m.proc.stdin, m.proc.stdout):
                    with contextlib.suppress(OSError):
                        pipe.close()
        checker.stop()
    for m in members:
        if m.proc is not None and m.proc.returncode == -signal.SIGKILL and "killed by its schedule" in _stderr(m):
            m.killed = True
            log.append(f"seed={m.seed} killed at {m.schedule['kill']}")
    schedules = {m.seed: m.schedule for m in members}
    where = f"CHUTE_STRESS_SEED={round_seed} (n={n}, limit {limit:,}, minimum {minimum:,}, chaos {log}, schedules {schedules})"
    assert checker.samples > 0
    assert not checker.over, (f"{where}: the cache held {max(checker.over):,} bytes > limit {limit:,} (invariant 1); "
                              f"when first over: {checker.first_over}")
    assert not checker.overgrown, f"{where}: downloads written past their size: {sorted(set(checker.overgrown))}"
    assert not checker.leases_over, f"{where}: live leases add up to {max(checker.leases_over):,} > limit {limit:,} (invariant 2)"
    reached: dict[str, int] = {}
    for m in members:
        for line in _stderr(m).splitlines():
            if line.startswith(STEPS):
                for name, count in json.loads(line[len(STEPS):]).items():
                    reached[name] = reached.get(name, 0) + count
    assert all(reached.get(name) for name in ("reserved", "downloaded", "held", "release")), f"{where}: steps reached {reached}"
    violations = [line for m in members for line in _stderr(m).splitlines() if line.startswith(VIOLATION)]
    assert not violations, f"{where}: {violations}"
    overlapping = _overlapping_downloads(server.requests)
    assert not overlapping, f"{where}: shards downloaded by two holders at once (invariant 4): {overlapping}"
    differs = _journal_differs(cache_dir)
    assert differs is None, f"{where}: {differs} (invariant 5)"
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
    return f"{where}, steps reached {reached}"


@pytest.mark.slow
def test_members_killed_and_stopped_at_random_never_break_the_cache(http_server, dataset, tmp_path):
    shutil.copytree(dataset, http_server.root / "ds")
    master = int(os.environ.get("CHUTE_STRESS_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"CHUTE_STRESS_SEED={master}")
    rng = random.Random(master)
    for k in range(ROUNDS):
        round_seed = master if k == 0 else rng.randrange(1 << 30)
        print(f"round {k}: CHUTE_STRESS_SEED={round_seed}", flush=True)
        print("  ", _round(round_seed, http_server, dataset, tmp_path), flush=True)
