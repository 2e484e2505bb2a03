"""Whole-loader throughput: chute.Loader vs torch's DataLoader vs the in-RAM gather limit.

Shuffled epochs, data in the page cache. Every configuration runs in a fresh
subprocess (so peak RSS and CPU time are its own), --repeats times; the table
shows medians and ratios measured in the same run.

  W1  MISSION.md section 1: 20,000 pickled dicts, batch 64 (chute: converted; torch: the .pkl.gz files)
  W2  200,000 uint8[3,32,32] + int64 labels, batch 256
  W3  2,000 float32 records of 1 MiB, batch 8
  W4  20,000 JPEGs of 256x256, Pillow decode + random crop to 224 (benchmarks/_w4.py), batch 256

    python benchmarks/loader.py --data-dir bench-data
    python benchmarks/loader.py --only w2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIGS = {
    "w2": ["limit", "chute", "chute-1thread", "torch-0", "torch-2"],
    "w3": ["limit", "chute", "chute-1thread", "torch-0", "torch-2"],
    "w1": ["chute", "torch-0", "torch-2"],
}
CONFIGS["w4"] = ["limit-1", "limit-2proc", "torch-2", "chute-2", "chute-auto", "chute-proc2"]
BATCH = {"w1": 64, "w2": 256, "w3": 8, "w4": 256}
# issue 6: W2 with the autotuner (num_threads=None) against hand-picked thread counts, same run
CONFIGS["w2tune"] = ["chute-auto", "chute-t1", "chute-t2", "chute-t4"]
BATCH["w2tune"] = 256


def _first(batch):
    return batch


def measure(workload: str, config: str, data_dir: str, epochs: int) -> dict:
    """Run one configuration in this process; return its figures."""
    import numpy as np
    import torch

    import chute
    from _data import MemmapDataset, array_dataset, pickle_dataset

    if workload == "w4":
        from _w4 import measure as measure_w4

        return measure_w4(config, data_dir, epochs)
    if workload == "w2tune":
        return measure_tune(config, data_dir, epochs)
    batch = BATCH[workload]
    if workload == "w1":
        ds, index = pickle_dataset(data_dir)
        row_bytes = ds.nbytes / len(ds)
    else:
        ds, raw = array_dataset(workload, data_dir)
        row_bytes = ds.nbytes / len(ds)
    rss_per_epoch = []
    cpu0, start = os.times(), time.perf_counter()
    first_batch = None
    samples = 0
    if config == "limit":  # numpy fancy indexing of the same data held in RAM
        data = np.array(np.load(raw, mmap_mode="r"))
        labels = np.arange(len(data))
        start = time.perf_counter()
        cpu0 = os.times()
        for epoch in range(epochs):
            order = np.random.default_rng(epoch).permutation(len(data))
            for a in range(0, len(order), batch):
                idx = order[a : a + batch]
                data[idx], labels[idx]
                samples += len(idx)
                first_batch = first_batch or time.perf_counter() - start
            rss_per_epoch.append(_rss_mb())
    elif config.startswith("chute"):
        start = time.perf_counter()
        loader = chute.Loader(ds.root, batch, shuffle=True, seed=0, workers=1 if config.endswith("1thread") else None)
        for epoch in range(epochs):
            for b in loader:
                samples += len(b["label"] if "label" in b else b["x"] if "x" in b else b["data"])
                first_batch = first_batch or time.perf_counter() - start
            rss_per_epoch.append(_rss_mb())
        loader.close()
    else:
        workers = int(config.split("-")[1])
        if workload == "w1":
            from chute.demo import PickleFilesDataset

            dataset = PickleFilesDataset(index)
            kwargs = dict(collate_fn=_first)
        else:
            dataset = MemmapDataset(raw, label=workload == "w2")
            kwargs = {}
        start = time.perf_counter()
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, **kwargs)
        limit = 5_000 if workload == "w1" else None  # the pickle files are slow: a sample of the epoch
        for epoch in range(epochs):
            for b in loader:
                samples += len(b[0]) if isinstance(b, list) and isinstance(b[0], torch.Tensor) else len(b)
                first_batch = first_batch or time.perf_counter() - start
                if limit and samples >= limit * (epoch + 1):
                    break
            rss_per_epoch.append(_rss_mb())
    elapsed = time.perf_counter() - start
    cpu1 = os.times()
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system) - (
        cpu0.user + cpu0.system + cpu0.children_user + cpu0.children_system
    )
    return {
        "samples_per_s": samples / elapsed,
        "mb_per_s": samples * row_bytes / elapsed / 1e6,
        "first_batch_s": first_batch,
        "peak_rss_mb": _rss_mb(children=True),
        "rss_per_epoch_mb": rss_per_epoch,
        "cpu_s_per_1000": 1000 * cpu / samples,
    }


def measure_tune(config: str, data_dir: str, epochs: int) -> dict:
    """W2 through chute.Loader with the autotuner ("chute-auto") or ``num_threads`` N ("chute-tN")."""
    import chute
    from _data import array_dataset

    ds, _ = array_dataset("w2", data_dir)
    threads = None if config == "chute-auto" else int(config.removeprefix("chute-t"))
    start = time.perf_counter()
    loader = chute.Loader(ds.root, BATCH["w2tune"], shuffle=True, seed=0, workers=threads)
    samples = 0
    for _ in range(epochs):
        for b in loader:
            samples += len(b["label"])
    elapsed = time.perf_counter() - start
    settings = loader.report().settings
    return {
        "samples_per_s": samples / elapsed, "threads": settings["num_threads"], "prefetch": settings["prefetch"],
        "rss_per_epoch_mb": [],
    }


def print_tune(results: dict, repeats: int) -> None:
    """The autotuner's throughput against the best hand-picked thread count (goal: >= 0.9x)."""
    rate = {c: r["samples_per_s"] for c, r in results.items()}
    best = max((c for c in rate if c != "chute-auto"), key=rate.get)
    print(f"\nW2 autotuner vs hand-picked num_threads (batch {BATCH['w2tune']}, median of {repeats}, round-robin)")
    print(f"  {'config':12s} {'samples/s':>11s} {'/best hand-picked':>18s} {'threads':>8s} {'prefetch':>9s}  runs")
    for c, r in results.items():
        print(
            f"  {c:12s} {rate[c]:11,.0f} {rate[c] / rate[best]:18.2f} {r['threads']:8.1f} {r['prefetch']:9.1f}  "
            f"{', '.join(f'{x:,.0f}' for x in r.get('runs', []))}"
        )
    print(f"  autotuner / best hand-picked ({best}): {rate['chute-auto'] / rate[best]:.2f} (goal >= 0.9)")


def _rss_mb(children: bool = False) -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        rss += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return rss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (chute: RSS is reported after each)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.data_dir, args.epochs)))
        return
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, median of {args.repeats} runs of {args.epochs} epoch(s)")
    for workload in args.only or ["w2", "w2tune", "w3", "w1", "w4"]:
        runs: dict[str, list[dict]] = {config: [] for config in CONFIGS[workload]}
        for _ in range(args.repeats):  # round-robin: load that drifts during the run hits every config alike
            for config in CONFIGS[workload]:
                out = subprocess.run(
                    [sys.executable, __file__, "--data-dir", args.data_dir, "--epochs", str(args.epochs), "--one", workload, config],
                    capture_output=True, text=True, check=True,
                )
                runs[config].append(json.loads(out.stdout.strip().splitlines()[-1]))
        results = {}
        for config, done in runs.items():
            results[config] = {k: statistics.median(r[k] for r in done) for k in done[0] if k != "rss_per_epoch_mb"}
            results[config]["rss_per_epoch_mb"] = done[-1]["rss_per_epoch_mb"]
            results[config]["runs"] = [r["samples_per_s"] for r in done]
        if workload == "w4":
            from _w4 import print_table

            print_table(results, args.repeats)
            continue
        if workload == "w2tune":
            print_tune(results, args.repeats)
            continue
        best_torch = max(v["samples_per_s"] for k, v in results.items() if k.startswith("torch"))
        limit = results.get("limit", {}).get("samples_per_s")
        print(f"\n{workload.upper()} (batch {BATCH[workload]})")
        print(f"  {'config':16s} {'samples/s':>11s} {'MB/s':>8s} {'/limit':>7s} {'/best torch':>11s} {'1st batch':>10s} {'peak RSS':>9s} {'CPU s/1k':>9s}  RSS per epoch (MB)")
        for config, r in results.items():
            ratio = f"{r['samples_per_s'] / limit:7.2f}" if limit else f"{'-':>7s}"
            print(
                f"  {config:16s} {r['samples_per_s']:11,.0f} {r['mb_per_s']:8,.0f} {ratio} {r['samples_per_s'] / best_torch:11.1f} "
                f"{r['first_batch_s']:9.3f}s {r['peak_rss_mb']:8,.0f}M {r['cpu_s_per_1000']:9.3f}  {[round(x) for x in r['rss_per_epoch_mb']]}"
            )


if __name__ == "__main__":
    main()
