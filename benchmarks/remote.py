"""Remote epochs through the node cache against the server's ceiling, and what later epochs download.

    python benchmarks/remote.py [--size-mb 1024] [--shards-mb 8,64] [--servers http,s3] [--runs 5]
    python benchmarks/remote.py --from-json PATH   # no run: an earlier run's list of rows as tables

A dataset of ``--size-mb`` of 1 MiB uint8 rows is written with shards of each
``--shards-mb`` and served by a real HTTP server and by moto's standalone S3
server, each in its own process on 127.0.0.1 (``python -m tests.servers``). For
each server and shard size, every run measures, in the same process:

* the ceiling: every shard downloaded once, 8 at a time, with the best client
  found (fsspec ``cat_file`` threads; for S3 also boto3 ``get_object``): the
  fastest of them is the ceiling;
* chute's cold epoch through an empty node cache limited to 25% of the dataset
  (the largest shuffle window of at most 4 shards that fits): MB/s delivered to the
  loop, the ratio to the ceiling, time to the first batch (``iter`` to batch 0)
  and to open, GET requests per shard;
* the second epoch: bytes downloaded / dataset (the bound is 1 - 0.25 + 0.05);
* the client's CPU seconds per GB: boto3's GETs into memory (S3), chute's downloads alone
  (into files, hashed), the cold epoch, and the cold epoch again on the same Loader with
  the cache emptied by hand (its batch blocks already allocated), each cold epoch also as a
  ratio to boto3's in the same run;
* the client's CPU of both cold epochs split by thread: the download threads, the Loader's batch threads, the rest;
* the same two epochs simulated on the shard-use sequence of ``Order.shard_uses``
  with LRU, chute's next-use eviction (next use within the running epoch) and
  Belady's bound (the whole future known).

Medians of ``--runs`` runs, one row per server and shard size, saved with
benchmarks/_results.py to benchmarks/results/remote.json: tables "speed", "cpu" (CPU seconds
per GB of the client and of the server process, for the ceiling, chute's downloads alone and the cold
epoch), "cpu_split" (the client's, by thread) and "downloads" (docs/benchmarks.md draws them with benchmarks/tables.py). A rerun of
some servers or shard sizes keeps the earlier run's other rows (the notes say so).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
from _results import RESULTS, earlier_rows, save  # noqa: E402

import chute  # noqa: E402
from chute.order import Order  # noqa: E402
from tests.servers import HTTPServerProcess, MotoS3Server, s3_client_env  # noqa: E402

ROW = 1 << 20
BATCH = 16
FRACTION = 0.25


def make_dataset(root: str, size_mb: int, shard_mb: int) -> chute.Dataset:
    path = os.path.join(root, f"rows{size_mb}-shard{shard_mb}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        rng = np.random.default_rng(0)
        block = rng.integers(0, 256, (64, ROW), dtype=np.uint8)
        samples = ({"x": np.roll(block[i % 64], i)} for i in range(size_mb))
        chute.write(samples, path, shard_size=f"{shard_mb}MiB", overwrite=True)
    return chute.open(path)


# ---------------------------------------------------------------------------- CPU time, client and server


def _server_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) the server process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Thread name prefixes of the client's parts: the node cache's downloads (and their byte ranges), the Loader's
#: batch tasks (the gather out of the cached shards); every other thread is "other".
THREAD_GROUPS = (("chute-fetch", "download"), ("chute-range", "download"), ("chute-loader", "loader"))


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process (``schedstat``: nanoseconds, where ``stat`` counts
    clock ticks): native id -> (its group, seconds)."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                seconds = int(f.read().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        name = names.get(int(tid), "")
        group = "sampler" if name == "bench-sampler" else next((g for prefix, g in THREAD_GROUPS if name.startswith(prefix)), "other")
        out[int(tid)] = (group, seconds)
    return out


def with_cpu_split(fn, pid: int, counts: dict | None = None):
    """:func:`with_cpu`, and the client's CPU seconds split by :data:`THREAD_GROUPS`: live threads are sampled
    every 50 ms (a thread that ends keeps what it used up to its last sample), "other" is the rest of the
    process's total. The sampler's own CPU is left out of the total and of the split.

    With ``counts`` (a ShardCache's counters), the download threads' CPU is also split at the first download
    into a recycled file (to 50 ms): "fill" (downloads into new files while the cache fills) and "full",
    with the bytes each downloaded (``fill_bytes``, ``full_bytes``)."""
    import threading

    before = _thread_cpu()
    seen: dict[int, tuple[str, float]] = {}
    fill = [0.0, 0]  # download CPU and bytes downloaded at the last sample before any recycled file
    stop = threading.Event()

    def downloads() -> float:
        return sum(sec - before.get(tid, (g, 0.0))[1] for tid, (g, sec) in seen.items() if g == "download")

    def sample() -> None:
        while True:
            seen.update(_thread_cpu())
            if counts is not None and not counts["recycled"]:
                fill[:] = [downloads(), counts["bytes_downloaded"]]
            if stop.wait(0.05):
                return

    bytes0 = counts["bytes_downloaded"] if counts is not None else 0
    sampler = threading.Thread(target=sample, name="bench-sampler", daemon=True)
    sampler.start()
    try:
        out, client, server = with_cpu(fn, pid)
    finally:
        stop.set()
        sampler.join()
    split = {"download": 0.0, "loader": 0.0, "sampler": 0.0}
    for tid, (group, seconds) in seen.items():
        if group in split:
            split[group] += seconds - before.get(tid, (group, 0.0))[1]
    client -= split.pop("sampler")
    split["other"] = client - split["download"] - split["loader"]
    if counts is not None and counts["recycled"]:
        split["fill"], split["fill_bytes"] = fill[0], fill[1] - bytes0
        split["full"], split["full_bytes"] = split["download"] - fill[0], counts["bytes_downloaded"] - fill[1]
    return out, client, server, split


def with_cpu(fn, pid: int):
    """``fn()``, and the CPU seconds this process (every thread: the client) and the server used meanwhile."""
    c0, s0 = os.times(), _server_cpu(pid)
    out = fn()
    c1, s1 = os.times(), _server_cpu(pid)
    return out, (c1.user - c0.user) + (c1.system - c0.system), s1 - s0


# ---------------------------------------------------------------------------- the ceiling


def ceiling_fsspec(url: str, names: list[str], threads: int = 8) -> float:
    """Seconds to GET every object once with fsspec ``cat_file``, ``threads`` at a time."""
    import fsspec.core

    fs, base = fsspec.core.url_to_fs(url)
    prefix = url.rstrip("/") if url.startswith("http") else base.rstrip("/")
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for data in pool.map(lambda n: fs.cat_file(f"{prefix}/{n}"), names):
            del data
    return time.perf_counter() - start


def boto3_client(endpoint: str, threads: int = 8):
    """A boto3 S3 client for ``endpoint``, made before any clock or CPU count starts (as chute's is, at open)."""
    import boto3
    import botocore.config

    return boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=threads))


def ceiling_boto3(client, bucket: str, prefix: str, names: list[str], threads: int = 8) -> float:
    """Seconds to GET every object once with boto3 ``get_object``, ``threads`` at a time."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for data in pool.map(lambda n: client.get_object(Bucket=bucket, Key=f"{prefix}/{n}")["Body"].read(), names):
            del data
    return time.perf_counter() - start


def chute_remote(url: str):
    """chute's Remote for ``url`` with its client made (botocore's for S3), before any clock or CPU count
    starts: a dataset makes it when it is opened."""
    from chute.storage.net.remote import Remote

    remote = Remote(url)
    _ = remote.s3_client, remote.http_client
    return remote


def ceiling_chute(remote, names: list[str], sizes: list[int], work: str, threads: int = 8) -> float:
    """Seconds for chute's own downloads of every object, ``threads`` at a time, as the node cache makes
    them (Remote.download into a file, hashed as the bytes arrive)."""
    os.makedirs(work, exist_ok=True)

    def one(k: int) -> None:
        dest = os.path.join(work, f"{k}.part")
        with open(dest, "wb") as f:
            f.truncate(sizes[k])
        remote.download(names[k], dest, sizes[k], "xxh3_128")
        os.unlink(dest)

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(names))))
    return time.perf_counter() - start


# ---------------------------------------------------------------------------- eviction, simulated


def simulate(order: Order, capacity: int, epochs: int = 2) -> dict[str, list[int]]:
    """Shards downloaded per epoch with LRU, next use within the epoch, and Belady (whole future),
    for a cache of ``capacity`` equal shards that must hold what each step reads."""
    per_epoch = [order.shard_uses(e) for e in range(epochs)]
    sequence = [(e, first, last, shard) for e, uses in enumerate(per_epoch) for first, last, shard in uses]
    out = {}
    for policy in ("lru", "next_use", "belady"):
        cached: dict[int, float] = {}  # shard -> LRU stamp
        held: dict[int, int] = {}  # shard -> last step (in its epoch) it is held to
        misses = [0] * epochs
        for k, (e, first, last, shard) in enumerate(sequence):
            for s in [s for s, (ep, until) in list(held.items()) if (ep, until) < (e, first)]:
                del held[s]
            if shard not in cached:
                misses[e] += 1
                if len(cached) >= capacity:
                    free = [s for s in cached if s not in held]
                    if policy == "lru":
                        victim = min(free, key=lambda s: cached[s])
                    else:
                        def next_at(s: int) -> float:
                            for j in range(k + 1, len(sequence)):
                                if sequence[j][3] == s:
                                    return math.inf if policy == "next_use" and sequence[j][0] != e else j
                            return math.inf
                        victim = max(free, key=next_at)
                    del cached[victim]
            cached[shard] = k
            held[shard] = (e, last)
        out[policy] = misses
    return out


# ---------------------------------------------------------------------------- one run


def epoch(loader: chute.Loader) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the epoch, bytes delivered)."""
    start = time.perf_counter()
    first = None
    nbytes = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        nbytes += batch["x"].numel()
    return first or 0.0, time.perf_counter() - start, nbytes


def cold_and_second(url: str, size: int, shards: int, cache: str, pid: int) -> dict[str, float]:
    shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    ds = chute.open(url, cache_dir=cache, cache_limit=int(size * FRACTION))
    opened = time.perf_counter() - start
    for window in (4, 2, 1):
        try:
            loader = chute.Loader(ds, BATCH, shuffle=chute.Shuffle(window=window), seed=0)
            break
        except chute.CacheFullError:
            continue
    else:
        raise SystemExit(f"a cache of {FRACTION:.0%} of {size:,} bytes cannot hold two windows of one shard: use a larger --size-mb")
    requests0 = ds.cache.remote.requests
    (first, seconds, nbytes), client_cpu, server_cpu, split = with_cpu_split(lambda: epoch(loader), pid, ds.cache.counts)
    stats1 = ds.cache.stats()
    requests1 = ds.cache.remote.requests - requests0
    _, seconds2, _ = epoch(loader)
    stats2 = ds.cache.stats()
    # The cold epoch again, with the same Loader: the shard files removed by hand (as docs/remote.md allows), so
    # the cache is cold while the Loader's batch blocks exist already (a new Loader's first pass also pays the
    # kernel's zeroing of every block it allocates: a cost per Loader, not per byte downloaded)
    for name in os.listdir(ds.cache.dir):
        if name.endswith(".arrow"):
            os.unlink(os.path.join(ds.cache.dir, name))
    (_, seconds3, _), client_cpu3, _, split3 = with_cpu_split(lambda: epoch(loader), pid)
    loader.close()
    ds.close()
    ds.cache.close()
    return {"open_ms": opened * 1e3, "ttfb_ms": first * 1e3, "cold_MBps": nbytes / seconds / 1e6,
            "second_MBps": nbytes / seconds2 / 1e6, "window": window,
            "cold_cpu_client": client_cpu / size * 1e9, "cold_cpu_server": server_cpu / size * 1e9,
            "recold_MBps": nbytes / seconds3 / 1e6, "recold_cpu_client": client_cpu3 / size * 1e9,
            **{f"cold_cpu_{k}": v / size * 1e9 for k, v in split.items() if k in ("download", "loader", "other")},
            # the download threads' CPU per GB they downloaded, into new files (the cache filling) and into recycled ones
            **({"cold_cpu_fill": split["fill"] / split["fill_bytes"] * 1e9, "cold_cpu_full": split["full"] / split["full_bytes"] * 1e9}
               if split.get("fill_bytes") and split.get("full_bytes") else {}),
            **{f"recold_cpu_{k}": v / size * 1e9 for k, v in split3.items()},
            "recycled": stats1["recycled"] / shards,
            "requests_per_shard": requests1 / shards,
            "cold_downloaded": stats1["bytes_downloaded"] / size,
            "second_downloaded": (stats2["bytes_downloaded"] - stats1["bytes_downloaded"]) / size}


def bench(server: str, shard_mb: int, args: argparse.Namespace, work: str) -> dict:
    local = make_dataset(args.data, args.size_mb, shard_mb)
    size = local.nbytes
    names = [s.file for s in local.shards]
    sizes = [s.bytes for s in local.shards]
    if server == "http":
        www = os.path.join(work, "www")
        shutil.rmtree(www, ignore_errors=True)
        os.makedirs(www)
        shutil.copytree(local.root, os.path.join(www, "ds"), copy_function=os.link)
        proc = HTTPServerProcess(www).start()
        url = proc.url.rstrip("/") + "/ds"
    else:
        proc = MotoS3Server().start()
        os.environ.update(s3_client_env(proc.endpoint_url))
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()  # a file system made for an earlier server would be reused
        proc.create_bucket("bench")
        url = "s3://bench/ds"
        import fsspec.core

        fs, base = fsspec.core.url_to_fs(url)
        fs.put(local.root.rstrip("/") + "/", base, recursive=True)
    try:
        rows = collections.defaultdict(list)
        pid = proc.pid
        assert pid is not None
        per_gb = 1e9 / size
        for _ in range(args.runs):
            runs = {"fsspec": with_cpu(lambda: ceiling_fsspec(url, names), pid)}
            if server == "s3":
                client = boto3_client(proc.endpoint_url)
                runs["boto3"] = with_cpu(lambda: ceiling_boto3(client, "bench", "ds", names), pid)
            clients = {client: size / run[0] / 1e6 for client, run in runs.items()}
            for client, rate in clients.items():
                rows[f"ceiling_{client}_MBps"].append(rate)
            best = max(clients, key=clients.__getitem__)
            rows["ceiling_MBps"].append(clients[best])
            rows["ceiling_cpu_client"].append(runs[best][1] * per_gb)
            rows["ceiling_cpu_server"].append(runs[best][2] * per_gb)
            if "boto3" in runs:  # boto3's GETs into memory: the client CPU a download alone costs there
                rows["boto3_cpu_client"].append(runs["boto3"][1] * per_gb)
            remote = chute_remote(url)
            seconds, client_cpu, server_cpu = with_cpu(lambda: ceiling_chute(remote, names, sizes, os.path.join(work, "dl")), pid)
            remote.close()
            rows["chute_download_MBps"].append(size / seconds / 1e6)
            rows["download_cpu_client"].append(client_cpu * per_gb)
            rows["download_cpu_server"].append(server_cpu * per_gb)
            for key, value in cold_and_second(url, size, len(names), os.path.join(work, "cache"), pid).items():
                rows[key].append(value)
            rows["ratio"].append(rows["cold_MBps"][-1] / rows["ceiling_MBps"][-1])
            if "boto3" in runs:  # the cold epoch's client CPU (download, hash, write, gather) per boto3's, this run
                rows["cold_cpu_vs_boto3"].append(rows["cold_cpu_client"][-1] / rows["boto3_cpu_client"][-1])
                rows["recold_cpu_vs_boto3"].append(rows["recold_cpu_client"][-1] / rows["boto3_cpu_client"][-1])
        row = {"label": f"{server}, {shard_mb} MB shards", "server": server, "shard_MB": shard_mb,
               "dataset_MB": round(size / 1e6), "shards": len(names), "runs": args.runs, "cache_fraction": FRACTION,
               "second_bound": round(1 - FRACTION + 0.05, 2)}
        row.update({k: round(statistics.median(v), 3) for k, v in rows.items()})
        # chute's own downloads are a client too: the ratio to the best of all of them
        row["ratio_best"] = round(row["cold_MBps"] / max(row["ceiling_MBps"], row["chute_download_MBps"]), 3)
        # what the CPU allows: every core busy with the client's and the server's work per byte
        cpus = len(os.sched_getaffinity(0))
        row["cpus"] = cpus
        for what in ("ceiling", "download", "cold"):
            row[f"{what}_cpu_bound_MBps"] = round(cpus * 1e3 / (row[f"{what}_cpu_client"] + row[f"{what}_cpu_server"]), 1)
        capacity = int(size * FRACTION) // max(sizes)
        order = Order(tuple(s.rows for s in local.shards), BATCH, shuffle=True, seed=0, window=int(row["window"]))
        # batch 0 waits for every shard its rows come from: their bytes at the ceiling bound the first batch
        touched = np.unique(np.searchsorted(order.offsets, order.batch(0, 0), side="right") - 1)
        row["batch0_MB"] = round(sum(sizes[int(s)] for s in touched) / 1e6, 1)
        row["ttfb_bound_ms"] = round(row["batch0_MB"] / row["ceiling_MBps"] * 1e3, 1)
        for policy, misses in simulate(order, capacity).items():
            row[f"sim_{policy}_second"] = round(misses[1] / len(names), 3)
        return row
    finally:
        proc.stop()


def tables(rows: list[dict], kept: list[dict] | None = None) -> dict[str, dict]:
    """``rows`` (one per server and shard size, as bench() makes them) as two benchmarks/_results.py tables.

    ``kept``: rows of an earlier run that this one did not measure (other
    servers or shard sizes); they follow, and the notes name them.
    """
    kept = kept or []
    out = []
    for row in [*rows, *kept]:
        row = dict(row)
        row.setdefault("ratio_best", row["cold_MBps"] / max(row["ceiling_MBps"], row["chute_download_MBps"]))
        out.append(row)
    runs = sorted({r["runs"] for r in out})
    common = (f"{out[0]['dataset_MB']:,} MB of 1 MiB rows, medians of {'/'.join(map(str, runs))} runs; cache limited to "
              f"{out[0]['cache_fraction']:.0%} of the dataset")
    if kept:
        common += "; rows kept from an earlier run: " + ", ".join(r["label"] for r in kept)
    # the table shows the window in the label; "name" keeps the row's own label
    labelled = [{**r, "name": r["label"], "label": f"{r['label']} (window {r['window']:.0f})"} for r in out]
    out_tables = {
        "speed": {
            "title": "server, shards",
            "columns": [["ceiling_MBps", "ceiling MB/s", ",.0f"], ["ceiling_fsspec_MBps", "fsspec MB/s", ",.0f"],
                        ["ceiling_boto3_MBps", "boto3 MB/s", ",.0f"], ["chute_download_MBps", "chute downloads alone MB/s", ",.0f"],
                        ["cold_MBps", "cold epoch MB/s", ",.0f"], ["ratio", "/ ceiling", ".2f"],
                        ["ratio_best", "/ best client (incl. chute's downloads)", ".2f"], ["ttfb_ms", "1st batch ms", ",.0f"],
                        ["batch0_MB", "batch 0's shards MB", ",.0f"], ["ttfb_bound_ms", "those at the ceiling ms", ",.0f"],
                        ["open_ms", "open ms", ",.0f"]],
            "rows": labelled,
            "notes": common + "; the ceiling is the fastest client measured in the same run (fsspec cat_file, boto3 get_object); "
                              "batch 0 needs every shard its rows come from: their bytes at the ceiling bound the first batch",
        },
        "cpu": {
            "title": "server, shards",
            "columns": [["ceiling_cpu_client", "ceiling: client CPU s/GB", ".2f"], ["ceiling_cpu_server", "server CPU s/GB", ".2f"],
                        ["download_cpu_client", "chute downloads alone: client CPU s/GB", ".2f"],
                        ["download_cpu_server", "server CPU s/GB", ".2f"],
                        ["cold_cpu_client", "cold epoch: client CPU s/GB", ".2f"], ["cold_cpu_server", "server CPU s/GB", ".2f"],
                        ["boto3_cpu_client", "boto3 GETs into memory: client CPU s/GB", ".2f"],
                        ["cold_cpu_vs_boto3", "cold epoch / boto3", ".2f"],
                        ["recold_cpu_client", "cold cache, Loader's later pass: client CPU s/GB", ".2f"],
                        ["recold_cpu_vs_boto3", "that / boto3", ".2f"],
                        ["cold_cpu_bound_MBps", "cold epoch, all cores busy MB/s", ",.0f"], ["cold_MBps", "cold epoch MB/s", ",.0f"],
                        ["ceiling_cpu_bound_MBps", "ceiling, all cores busy MB/s", ",.0f"], ["ceiling_MBps", "ceiling MB/s", ",.0f"]],
            "rows": [r for r in labelled if "cold_cpu_client" in r],
            "notes": common + "; CPU seconds per GB delivered, the client (this process, every thread) and the server "
                              "process apart; the ratios to boto3 are medians of each run's own ratio; 'cold cache, "
                              "Loader's later pass' empties the cache by hand and runs the same Loader again (its batch "
                              "blocks allocated: a new Loader's first pass also pays the kernel's zeroing of them, a cost "
                              "per Loader); 'all cores busy' is the rate at which that work would keep every core of "
                              "the machine busy (cores / CPU per byte): the server shares the cores with the client",
        },
        "cpu_split": {
            "title": "server, shards",
            "columns": [["boto3_cpu_client", "boto3 GETs into memory s/GB", ".2f"],
                        ["cold_cpu_download", "cold epoch: download threads s/GB", ".2f"],
                        ["cold_cpu_loader", "loader threads", ".2f"], ["cold_cpu_other", "other", ".2f"],
                        ["cold_cpu_client", "all", ".2f"],
                        ["recold_cpu_download", "Loader's later pass, cold cache: download threads s/GB", ".2f"],
                        ["recold_cpu_loader", "loader threads", ".2f"], ["recold_cpu_other", "other", ".2f"],
                        ["recold_cpu_client", "all", ".2f"],
                        ["recycled", "cold epoch: downloads into a recycled file / shards", ".2f"],
                        ["cold_cpu_fill", "cold epoch, download threads per GB into new files (the cache filling)", ".2f"],
                        ["cold_cpu_full", "into recycled files (the cache full)", ".2f"]],
            "rows": [r for r in labelled if "cold_cpu_download" in r],
            "notes": common + "; the client's CPU seconds per GB delivered, by thread: the node cache's download threads "
                              "(GET, hash, write into the cache file), the Loader's batch threads (the gather out of the "
                              "cached shards into the batch blocks) and the rest of the process; the first pass of a new "
                              "Loader into an empty cache also writes pages of memory this process has not touched before: "
                              "the cache's files until the cache is full (later downloads overwrite an evicted shard's "
                              "file) and the Loader's batch blocks; the last two columns split the download threads' CPU "
                              "at the first download into a recycled file (sampled every 50 ms), per GB each part downloaded",
        },
        "downloads": {
            "title": "server, shards",
            "columns": [["requests_per_shard", "GETs / shard", ".2f"], ["cold_downloaded", "cold epoch downloaded", ".2f"],
                        ["second_downloaded", "2nd epoch downloaded", ".2f"], ["second_bound", "bound", ".2f"],
                        ["sim_lru_second", "LRU (simulated)", ".2f"], ["sim_next_use_second", "next use in epoch (simulated)", ".2f"],
                        ["sim_belady_second", "Belady (simulated)", ".2f"]],
            "rows": [{k: r.get(k) for k in ("label", "requests_per_shard", "cold_downloaded", "second_downloaded", "second_bound",
                                             "sim_lru_second", "sim_next_use_second", "sim_belady_second")} for r in labelled],
            "notes": common + "; bytes downloaded as a fraction of the dataset; the simulations replay the same shard-use sequence",
        },
    }
    if not out_tables["cpu"]["rows"]:  # rows of a run from before CPU time was measured
        del out_tables["cpu"]
    if not out_tables["cpu_split"]["rows"]:  # rows of a run from before the split by thread
        del out_tables["cpu_split"]
    return out_tables


def _kept(out: list[dict]) -> list[dict]:
    """The rows of benchmarks/results/remote.json that ``out`` does not measure again (a rerun of one server keeps the others)."""
    path = os.path.join(RESULTS, "remote.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    rows = old if isinstance(old, list) else old.get("tables", {}).get("speed", {}).get("rows", [])
    labels = {o["label"] for o in out}
    rows = [{**r, "label": r.get("name", r["label"])} for r in rows]
    return [r for r in rows if r["label"] not in labels]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("CHUTE_BENCH_DATA", os.path.join(tempfile.gettempdir(), "chute-bench")))
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--shards-mb", default="8,64")
    parser.add_argument("--servers", default="http,s3")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--from-json", metavar="PATH", help="no run: redraw the rows of an earlier run's list-form JSON as tables")
    args = parser.parse_args()
    if args.from_json:
        rows, stamp = earlier_rows(args.from_json)
        save("remote", tables(rows), run=stamp, merge=False)
        return
    os.makedirs(args.data, exist_ok=True)
    out = []
    work = tempfile.mkdtemp(prefix="chute-remote-bench-")
    try:
        for server in args.servers.split(","):
            for shard_mb in (int(s) for s in args.shards_mb.split(",")):
                row = bench(server, shard_mb, args, work)
                out.append(row)
                print(f"{row['label']}: {row['dataset_MB']} MB in {row['shards']} shards, medians of {row['runs']}")
                print(f"  ceiling {row['ceiling_MBps']:,.0f} MB/s ({', '.join(f'{k[8:-5]} {v:,.0f}' for k, v in row.items() if k.startswith('ceiling_') and k.endswith('_MBps') and 'cpu' not in k and k != 'ceiling_MBps')})"
                      f"; chute's downloads alone {row['chute_download_MBps']:,.0f} MB/s")
                print(f"  cold epoch, cache {FRACTION:.0%} (window {row['window']:.0f}): {row['cold_MBps']:,.0f} MB/s = {row['ratio']:.2f}x the ceiling; "
                      f"first batch {row['ttfb_ms']:.0f} ms (open {row['open_ms']:.0f} ms); {row['requests_per_shard']:.2f} GETs per shard; "
                      f"downloaded {row['cold_downloaded']:.2f}x")
                print(f"  second epoch: downloaded {row['second_downloaded']:.2f}x the dataset (bound {row['second_bound']}); "
                      f"simulated LRU {row['sim_lru_second']:.2f}x, next use {row['sim_next_use_second']:.2f}x, Belady {row['sim_belady_second']:.2f}x")
                print(f"  CPU s/GB, client + server: ceiling {row['ceiling_cpu_client']:.2f} + {row['ceiling_cpu_server']:.2f}, "
                      f"chute's downloads alone {row['download_cpu_client']:.2f} + {row['download_cpu_server']:.2f}, "
                      f"cold epoch {row['cold_cpu_client']:.2f} + {row['cold_cpu_server']:.2f} "
                      f"(all {row['cpus']} cores busy at {row['cold_cpu_bound_MBps']:,.0f} MB/s); "
                      f"cold cache, the Loader's later pass {row['recold_cpu_client']:.2f}")
                print(f"  client CPU s/GB by thread (download / loader / other): cold epoch {row['cold_cpu_download']:.2f} / "
                      f"{row['cold_cpu_loader']:.2f} / {row['cold_cpu_other']:.2f}, the Loader's later pass "
                      f"{row['recold_cpu_download']:.2f} / {row['recold_cpu_loader']:.2f} / {row['recold_cpu_other']:.2f}; "
                      f"{row['recycled']:.2f} of the downloads into a recycled file")
                if "cold_cpu_fill" in row:
                    print(f"  cold epoch, download threads' CPU s/GB: into new files (the cache filling) {row['cold_cpu_fill']:.2f}, "
                          f"into recycled files {row['cold_cpu_full']:.2f}")
                if "boto3_cpu_client" in row:
                    print(f"  client CPU per GB against boto3's GETs into memory ({row['boto3_cpu_client']:.2f}): cold epoch "
                          f"{row['cold_cpu_vs_boto3']:.2f}x, cold cache with the Loader's blocks allocated {row['recold_cpu_vs_boto3']:.2f}x")
                sys.stdout.flush()
                save("remote", tables(out, _kept(out)), merge=False)  # after each row: a run cut short keeps what it measured
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
