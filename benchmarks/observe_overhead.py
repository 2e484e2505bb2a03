"""What the always-on counters cost: W2 through the Loader with counters on vs off.

W2 (200,000 uint8[3,32,32] + int64 labels, batch 256) is the workload where the
per-batch overhead shows most: thousands of batches/s on one thread, no
transform. Two loaders, ``workers=chute.Workers(count=1, prefetch=2)`` (autotuner off in both,
so only the counters differ), one with counters on and one with
``chute.Loader(..., _counters=False)`` (no clock reads, no counters, no
trace), run shuffled epochs in turn in one process (which goes first
alternates), after one warm-up epoch each. The VM this runs on is shared and
noisy, so the figures are the best epoch of each (the least disturbed) and the
median of the per-pair ratios.

Also measured: the cost of one ``Stage.record`` (what a stage does per batch),
and adds from 1 vs 2 threads at once (per-thread cells: no lock, no contention).

    python benchmarks/observe_overhead.py --data-dir bench-data --pairs 15

Results go to benchmarks/results/observe_overhead.json through benchmarks/_results.py: tables "epochs" (the
loader with counters on and off) and "direct" (the counters' own work, measured alone).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import save  # noqa: E402


def epoch(loader) -> tuple[float, float]:
    """One pass: (samples/s, CPU us per batch of this process)."""
    samples = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in loader:
        samples += len(batch["label"])
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return samples / elapsed, 1e6 * cpu / (samples / 256)


class _Rows:
    """The rows of every step of a pass of W2 (a stand-in for the pass's ``BatchIndices``: the same rows at every
    step of one endless chunk)."""

    def __init__(self, rows: int) -> None:
        import numpy as np

        self.chunks, self.per_chunk, self.full = [self], 1 << 40, 1 << 40
        self._rows = np.arange(rows)

    def __getitem__(self, step: int) -> Any:
        return self._rows

    def ahead(self, step: int) -> None:
        pass


class _Gather:
    """The W2 chain's one stage (the gather), handing on a batch already made."""

    name, gil, gathers, row_bytes, _builtin = "read", False, True, 3080, True

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def map(self, batch: Any, ctx: Any) -> dict:
        return self.batch


def task_cost_ns(batch: dict, counters: Any, repeats: int, n: int) -> float:
    """The fused task's own counting per batch (``chute/pipeline/task.py``, run as it is): ns per call of a task
    with counters minus one without, each the best of ``repeats`` loops of ``n`` steps."""
    from chute.pipeline.task import Task

    best = {}
    for on in (True, False):
        task = Task(_Rows(256), [_Gather(batch)], 0, 0, None, counters=counters if on else None)  # type: ignore[arg-type]
        w = task.register(threading.get_ident())
        clock = time.perf_counter_ns
        best[on] = float("inf")
        for _ in range(repeats):
            t0 = clock()
            for step in range(2, n + 2):  # (step 1 is where the root would compute the next chunk)
                task(step, t0, w)
            best[on] = min(best[on], (clock() - t0) / n)
    return best[True] - best[False]


def per_batch_cost_ns(batch: dict, repeats: int = 7, n: int = 20_000) -> float:
    """The counters' added work for one batch (best of ``repeats``): the fused task's, run as it is, and the
    worker's and the loop's, replayed in a tight loop with the real objects.

    Per batch a Loader with counters adds each stage's span of its fused task
    to its cell and appends one trace record there (``chute/pipeline/task.py``:
    :func:`task_cost_ns` runs the task with and without counters); the worker
    reads the clock at a task's start and updates its cell
    (``threads.py``), and the loop reads the clock twice (when the batch arrives
    and when the loop asks for the next), updates the consumer's totals and
    appends one trace record (``run.py``). Here the W2 chain: the root and one
    stage, the gather.
    """
    from chute.observe.counters import Counters

    counters = Counters()
    task = task_cost_ns(batch, counters, repeats, n)
    clock = time.perf_counter_ns
    worker = counters.stage("workers").cell()
    trace = counters.trace.append
    consumer = counters.consumer
    rows = 256
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        idle = t0
        called = t0
        for step in range(n):
            start = clock()
            end = clock()  # (the task's last mark)
            worker.wait_out_ns += start - idle
            worker.busy_ns += end - start
            worker.items += 1
            idle = end
            got = clock()
            consumer.wait_ns += got - called
            consumer.batches += 1
            consumer.samples += rows
            done = clock()
            consumer.compute_ns += done - got
            trace(("loop", 2, called, got, done, step))
            called = done
        best = min(best, (clock() - t0) / n)
    return task + best


def micro() -> dict:
    """ns per StageCounter.record, and per add with 1 and 2 threads adding at once."""
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
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    import torch
    from _data import array_dataset

    import chute

    ds, _ = array_dataset("w2", args.data_dir)
    loaders = {
        mode: chute.Loader(ds.root, 256, shuffle=True, seed=0, workers=chute.Workers(count=1, prefetch=2), _counters=mode == "on")
        for mode in ("on", "off")
    }
    for loader in loaders.values():
        epoch(loader)  # warm-up: buffers, page cache, first-use imports
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.pairs} pairs of epochs, alternating which goes first")
    rate: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(args.pairs):
        for mode in (("on", "off") if i % 2 == 0 else ("off", "on")):
            r, c = epoch(loaders[mode])
            rate[mode].append(r)
            cpu[mode].append(c)
    best_on, best_off = max(rate["on"]), max(rate["off"])
    pairs = sorted(a / b for a, b in zip(rate["on"], rate["off"]))
    print("\nW2, batch 256, 1 thread, prefetch 2")
    for mode in ("off", "on"):
        print(f"  counters {mode:3s}: best {max(rate[mode]):11,.0f} samples/s, median {statistics.median(rate[mode]):11,.0f}, "
              f"CPU per batch best {min(cpu[mode]):.0f} us")
    print(f"  on / off, best epochs: {best_on / best_off:.3f} (overhead {100 * (1 - best_on / best_off):+.1f}%; goal: under 2%)")
    print(f"  on / off, median of per-pair ratios: {statistics.median(pairs):.3f} (quartiles {pairs[len(pairs) // 4]:.3f}-{pairs[3 * len(pairs) // 4]:.3f})")
    print(f"  CPU per batch, best: {min(cpu['on']) - min(cpu['off']):+.1f} us with counters")
    m = micro()
    sample = next(iter(loaders["off"]))
    cost = per_batch_cost_ns(sample)
    batch_us = 1e6 / (best_off / 256)
    print(f"\n  the counters' work per batch, replayed alone: {cost / 1000:.2f} us = {100 * cost / 1000 / batch_us:.2f}% "
          f"of a W2 batch ({batch_us:.0f} us, best epoch with counters off)")
    print(f"\n  Stage.record: {m['record_ns']:.0f} ns per call; Stage.add: {m['add_ns_1_threads']:.0f} ns per call "
          f"from 1 thread, {m['add_ns_2_threads']:.0f} ns from 2 threads at once")
    print(f"  (a W2 batch takes {1e6 / (best_off / 256):.0f} us in the best epoch with counters off)")
    quartiles = {"ratio_q1": pairs[len(pairs) // 4], "ratio_q3": pairs[3 * len(pairs) // 4]}
    epochs = [
        {"label": "counters off (`_counters=False`)", "best_per_s": best_off, "median_per_s": statistics.median(rate["off"]),
         "cpu_us_best": min(cpu["off"]), "rates": rate["off"], "cpu_us": cpu["off"]},
        {"label": "counters on (the default)", "best_per_s": best_on, "median_per_s": statistics.median(rate["on"]),
         "cpu_us_best": min(cpu["on"]), "ratio_best": best_on / best_off, "ratio_pairs": statistics.median(pairs), **quartiles,
         "rates": rate["on"], "cpu_us": cpu["on"]},
    ]
    direct = [
        {"label": "the counters' work per batch, replayed alone with the real functions", "ns": cost,
         "pct_batch": 100 * cost / 1000 / batch_us},
        {"label": "`Stage.record`, one call", "ns": m["record_ns"]},
        {"label": "`Stage.add`, one call from 1 thread", "ns": m["add_ns_1_threads"]},
        {"label": "`Stage.add`, one call from each of 2 threads adding at once", "ns": m["add_ns_2_threads"]},
    ]
    save("observe_overhead", {
        "epochs": {
            "title": "W2, batch 256, 1 thread, prefetch 2",
            "columns": [["best_per_s", "best epoch, samples/s", ",.0f"], ["median_per_s", "median epoch, samples/s", ",.0f"],
                        ["cpu_us_best", "CPU us per batch, best epoch", ",.0f"], ["ratio_best", "on / off, best epochs", ".3f"],
                        ["ratio_pairs", "on / off, median of per-pair ratios", ".3f"], ["ratio_q1", "lower quartile", ".3f"],
                        ["ratio_q3", "upper quartile", ".3f"]],
            "rows": epochs,
            "notes": (f"{args.pairs} pairs of shuffled epochs in one process, which loader goes first alternating, after a "
                      "warm-up epoch each; autotuner off in both, so only the counters differ"),
        },
        "direct": {
            "title": "the counters alone",
            "columns": [["ns", "ns", ",.0f"], ["pct_batch", "% of a W2 batch (best epoch, counters off)", ".2f"]],
            "rows": direct,
            "notes": "best of repeated loops in one thread (Stage.add from 2 threads: both threads adding at once, per-thread cells)",
        },
    })


if __name__ == "__main__":
    main()
