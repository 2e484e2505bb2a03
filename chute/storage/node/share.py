"""Sharing one limited node cache between processes: leases, turns and wake-ups.

Every process that holds shards of a cache with a byte limit is a **member** of
the cache directory while it holds them. A member has a **lease**: the bytes it
may hold at once (the shards it holds, is downloading, or has claimed for a
coming batch). Leases together never pass the limit, so a member that stays
within its lease always finds room by evicting shards nobody holds: it never
waits for another process to make room, and so never holds a lock that another
process waits for while it waits.

* **Taking a turn.** A member first needs a lease of at least its ``minimum``
  (a loader: the bytes its pass must hold at once). When the room no lease uses
  is too small, it waits, holding nothing, first come first served. A waiter
  that holds nothing cannot close a cycle, so this cannot deadlock.
* **Read-ahead in fair shares.** Beyond its minimum a member may grow its lease,
  up to its ``want``, out of the room no lease uses, to its fair share
  (:func:`fair_leases`: each at least its minimum, the rest split evenly). While
  a process waits for its turn the shares leave room for it: the others give
  back what they hold beyond their share (a loader drops the read-ahead no batch
  task has asked for yet, see chute/storage/node/fetcher.py) and shrink their lease
  as their consumer moves on.
* **Wake-ups, not polls.** Each member has a doorbell, a FIFO that a listener
  thread of its own waits on. A process that starts waiting rings every member
  (so that they give back read-ahead); a member that shrinks its lease or leaves
  rings the waiters. A process killed while holding a lease cannot ring: the
  kernel drops its lock, which frees its lease, and waiters notice at their next
  check, at most ``DEAD_PEER_CHECK_S`` seconds later.

Layout, beside the shards::

    <cache_dir>/.chute-members/<pid>-<token>        a member's state (JSON), flock'd by its owner for life
    <cache_dir>/.chute-members/<pid>-<token>.bell   its doorbell (a FIFO)

Member files are read and written only under the cache lock (``.chute-cache.lock``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from chute.errors import CacheFullError
from chute.storage.node import steps

log = logging.getLogger("chute")

LOCK_NAME = ".chute-cache.lock"
MEMBERS_DIR = ".chute-members"
BELL_SUFFIX = ".bell"

#: How long a waiter sleeps at most before it looks again for members that died
#: holding a lease (a dead process cannot ring). Every other change rings.
DEAD_PEER_CHECK_S = 5.0

#: Shards a member lists as the next it will read, for other processes' eviction.
SOON = 32


@contextlib.contextmanager
def cache_lock(cache_dir: str) -> Iterator[None]:
    """Hold the node cache's lock (``flock``; a fresh descriptor, so it excludes threads too)."""
    os.makedirs(cache_dir, exist_ok=True)
    fd = os.open(os.path.join(cache_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _remove_member(members_dir: str, member: str) -> None:
    """Remove a member's files, its doorbell first: a process that ends between the two (a daemon
    thread stopped at interpreter exit) leaves its state file, which the next look at the members
    finds unlocked and removes; the other way round it would leave a doorbell that nothing names."""
    for path in (os.path.join(members_dir, member + BELL_SUFFIX), os.path.join(members_dir, member)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def fair_leases(limit: int, claims: Sequence[tuple[int, int]]) -> list[int]:
    """Leases for members asking ``(minimum, want)``: each at least its minimum, at most
    ``max(minimum, want)``, the room above the minima shared evenly ("water filling").

    When the minima alone reach ``limit`` every member gets its minimum.
    """
    if not claims:
        return []
    lows = [m for m, _ in claims]
    highs = [max(m, w) for m, w in claims]
    if sum(lows) >= limit:
        return lows
    if sum(highs) <= limit:
        return highs

    def total(level: int) -> int:
        return sum(min(max(level, lo), hi) for lo, hi in zip(lows, highs))

    lo, hi = 0, max(highs)
    while lo < hi:  # the highest level whose leases fit
        mid = (lo + hi + 1) // 2
        if total(mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return [min(max(lo, a), b) for a, b in zip(lows, highs)]


@dataclasses.dataclass
class MemberState:
    """What a member publishes to the others."""

    minimum: int = 0
    want: int = 0
    lease: int = 0
    waiting: int = 0  # while waiting for a turn or more room: when it started (ns), for first come first served
    soon: list[str] = dataclasses.field(default_factory=list)  # "<dataset dir>/<file>" it reads next, soonest first
    job: str = ""  # the pass it reads: equal for the ranks of one job (same dataset, order, epoch)

    def to_json(self) -> bytes:
        # (not dataclasses.asdict, which deep-copies ``soon`` first: a member publishes at every release)
        return json.dumps({"minimum": self.minimum, "want": self.want, "lease": self.lease, "waiting": self.waiting,
                           "soon": self.soon, "job": self.job}).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> MemberState | None:
        try:
            raw = json.loads(data)
            return cls(int(raw["minimum"]), int(raw["want"]), int(raw["lease"]), int(raw["waiting"]),
                       [str(s) for s in raw.get("soon", [])], str(raw.get("job", "")))
        except (ValueError, KeyError, TypeError):
            return None  # a foreign or half-written file: ignored


def _ring(path: str) -> None:
    """Write a byte to a doorbell if its owner listens (a full pipe has been rung already)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody listens (its owner died); ENOENT: it left
        return
    try:
        os.write(fd, b"\0")
    except OSError:
        pass
    finally:
        os.close(fd)


class Sharing:
    """One ShardCache's membership of its cache directory: lease, turn, doorbell, listener.

    The cache reports the bytes it holds or has claimed with :meth:`reserve`
    (or :meth:`try_reserve`) and :meth:`unreserve`; a loader's fetcher
    declares its minimum and read-ahead with :meth:`attach` and gives back
    read-ahead when :attr:`on_demand` is called. The membership exists while
    anything is reserved or attached, and ends (with its listener thread) when
    neither is.
    """

    def __init__(self, cache_dir: str, limit: int, name: str = "chute-share", direct_minimum: int = 0) -> None:
        self.cache_dir = cache_dir
        self.limit = limit
        self.name = name
        self.direct_minimum = direct_minimum  # the minimum of direct reads (no loader attached)
        self.members_dir = os.path.join(cache_dir, MEMBERS_DIR)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.reserved = 0  # bytes of shards held, being got, or claimed
        # fetchers attached: id -> (minimum, want, on_demand, on_change, soon); see attach()
        self._attached: dict[int, tuple[int, int, Callable[[], None], Callable[[], None], Callable[[], list[str]]]] = {}
        self._waiters = 0  # threads of this process waiting in reserve()
        self._job = ""
        self._id: str | None = None
        self._fd: int | None = None
        self._listener: _Listener | None = None
        self.state = MemberState()
        self.counts = {"turn_waits": 0, "yields": 0}
        self.process = ""  # the process this member stands for in member names ("": this one's pid); tests set it

    # ------------------------------------------------------------------ what the cache and the fetcher call

    @property
    def lease(self) -> int:
        return self.state.lease

    def attach(self, owner: object, minimum: int, want: int, *, on_demand: Callable[[], None],
               on_change: Callable[[], None], soon: Callable[[], list[str]], job: str = "") -> None:
        """A loader's fetcher starts: its pass must hold ``minimum`` bytes at once and would read
        ahead ``want``. ``on_demand`` gives back read-ahead, ``on_change`` says the lease may have
        grown, ``soon`` lists the shards it reads next (called under the cache lock: no locking);
        ``job`` names the pass (the ranks of one job read the same one)."""
        with self._cond:
            self._attached[id(owner)] = (minimum, max(minimum, want), on_demand, on_change, soon)
            self.state.job = self._job = job

    def detach(self, owner: object) -> None:
        """The fetcher is done; the membership ends once nothing is reserved."""
        with self._cond:
            self._attached.pop(id(owner), None)
            if not self._attached:
                self._job = ""
        self.settle()

    def soon(self) -> list[str]:
        """The shards this process's fetchers read next (call holding the cache lock)."""
        return [ident for *_, soon in list(self._attached.values()) for ident in soon()]

    def try_reserve(self, size: int) -> bool:
        """Reserve ``size`` more bytes if the lease covers them or can grow to, without waiting."""
        with self._cond:
            if self._id is None:
                return False  # joining may mean waiting for a turn: only reserve() does it
            if self.reserved + size <= self.state.lease:
                self.reserved += size
                return True
        with cache_lock(self.cache_dir), self._cond:
            if self._id is None:
                return False
            need = self.reserved + size
            if not self._grow(self._others(), need, waited=False):
                return False
            self.reserved += size
            return True

    def reserve(self, size: int, at_least: int = 0, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Reserve ``size`` more bytes, with a lease of at least ``at_least``; wait for a turn if needed.

        The wait is first come first served among the processes of this cache
        directory, and is woken by their doorbell rings (see the module docstring).
        """
        with self._cond:
            if self._id is not None and max(self.reserved + size, at_least) <= self.state.lease:
                self.reserved += size
                return
            self._waiters += 1
        try:
            while True:
                if cancelled():
                    from chute.storage.net.remote import Cancelled

                    raise Cancelled(f"waiting for room in the cache {self.cache_dir}: cancelled (closed)")
                ring: list[str] = []
                with cache_lock(self.cache_dir), self._cond:
                    others = self._others()
                    if not at_least and self._parent_is_member(others):
                        self.reserved += size  # a loader's worker process: its reads are its parent's
                        return
                    if self._id is None:
                        self._join()
                    need = max(self.reserved + size, at_least)
                    if need > self.limit:
                        raise CacheFullError(
                            f"cache_limit {self.limit:,} bytes of {self.cache_dir} cannot hold the {need:,} bytes "
                            f"this process must hold at once; raise cache_limit to at least {need:,} bytes"
                        )
                    if self._grow(others, need, waited=True):
                        self.reserved += size
                        if self.state.waiting:
                            self.state.waiting = 0
                            self._publish()
                        return
                    self._check_job(others, at_least)
                    if not self.state.waiting:  # from now on others keep room for this process
                        self.state.waiting = time.time_ns()
                        self._publish()
                        self.counts["turn_waits"] += 1
                        ring = list(others)
                for other in ring:  # they give back read-ahead beyond their share, and ring back
                    _ring(self._bell_path(other))
                if steps.HOOK is not None:
                    steps.HOOK("turn-wait", reserved=self.reserved, at_least=at_least)
                with self._cond:
                    began = time.monotonic()
                    rung = self._cond.wait(DEAD_PEER_CHECK_S)
                if steps.HOOK is not None:
                    steps.HOOK("woken", rung=rung, seconds=time.monotonic() - began)
        finally:
            with self._cond:
                self._waiters -= 1
                still_waiting = self._id is not None and self.state.waiting
            if still_waiting:  # cancelled or failed: stop holding the others back
                with cache_lock(self.cache_dir), self._cond:
                    if self._id is not None and self.state.waiting:
                        self.state.waiting = 0
                        self._publish()

    def await_room(self) -> None:
        """Wait once for room (rings or the dead-peer check): only holds outside any lease (a
        loader's worker processes, the progressive mode) can leave a process without the room
        a lease promises. While it waits, the others give back read-ahead."""
        with cache_lock(self.cache_dir), self._cond:
            if self._id is None:
                self._join()  # a doorbell, to be woken (a guest's lease stays 0)
            others = self._others()
            if not self.state.waiting:
                self.state.waiting = time.time_ns()
                self._publish()
        for other in others:
            _ring(self._bell_path(other))
        with self._cond:
            began = time.monotonic()
            rung = self._cond.wait(DEAD_PEER_CHECK_S)
        if steps.HOOK is not None:
            steps.HOOK("woken", rung=rung, seconds=time.monotonic() - began)
        with cache_lock(self.cache_dir), self._cond:
            if self._id is not None and self.state.waiting and not self._waiters:
                self.state.waiting = 0
                self._publish()

    def unreserve(self, size: int) -> None:
        """``size`` reserved bytes are no longer held (call :meth:`settle` after)."""
        with self._cond:
            self.reserved -= size
            assert self.reserved >= 0, self.reserved

    def settle(self) -> None:
        """Shrink the lease toward the fair share (ringing the waiters), or leave when idle."""
        with self._cond:
            if self._id is None:
                return
        ring: list[str] = []
        stop = None
        with cache_lock(self.cache_dir), self._cond:
            if self._id is None:
                return
            others = self._others()
            if self.reserved == 0 and not self._attached and self._waiters == 0:
                stop = self._leave()
                ring = [o for o, s in others.items() if s.waiting]
            else:
                before = self.state.lease
                self._shrink(others)
                self._publish()
                if self.state.lease < before:
                    ring = [o for o, s in others.items() if s.waiting]
        if ring and steps.HOOK is not None:
            steps.HOOK("gave-back", lease=self.state.lease, ringing=len(ring))
        for other in ring:
            _ring(self._bell_path(other))
        if stop is not None:
            stop.end()
        self.wake()  # a thread of this process waiting for room may find it now

    def wake(self) -> None:
        """Wake this process's threads waiting here (e.g. their loader was closed)."""
        with self._cond:
            self._cond.notify_all()

    def others_soon(self) -> dict[str, int]:
        """For eviction (call holding the cache lock): each shard another live member reads
        soon, with its position in that member's list (the smallest over members)."""
        ranks: dict[str, int] = {}
        for state in self._others().values():
            for k, item in enumerate(state.soon):
                ranks[item] = min(k, ranks.get(item, k))
        return ranks

    def close(self) -> None:
        """Leave the cache directory's members, whatever is still reserved."""
        with cache_lock(self.cache_dir), self._cond:
            if self._id is None:
                return
            others = self._others()
            stop = self._leave()
            self.reserved = 0
        for other, state in others.items():
            if state.waiting:
                _ring(self._bell_path(other))
        stop.end()

    # ------------------------------------------------------------------ the registry (under the cache lock)

    def _bell_path(self, member: str) -> str:
        return os.path.join(self.members_dir, member + BELL_SUFFIX)

    def _join(self) -> None:
        os.makedirs(self.members_dir, exist_ok=True)
        member = f"{self.process or os.getpid()}-{secrets.token_hex(6)}"
        path = os.path.join(self.members_dir, member)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for life; the kernel drops it if this process dies
        os.mkfifo(self._bell_path(member), 0o600)
        bell = os.open(self._bell_path(member), os.O_RDWR | os.O_NONBLOCK)  # RDWR: never an end of file
        self._id, self._fd = member, fd
        self.state = MemberState()
        self._publish()
        self._listener = _Listener(bell, self._on_ring, f"{self.name}-{member}")

    def _leave(self) -> _Listener:
        """Remove this member's files; the listener to end once the locks are dropped."""
        member, fd, listener = self._id, self._fd, self._listener
        assert member is not None and fd is not None and listener is not None, "only a member leaves"
        _remove_member(self.members_dir, member)
        os.close(fd)
        self._id = self._fd = self._listener = None
        self.state = MemberState()
        return listener

    def _others(self) -> dict[str, MemberState]:
        """The other live members' states; members whose process died are removed."""
        out: dict[str, MemberState] = {}
        try:
            names = os.listdir(self.members_dir)
        except FileNotFoundError:
            return out
        for name in names:
            if name.endswith(BELL_SUFFIX) or name == self._id:
                continue
            path = os.path.join(self.members_dir, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    state = MemberState.from_json(os.pread(fd, 1 << 20, 0))
                    if state is not None:
                        out[name] = state
                    continue
                _remove_member(self.members_dir, name)  # its owner died: its lease is free
            finally:
                os.close(fd)
        return out

    def _check_job(self, others: dict[str, MemberState], minimum: int) -> None:
        """Refuse to wait for a turn that cannot come: other ranks of the same job, or other
        datasets of this same process, hold leases that leave no room for this one's, and they
        will not let go without it (ranks wait for each other in collectives; a process that
        reads two loaders together waits for itself)."""
        if not minimum:
            return
        peers = [s for s in others.values() if self._job and s.job == self._job and not s.waiting]
        if peers and sum(s.minimum for s in peers) + minimum > self.limit:
            need = sum(s.minimum for s in peers) + minimum
            raise CacheFullError(
                f"cache_limit {self.limit:,} bytes of {self.cache_dir} is too small for the {len(peers) + 1} processes "
                f"on this node that read the same pass (the ranks of one job): each holds its own {minimum:,} bytes "
                f"at once; raise cache_limit to at least {need:,} bytes"
            )
        mine = f"{self.process or os.getpid()}-"
        kept = sum(min(s.lease, s.minimum) for name, s in others.items() if name.startswith(mine) and not s.waiting)
        if kept and kept + minimum > self.limit:
            raise CacheFullError(
                f"cache_limit {self.limit:,} bytes of {self.cache_dir} is too small for the datasets this process "
                f"reads through it at once: another of them keeps {kept:,} bytes while this loader needs {minimum:,}; "
                f"raise cache_limit to at least {kept + minimum:,} bytes, or close the other dataset (or its loader) first"
            )

    def _publish(self) -> None:
        fd = self._fd
        if fd is None:  # not a member (_id, _fd and _listener are set and cleared together)
            return
        self.state.job = self._job
        self.state.minimum, self.state.want = self._claim()
        self.state.soon = self.soon()[:SOON]
        data = self.state.to_json()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))

    def _claim(self) -> tuple[int, int]:
        """``(minimum, want)``: the attached fetchers' together, else direct reads'."""
        if not self._attached:
            return self.direct_minimum, self.direct_minimum
        claims = list(self._attached.values())
        return sum(c[0] for c in claims), sum(c[1] for c in claims)

    @staticmethod
    def _parent_is_member(others: dict[str, MemberState]) -> bool:
        """Whether this process's parent shares the cache: then this is one of a loader's worker
        processes (``workers="processes"``), which read the shards the parent's downloader holds
        for them, and it takes no lease of its own (the parent's lease covers its reads; a lease
        per worker could leave the workers waiting for a turn their parent holds)."""
        prefix = f"{os.getppid()}-"
        return any(name.startswith(prefix) for name in others)

    def _free(self, others: dict[str, MemberState]) -> int:
        return self.limit - self.state.lease - sum(s.lease for s in others.values())

    def _target(self, others: dict[str, MemberState]) -> int:
        """This member's fair share, keeping room for the process that has waited longest."""
        admitted = [(s.minimum, s.want) for s in others.values() if not s.waiting]
        waiting = sorted((s.waiting, s.minimum) for s in others.values() if s.waiting)
        reserve = waiting[0][1] if waiting and not self.state.waiting else 0
        return fair_leases(max(0, self.limit - reserve), [*admitted, self._claim()])[-1]

    def _grow(self, others: dict[str, MemberState], need: int, *, waited: bool) -> bool:
        """Grow the lease to cover ``need`` bytes out of the room no lease uses, if fair; whether it does.

        A member that is not waiting grows freely while nobody waits, and up to its
        fair share otherwise. A waiting member grows once no one has waited longer.
        """
        if need <= self.state.lease:
            return True
        waiters = [s.waiting for s in others.values() if s.waiting]
        if waited and self.state.waiting:
            allowed = not any(w < self.state.waiting for w in waiters)
        elif waited:
            allowed = not waiters
        else:
            allowed = not waiters or need <= self._target(others)
        if not allowed or need > self.state.lease + self._free(others):
            return False
        grown = max(need, min(self._target(others), self.state.lease + self._free(others)))
        self.state.lease = grown
        self._publish()
        return True

    def _shrink(self, others: dict[str, MemberState]) -> None:
        """Down toward the fair share, never below what is reserved (nor an attached fetcher's minimum)."""
        minimum, _ = self._claim()
        floor = max(self.reserved, minimum if self._attached else 0)
        target = self._target(others)
        if self.state.lease > target:
            self.state.lease = max(target, floor)

    # ------------------------------------------------------------------ the listener

    def _on_ring(self) -> None:
        """The doorbell rang: wake this process's waiters; give back read-ahead if a process waits."""
        with self._cond:
            attached = list(self._attached.values())
            self._cond.notify_all()
        if attached and self._someone_waits():
            self.counts["yields"] += 1
            for _, _, on_demand, _, _ in attached:
                on_demand()
            self.settle()
        for _, _, _, on_change, _ in attached:
            on_change()

    def _someone_waits(self) -> bool:
        with cache_lock(self.cache_dir), self._cond:
            return self._id is not None and any(s.waiting for s in self._others().values())


#: How long :meth:`_Listener.end` waits for the listener thread before leaving the bell to it.
_LISTENER_JOIN_S = 10.0


class _Listener:
    """The thread that waits on a member's doorbell and calls ``on_ring`` for every ring."""

    def __init__(self, bell: int, on_ring: Callable[[], None], name: str) -> None:
        self.bell = bell
        self.on_ring = on_ring
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._closes_itself = False  # the thread closes the bell when it ends (end() did not wait for it)
        self._done = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        poller = select.poll()  # (not select(): a process may hold descriptors past FD_SETSIZE, 1024)
        poller.register(self.bell, select.POLLIN)
        try:
            while not self.stop.is_set():
                poller.poll()
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.bell, 4096):
                        pass
                if not self.stop.is_set():
                    self.on_ring()
        finally:
            with self._lock:
                self._done = True
                close = self._closes_itself
            if close:
                os.close(self.bell)

    def end(self) -> None:
        """Stop the thread and close the doorbell (from any thread, the listener's own included):
        exactly one of the two closes it, the thread itself if it has not ended within 10 s."""
        self.stop.set()
        if self.thread is threading.current_thread():
            with self._lock:
                self._closes_itself = True  # seen at the top of its loop
            return
        with contextlib.suppress(OSError):
            os.write(self.bell, b"\0")
        self.thread.join(timeout=_LISTENER_JOIN_S)
        with self._lock:
            if not self._done:  # still in on_ring: it closes the bell when it gets out
                self._closes_itself = True
                return
        os.close(self.bell)


__all__ = ["Sharing", "cache_lock", "fair_leases", "DEAD_PEER_CHECK_S"]
