"""The node cache's journal (chute/storage/node/ledger.py): what a process counts is what the directory holds.

- a reservation reads the journal's new lines, not the directory: one scan per process for a whole epoch;
- each process's copy follows the others' changes, and a rewrite of the journal by another's scan;
- a journal it cannot trust (a torn or foreign line, a write outside the lock, gone) leads to a scan;
- a dead download counted by the journal is removed by the scan an eviction falls back to;
- the journal stays within a bound of the state it describes.
"""

from __future__ import annotations

import os
import threading

import pytest

import chute
from chute.storage.node import ledger as ledger_module
from chute.storage.node.ledger import JOURNAL, Ledger, scan
from chute.storage.node.share import cache_lock
from tests.storage._helpers import STALL_S, assert_same_epoch, epoch_columns, loader, local_epochs, part_files, write_dataset


def _dataset_dir(cache_dir, key: str = "0123456789abcdef"):
    path = cache_dir / key
    (path / "locks").mkdir(parents=True)
    return path


def _shard(directory, name: str, size: int) -> None:
    with open(directory / name, "wb") as f:
        f.truncate(size)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served(http_server) -> str:
    write_dataset(str(http_server.root / "ds"))
    return http_server.url + "ds"


def test_an_epoch_with_evictions_scans_the_directory_once_and_the_journal_matches_it(http_server, served, tmp_path, monkeypatch):
    scans = []
    monkeypatch.setattr(ledger_module, "scan", lambda d: scans.append(d) or scan(d))
    cache_dir = str(tmp_path / "cache")
    limit = chute.open(str(http_server.root / "ds")).nbytes // 4
    ds = chute.open(served, cache_dir=cache_dir, cache_limit=limit)
    got = epoch_columns(loader(ds))
    assert_same_epoch(got, local_epochs(str(http_server.root / "ds"), 1)[0])
    assert ds.cache.counts["evictions"] > 0 and ds.cache.counts["shards_downloaded"] == len(ds.shards)
    assert len(scans) == 1  # the first reservation's; every later one read the journal's new lines
    with cache_lock(cache_dir):
        books = ledger_module.ledger(cache_dir)
        books.sync()
        assert books.files == scan(cache_dir)  # what it counted is what is there


def test_each_process_follows_the_others_changes_and_their_rewrites(tmp_path):
    directory = _dataset_dir(tmp_path)
    _shard(directory, "a.arrow", 100)
    one, two = Ledger(str(tmp_path)), Ledger(str(tmp_path))  # two processes' copies
    one.sync()
    two.sync()
    assert one.files == two.files == {f"{directory.name}/a.arrow": 100} and (one.scans, two.scans) == (1, 1)
    _shard(directory, "b.arrow", 50)
    one.sync()  # as under the lock: look, then change (two's first look rewrote the journal)
    assert one.scans == 1
    one.add(str(directory), "b.arrow", 50)
    (directory / "a.arrow").unlink()
    one.remove(str(directory), "a.arrow")
    _shard(directory, "c.arrow.7.x.part", 7)
    one.add(str(directory), "c.arrow.7.x.part", 7)
    two.sync()
    assert two.files == one.files == {f"{directory.name}/b.arrow": 50, f"{directory.name}/c.arrow.7.x.part": 7}
    assert two.used == 57 and two.scans == 1  # read from the journal
    two.rescan()  # rewrites the journal as a snapshot (the .part is dead: its download lock is free)
    one.sync()
    assert one.files == two.files == {f"{directory.name}/b.arrow": 50} and one.used == 50 and one.scans == 1
    assert not (directory / "c.arrow.7.x.part").exists()


def test_file_names_with_any_character_but_a_newline_go_through_the_journal(tmp_path):
    directory = _dataset_dir(tmp_path)
    one, two = Ledger(str(tmp_path)), Ledger(str(tmp_path))
    one.sync()
    two.sync()
    one.sync()
    odd = "shard \u2028 with\x0cbreaks\x1e.arrow"  # str.splitlines() would split these
    _shard(directory, odd, 9)
    one.add(str(directory), odd, 9)
    two.sync()
    assert two.files == {f"{directory.name}/{odd}": 9} and two.scans == 1  # read from the journal, not scanned


@pytest.mark.parametrize("damage", ["malformed", "foreign", "unlocked", "gone"])
def test_a_journal_it_cannot_trust_leads_to_a_scan(tmp_path, damage):
    directory = _dataset_dir(tmp_path)
    _shard(directory, "a.arrow", 100)
    books = Ledger(str(tmp_path))
    books.sync()
    journal = tmp_path / JOURNAL
    _shard(directory, "b.arrow", 30)  # on disk, and in the journal only if the damage allows
    if damage == "malformed":
        with open(journal, "a") as f:
            f.write(f"+ {directory.name}/b.arrow 30\n+ {directory.name}/b.arr\n")
    elif damage == "foreign":
        with open(journal, "a") as f:
            f.write("? something else\n")
    elif damage == "unlocked":  # appended by a writer that did not read it under the lock first
        with open(journal, "a") as f:
            f.write(f"+ {directory.name}/zzz.arrow 5\n")
        books._offset = 0  # this copy read less than is there: its own append must not trust the file
        books.add(str(directory), "b.arrow", 30)
        assert not journal.exists()  # everyone's next look scans
    else:
        journal.unlink()
    books.sync()
    assert books.scans == 2
    assert books.files == {f"{directory.name}/a.arrow": 100, f"{directory.name}/b.arrow": 30} and books.used == 130
    assert journal.exists()  # written anew from the scan


def test_the_journal_is_rescanned_after_rescan_s_and_rewritten_past_its_bound(tmp_path, monkeypatch):
    directory = _dataset_dir(tmp_path)
    clock = Clock()
    books = Ledger(str(tmp_path), clock=clock)
    books.sync()
    monkeypatch.setattr(ledger_module, "COMPACT_LINES", 10)
    for k in range(40):  # a download placed and evicted, over and over
        books.sync()
        books.add(str(directory), f"s{k}.arrow", 1)
        books.remove(str(directory), f"s{k}.arrow")
        lines = (tmp_path / JOURNAL).read_text().count("\n")
        assert lines <= 1 + 10 + 2  # its first line; rewritten once past COMPACT_LINES (+ twice the state, here empty)
    assert books.files == {} and books.scans > 1
    scans = books.scans
    clock.now += ledger_module.RESCAN_S - 0.1
    books.sync()
    assert books.scans == scans
    clock.now += 0.1
    books.sync()
    assert books.scans == scans + 1


def _full_of_a_dead_download(http_server, served, tmp_path, file) -> tuple:
    """``(ds, cache_dir, dead)``: a cache of a quarter of the dataset that this process trusts the journal of,
    full with the ``.part`` of ``file(ds)`` (a shard file name) that another process left when it was killed
    while it downloaded."""
    cache_dir = tmp_path / "cache"
    limit = chute.open(str(http_server.root / "ds")).nbytes // 4
    ds = chute.open(served, cache_dir=str(cache_dir), cache_limit=limit)
    ds.cache._make_dir()
    with cache_lock(str(cache_dir)):
        ledger_module.ledger(str(cache_dir)).sync()  # this process trusts the journal from here on
        other = Ledger(str(cache_dir))  # the other process
        other.sync()
        dead = f"{file(ds)}.{limit}.deadbeef.part"
        _shard(cache_dir / os.path.basename(ds.cache.dir), dead, limit)
        other.add(ds.cache.dir, dead, limit)
    return ds, cache_dir, dead


def test_a_dead_download_counted_by_the_journal_is_removed_when_room_runs_out(http_server, served, tmp_path):
    ds, cache_dir, dead = _full_of_a_dead_download(http_server, served, tmp_path, lambda ds: "shard-of-a-dataset-since-rewritten.arrow")
    got = epoch_columns(loader(ds))
    assert_same_epoch(got, local_epochs(str(http_server.root / "ds"), 1)[0])
    assert not os.path.exists(os.path.join(ds.cache.dir, dead))
    assert ledger_module.ledger(str(cache_dir)).scans == 2  # the first look, and the one that found the room


def test_a_dead_download_of_the_shard_this_process_downloads_next_is_removed(http_server, served, tmp_path):
    """A process killed while it downloaded shard 0 left its ``.part``, which fills the cache. This process
    takes shard 0's download lock before it reserves room, and then looks for dead downloads, found by
    trying their download lock: a try that fails against this process's own lock as against a live
    download's. The stress test hung there for good (the download waiting for the room only that
    ``.part`` held); the scan knows which download locks this process holds."""
    ds, cache_dir, _ = _full_of_a_dead_download(http_server, served, tmp_path, lambda ds: ds.cache._file(0))
    got: list[str] = []
    thread = threading.Thread(target=lambda: got.append(ds.cache.acquire(0)), daemon=True)
    thread.start()
    thread.join(STALL_S)
    if thread.is_alive():
        ds.close()  # cancels the wait for room
        pytest.fail(f"the download of shard 0 still waits for room after {STALL_S} s: {os.listdir(ds.cache.dir)}")
    with open(got[0], "rb") as f, open(os.path.join(str(http_server.root / "ds"), ds.shards[0].file), "rb") as want:
        assert f.read() == want.read()
    assert part_files(str(cache_dir)) == []
    with cache_lock(str(cache_dir)):
        books = ledger_module.ledger(str(cache_dir))
        books.sync()
        assert books.used == ds.shards[0].bytes
    ds.cache.release(0)
    ds.close()


def test_an_eviction_ranks_a_bounded_sample_of_a_large_cache(http_server, served, tmp_path, monkeypatch):
    from chute.storage.node import cache as cache_module

    ds = chute.open(served, cache_dir=str(tmp_path / "cache"), cache_limit=1 << 30)
    ranked = []

    def order():
        return lambda item: ranked.append(item) or item[2]  # evict the largest "next use" first

    monkeypatch.setattr(ds.cache, "_eviction_order", order)
    candidates = [("d", f"s{k}.arrow", k) for k in range(10)]
    monkeypatch.setattr(cache_module, "EVICTION_SAMPLE", 10)
    assert list(ds.cache._by_eviction_order(candidates, set())) == candidates[::-1]  # up to the sample size: exact
    held = [(ds.cache.dir, "s1.arrow", 1), ("d", "s1.arrow", 5)]  # this dataset's s1 is held here; another's is not
    assert list(ds.cache._by_eviction_order(held, {"s1.arrow"})) == [("d", "s1.arrow", 5)]
    ranked.clear()
    monkeypatch.setattr(cache_module, "EVICTION_SAMPLE", 4)
    victims = ds.cache._by_eviction_order(candidates, set())
    first = next(victims)
    assert len(ranked) == 4 and first == max(ranked, key=lambda c: c[2])  # the best of the sample, 4 keys computed
    sample = list(ranked)
    rest = list(victims)
    assert sorted([first, *rest]) == sorted(candidates)  # every shard once, if room takes them all
    assert rest[3:] == sorted(set(candidates) - set(sample), key=lambda c: c[2], reverse=True)  # then in exact order


def test_a_journal_rewritten_under_the_inode_number_this_copy_read_is_read_whole(tmp_path):
    """A file system gives a freed inode number to the next file it makes (ext4 alternates two between
    successive rewrites of the journal), so after two rewrites by other processes the journal can be a new
    file under the number this copy read. Read on from its old offset, this copy would miss what the new
    file's start counts, and reserve that much over the limit: it reads the file whole, as its first line
    (new at every rewrite) is not the one it read."""
    directory = _dataset_dir(tmp_path)
    key = directory.name
    _shard(directory, "a.arrow", 100)
    _shard(directory, "b.arrow", 100)
    books = Ledger(str(tmp_path))
    books.sync()
    journal = tmp_path / JOURNAL
    first = journal.read_bytes()
    head = first[: first.index(b"\n") + 1]
    assert head.startswith(b"# ") and len(head) == ledger_module.HEAD_BYTES
    assert sorted(first[len(head):].splitlines()) == [f"+ {key}/a.arrow 100".encode(), f"+ {key}/b.arrow 100".encode()]
    # Another process's rewrite, in the same file (same inode), of a state with one more shard. Its lines
    # are laid out so that this copy's offset falls on a line boundary of it: read from there, the copy
    # would take the last line alone and count 200 bytes, not 4,928.
    _shard(directory, "c.arrow", 4_818)
    os.truncate(directory / "a.arrow", 10)
    lines = [f"+ {key}/c.arrow 4818\n", f"+ {key}/a.arrow 10\n", f"+ {key}/b.arrow 100\n"]
    assert len(head) + len(lines[0]) + len(lines[1]) == len(first)  # (the offset this copy read up to)
    other = b"# " + b"f" * (ledger_module.HEAD_BYTES - 3) + b"\n"
    ino = journal.stat().st_ino
    with open(journal, "r+b") as f:
        f.truncate(0)
        f.write(other + "".join(lines).encode())
    assert journal.stat().st_ino == ino
    books.sync()
    assert books.files == {f"{key}/a.arrow": 10, f"{key}/b.arrow": 100, f"{key}/c.arrow": 4_818}
    assert books.used == 4_928 and books.scans == 1  # read from the journal, whole: no scan


def test_a_journal_without_its_first_line_is_written_anew(tmp_path):
    """(As an older chute wrote it, with no first line to name it.)"""
    directory = _dataset_dir(tmp_path)
    _shard(directory, "a.arrow", 100)
    (tmp_path / JOURNAL).write_text(f"+ {directory.name}/a.arrow 100\n")
    books = Ledger(str(tmp_path))
    books._stale = False  # as if it had scanned: it reads the journal
    books._scanned = 0.0
    books.clock = lambda: 1.0
    books.sync()
    assert books.scans == 1 and books.files == {f"{directory.name}/a.arrow": 100}
    assert (tmp_path / JOURNAL).read_bytes().startswith(b"# ")
