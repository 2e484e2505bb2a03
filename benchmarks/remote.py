"""Remote datasets: cold and warm epochs through the node cache, against local servers.

    python benchmarks/remote.py [--data DIR] [--runs 3] [--workloads w3,w2] [--servers http,s3]

For each workload (W3: 2,000 x 1 MiB float32; W2: 200,000 x uint8[3,32,32]) and each
server (a real HTTP server and moto's standalone S3 server, each in its own process
on 127.0.0.1), it measures:

* a plain parallel download of every shard with fsspec (8 threads): the server's limit;
* the Loader's cold epoch (empty cache): time to first batch, MB/s, bytes downloaded;
* the warm epoch (every shard cached) and the same Loader over the local copy;
* a cold and a second epoch with cache_limit = 25% of the dataset: bytes downloaded
  per epoch and the largest number of downloads of one shard in an epoch.

Medians of ``--runs`` runs. Prints ratios: cold / plain download (goal >= 0.8),
warm / local (goal within 10%).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import chute  # noqa: E402
from _data import SHAPES, array_dataset  # noqa: E402
from tests.servers import HTTPServerProcess, MotoS3Server, s3_client_env  # noqa: E402


def epoch(loader: chute.Loader) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the epoch, bytes delivered)."""
    start = time.perf_counter()
    first = None
    nbytes = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        nbytes += batch["x"].numel() * batch["x"].element_size()
    return first or 0.0, time.perf_counter() - start, nbytes


def plain_download(url: str, names: list[str], storage_options: dict, threads: int = 8) -> float:
    """Seconds to download every shard once with fsspec, ``threads`` at a time."""
    import fsspec.core

    fs, base = fsspec.core.url_to_fs(url, **storage_options)
    prefix = url.rstrip("/") if url.startswith("http") else base.rstrip("/")
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for data in pool.map(lambda n: fs.cat_file(f"{prefix}/{n}"), names):
            del data
    return time.perf_counter() - start


def run(workload: str, server: str, data_dir: str, runs: int) -> None:
    local, _ = array_dataset(workload, data_dir)
    size = local.nbytes
    batch = SHAPES[workload]["batch"]
    names = [s.file for s in local.shards]
    work = tempfile.mkdtemp(prefix="chute-remote-bench-")
    try:
        if server == "http":
            www = os.path.join(work, "www")
            os.makedirs(www)
            shutil.copytree(local.root, os.path.join(www, "ds"), copy_function=os.link)  # hard links: no copy
            proc = HTTPServerProcess(www).start()
            url, options = proc.url.rstrip("/") + "/ds", {}
        else:
            proc = MotoS3Server().start()
            os.environ.update(s3_client_env(proc.endpoint_url))
            bucket = proc.create_bucket("bench")
            url, options = bucket + "/ds", {}
            import fsspec.core

            fs, base = fsspec.core.url_to_fs(url)
            fs.put(local.root.rstrip("/") + "/", base, recursive=True)
        try:
            rows = {k: [] for k in ("plain", "ttfb", "cold", "warm", "local", "limited1", "limited2")}
            dl = {}
            for _ in range(runs):
                rows["plain"].append(size / plain_download(url, names, options) / 1e6)
                cache = os.path.join(work, "cache")
                shutil.rmtree(cache, ignore_errors=True)
                ds = chute.open(url, cache_dir=cache, storage_options=options)
                loader = chute.Loader(ds, batch, shuffle=True, seed=0, workers=2)
                first, seconds, nbytes = epoch(loader)
                rows["ttfb"].append(first * 1e3)
                rows["cold"].append(nbytes / seconds / 1e6)
                dl["cold"] = ds.cache.stats()["bytes_downloaded"]
                _, seconds, nbytes = epoch(loader)
                rows["warm"].append(nbytes / seconds / 1e6)
                dl["warm"] = ds.cache.stats()["bytes_downloaded"] - dl["cold"]
                _, seconds, nbytes = epoch(chute.Loader(local, batch, shuffle=True, seed=0, workers=2))
                rows["local"].append(nbytes / seconds / 1e6)
                ds.close()
                # a cache of 25% of the dataset
                shutil.rmtree(cache, ignore_errors=True)
                limited = chute.open(url, cache_dir=cache, cache_limit=max(size // 4, 1), storage_options=options)
                try:
                    loader = chute.Loader(limited, batch, shuffle=chute.Shuffle(window=1), seed=0, workers=2)
                except chute.CacheFullError as exc:  # too few shards for 25% to hold two windows
                    print(f"  cache 25%: {exc}")
                    rows["limited1"].append(0.0)
                    rows["limited2"].append(0.0)
                    dl["limited1"] = dl["limited2"] = 0
                    continue
                for key in ("limited1", "limited2"):
                    done = limited.cache.stats()["bytes_downloaded"]
                    _, seconds, nbytes = epoch(loader)
                    rows[key].append(nbytes / seconds / 1e6)
                    dl[key] = limited.cache.stats()["bytes_downloaded"] - done
                limited.close()
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(f"{workload} over {server}: {len(names)} shards, {size / 1e6:,.0f} MB, batch {batch}, {runs} run(s), medians")
            print(f"  plain parallel download (8 threads) {med['plain']:8,.0f} MB/s")
            print(f"  cold epoch                          {med['cold']:8,.0f} MB/s  = {med['cold'] / med['plain']:.2f}x plain download"
                  f"  first batch {med['ttfb']:.0f} ms  downloaded {dl['cold'] / size:.2f}x the dataset")
            print(f"  warm epoch                          {med['warm']:8,.0f} MB/s  = {med['warm'] / med['local']:.2f}x local disk"
                  f" ({med['local']:,.0f} MB/s)  downloaded {dl['warm'] / size:.2f}x")
            print(f"  cache 25%, window 1: ep 1           {med['limited1']:8,.0f} MB/s  downloaded {dl['limited1'] / size:.2f}x the dataset")
            print(f"                      ep 2           {med['limited2']:8,.0f} MB/s  downloaded {dl['limited2'] / size:.2f}x the dataset")
            sys.stdout.flush()
        finally:
            proc.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("CHUTE_BENCH_DATA", os.path.join(tempfile.gettempdir(), "chute-bench")))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", default="w3,w2")
    parser.add_argument("--servers", default="http,s3")
    args = parser.parse_args()
    os.makedirs(args.data, exist_ok=True)
    for workload in args.workloads.split(","):
        for server in args.servers.split(","):
            run(workload, server, args.data, args.runs)


if __name__ == "__main__":
    main()
