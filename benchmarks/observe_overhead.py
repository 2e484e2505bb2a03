"""What the always-on counters cost: W2 through the Loader with counters on vs off.

W2 (200,000 uint8[3,32,32] + int64 labels, batch 256) is the workload where the
per-batch overhead shows most: ~2,000 batches/s on one thread, no transform.
Each run is a fresh subprocess doing 2 shuffled epochs with ``num_threads=1,
prefetch=2`` (autotuner off in both, so only the counters differ); on and off
runs alternate, --repeats of each, and the medians are compared. Off is
``chute.Loader(..., _counters=False)``: no clock reads, no counters, no trace.

Also measured in this process: the cost of one ``Stage.record`` (the call each
stage makes per batch), and adds from 1 vs 2 threads at once (per-thread cells:
no lock, so no contention).

    python benchmarks/observe_overhead.py --data-dir bench-data --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def run_once(data_dir: str, counters: bool, epochs: int) -> dict:
    import chute
    from _data import array_dataset

    ds, _ = array_dataset("w2", data_dir)
    loader = chute.Loader(ds.root, 256, shuffle=True, seed=0, num_threads=1, prefetch=2, _counters=counters)
    samples = 0
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(epochs):
        for batch in loader:
            samples += len(batch["label"])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"samples_per_s": samples / elapsed, "cpu_us_per_batch": 1e6 * cpu / (samples / 256)}


def micro() -> dict:
    """ns per Stage.record, and per add with 1 and 2 threads adding at once."""
    from chute.observe.counters import Counters

    counters = Counters()
    stage = counters.stage("read")
    n = 200_000
    clock = time.perf_counter_ns
    t0 = clock()
    for i in range(n):
        stage.record(i, i + 10, 256, 1000, i)
    record_ns = (clock() - t0) / n

    def adds(count: int) -> None:
        for _ in range(count):
            stage.add(1e-6, 1, 10)

    out = {"record_ns": record_ns}
    for threads in (1, 2):
        workers = [threading.Thread(target=adds, args=(n,)) for _ in range(threads)]
        t0 = clock()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        out[f"add_ns_{threads}_threads"] = (clock() - t0) / (n * threads)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.one:
        print(json.dumps(run_once(args.data_dir, args.one == "on", args.epochs)))
        return
    import torch

    from _data import array_dataset

    array_dataset("w2", args.data_dir)  # generate once, outside the timed runs
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.repeats} alternating runs of {args.epochs} epoch(s) each")
    runs: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.repeats):
        for mode in ("on", "off"):
            out = subprocess.run(
                [sys.executable, __file__, "--data-dir", args.data_dir, "--epochs", str(args.epochs), "--one", mode],
                capture_output=True, text=True, check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            runs[mode].append(result["samples_per_s"])
            cpu[mode].append(result["cpu_us_per_batch"])
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    print("\nW2, batch 256, 1 thread, prefetch 2")
    print(f"  counters off: {off:11,.0f} samples/s  (runs: {', '.join(f'{x:,.0f}' for x in runs['off'])})")
    print(f"  counters on:  {on:11,.0f} samples/s  (runs: {', '.join(f'{x:,.0f}' for x in runs['on'])})")
    print(f"  on / off: {on / off:.3f}  (overhead {100 * (1 - on / off):+.1f}%; goal: under 2%)")
    pairs = [a / b for a, b in zip(runs["on"], runs["off"])]
    print(f"  per-pair ratios: {', '.join(f'{r:.3f}' for r in pairs)}; median {statistics.median(pairs):.3f}")
    cpu_on, cpu_off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(f"  CPU per batch (all threads): off {cpu_off:.0f} us, on {cpu_on:.0f} us: {cpu_on - cpu_off:+.1f} us ({100 * (cpu_on / cpu_off - 1):+.1f}%)")
    m = micro()
    print(f"\n  Stage.record: {m['record_ns']:.0f} ns per call; Stage.add: {m['add_ns_1_threads']:.0f} ns per call "
          f"from 1 thread, {m['add_ns_2_threads']:.0f} ns from 2 threads at once")
    per_batch_us = 1e6 / (off / 256)
    print(f"  (a W2 batch takes {per_batch_us:.0f} us with counters off)")


if __name__ == "__main__":
    main()
