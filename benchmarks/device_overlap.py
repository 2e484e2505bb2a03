"""Does chute.device hide the host-to-device copy behind compute?

    python benchmarks/device_overlap.py [--batch-mb 64] [--compute-ms 8] [--steps 60] [--runs 5]

On CUDA, a loop does a fixed amount of GPU work per step (matmuls calibrated
to --compute-ms) on batches from a host iterable of unpinned tensors, three
ways:

  sync    ``batch.to(device)`` in the loop: copy, then compute
  naive   the write-up's PreDataLoader: a thread and a queue, ``non_blocking``
          copies of *unpinned* memory on a side stream, no events
  chute   ``chute.device.to_device``: pinned staging ring, side stream, events

Step times come from CUDA events (median of --runs); copy and compute alone
are timed the same way. "copy hidden" is the share of the synchronous copy
time that no longer shows in the step: (compute + copy - step) / copy.

On any machine (and the only part without CUDA) it also measures what the
thread and channel cost per batch on CPU (device="cpu": no copies), and how
much of a slow source they hide behind a slow consumer.

Results go to benchmarks/results/device_overlap.json through benchmarks/_results.py: tables "cpu-overhead",
"cpu-overlap" and, on CUDA, "cuda" (a run without CUDA keeps an earlier run's "cuda" table); docs/benchmarks.md
draws them with benchmarks/tables.py.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from chute.device import to_device

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import save  # noqa: E402


def median_of(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


# --------------------------------------------------------------------------
# CPU: thread and channel overhead
# --------------------------------------------------------------------------


def cpu_overhead(n: int, runs: int) -> dict:
    batches = [{"x": torch.zeros(8), "y": torch.zeros(8, dtype=torch.int64), "id": i} for i in range(n)]

    def loop(iterable: Iterable) -> float:
        start = time.perf_counter()
        for _ in iterable:
            pass
        return time.perf_counter() - start

    raw = median_of(runs, lambda: loop(batches))
    print(f"CPU: thread + channel overhead ({n:,} small batches, no work per step, median of {runs})")
    print(f"  raw iterable                      {n / raw:>12,.0f} batches/s")
    rows = [{"label": "the list of batches itself", "per_s": n / raw}]
    for device in (None, "cpu"):
        wrapped = median_of(runs, lambda: loop(to_device(batches, device, depth=2)))
        per_batch = (wrapped - raw) / n * 1e6
        print(
            f"  to_device(device={device!s:<4}, depth=2)  {n / wrapped:>12,.0f} batches/s"
            f"   overhead {per_batch:5.1f} us/batch"
        )
        rows.append({"label": f"`to_device(..., {device!r}, depth=2)`", "per_s": n / wrapped, "overhead_us": per_batch})
    return {
        "title": "CPU, thread and channel",
        "columns": [["per_s", "batches/s", ",.0f"], ["overhead_us", "overhead us per batch", ".1f"]],
        "rows": rows,
        "notes": f"{n:,} small batches (two 8-element tensors), no work per step, median of {runs}",
    }


def cpu_overlap(steps: int, source_ms: float, step_ms: float, runs: int) -> dict:
    """A source that waits (I/O-like) and a consumer that works, both releasing the GIL."""

    def source() -> Iterator[int]:
        for i in range(steps):
            time.sleep(source_ms / 1e3)
            yield i

    def loop(iterable: Iterable) -> float:
        start = time.perf_counter()
        for _ in iterable:
            time.sleep(step_ms / 1e3)
        return (time.perf_counter() - start) / steps * 1e3

    alone = median_of(runs, lambda: loop(range(steps)))
    raw = median_of(runs, lambda: loop(source()))
    wrapped = median_of(runs, lambda: loop(to_device(source(), "cpu", depth=2)))
    hidden = min(max((raw - wrapped) / (raw - alone), 0.0), 1.0) * 100
    print(f"CPU: slow source ({source_ms:g} ms/batch) behind a slow step ({step_ms:g} ms), median of {runs}")
    print(f"  step alone          {alone:6.2f} ms/step")
    print(f"  raw iterable        {raw:6.2f} ms/step")
    print(f"  to_device('cpu')    {wrapped:6.2f} ms/step   source time hidden {hidden:5.1f} %")
    return {
        "title": f"CPU, a {source_ms:g} ms source behind a {step_ms:g} ms step",
        "columns": [["ms", "ms per step", ".2f"], ["hidden", "source time hidden %", ".1f"]],
        "rows": [{"label": "the step alone", "ms": alone}, {"label": "the source in the loop", "ms": raw},
                 {"label": "`to_device(source, 'cpu', depth=2)`", "ms": wrapped, "hidden": hidden}],
        "notes": f"{steps} steps, both sleeping (I/O-like, the GIL released), median of {runs}",
    }


# --------------------------------------------------------------------------
# CUDA: copy/compute overlap
# --------------------------------------------------------------------------


class NaivePreDataLoader:
    """The write-up's version, kept faithful for comparison (do not use it).

    Unpinned memory (so ``non_blocking`` does not overlap), no event between the
    side stream and the consumer, no ``record_stream``, no shutdown.
    """

    def __init__(self, iterable: Iterable, device: torch.device, depth: int = 2) -> None:
        self.iterable, self.device, self.depth = iterable, device, depth

    def __iter__(self) -> Iterator:
        q: queue.Queue = queue.Queue(self.depth)
        stream = torch.cuda.Stream(self.device)
        done = object()

        def work() -> None:
            with torch.cuda.stream(stream):
                for batch in self.iterable:
                    q.put({k: v.to(self.device, non_blocking=True) for k, v in batch.items()})
            q.put(done)

        threading.Thread(target=work, daemon=True).start()
        while (item := q.get()) is not done:
            yield item


def cuda_overlap(device: torch.device, batch_mb: int, compute_ms: float, steps: int, runs: int) -> dict:
    torch.cuda.set_device(device)
    numel = batch_mb * 2**20 // 4
    host = [torch.randn(numel) for _ in range(3)]  # unpinned, as most loaders produce
    weight = torch.randn(2048, 2048, device=device)

    class Source:
        """Re-iterable, so each loader below is built once and warmed up once."""

        def __iter__(self) -> Iterator[dict]:
            for i in range(steps):
                yield {"x": host[i % len(host)]}

    def timed(fn: Callable[[], None]) -> float:
        """Milliseconds between events on the current stream around fn, after a full sync."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    one_matmul = median_of(5, lambda: timed(lambda: weight @ weight))
    repeats = max(1, round(compute_ms / one_matmul))

    def compute(x: torch.Tensor) -> torch.Tensor:
        y = weight
        for _ in range(repeats):
            y = weight @ y
        return y[0, 0] + x[0]  # depends on the batch, so it must wait for it

    t_compute = median_of(runs, lambda: timed(lambda: compute(torch.zeros(1, device=device))))
    t_copy = median_of(runs, lambda: timed(lambda: host[0].to(device)))
    pinned = host[0].pin_memory()
    t_copy_pinned = median_of(runs, lambda: timed(lambda: pinned.to(device, non_blocking=True)))

    def step_ms(loader: Iterable[dict]) -> float:
        def run() -> None:
            for batch in loader:
                compute(batch["x"])

        run()  # warm-up: caching allocator, pinned ring, streams
        return median_of(runs, lambda: timed(run)) / steps

    class Sync:
        def __iter__(self) -> Iterator[dict]:
            return ({"x": batch["x"].to(device)} for batch in Source())

    results = {
        "sync": step_ms(Sync()),
        "naive": step_ms(NaivePreDataLoader(Source(), device)),
        "chute": step_ms(to_device(Source(), device, depth=2)),
    }

    gb = numel * 4 / 1e9
    print(f"CUDA ({torch.cuda.get_device_name(device)}): {batch_mb} MB batches, {steps} steps, median of {runs}")
    print(f"  compute alone      {t_compute:7.2f} ms/step ({repeats} matmuls)")
    print(f"  copy alone         {t_copy:7.2f} ms pageable ({gb / t_copy * 1e3:5.1f} GB/s), "
          f"{t_copy_pinned:.2f} ms pinned ({gb / t_copy_pinned * 1e3:5.1f} GB/s)")
    rows = [{"label": "compute alone", "ms": t_compute},
            {"label": "copy alone, pageable", "ms": t_copy, "gb_per_s": gb / t_copy * 1e3},
            {"label": "copy alone, pinned", "ms": t_copy_pinned, "gb_per_s": gb / t_copy_pinned * 1e3}]
    labels = {"sync": "`batch.to(device)` in the loop", "naive": "the write-up's thread + queue (no stream sync: a speed bound)",
              "chute": "`chute.device.to_device`"}
    for name, t_step in results.items():
        hidden = min(max((t_compute + t_copy - t_step) / t_copy, 0.0), 1.0) * 100
        print(
            f"  {name:<6} {t_step:7.2f} ms/step   copy hidden {hidden:5.1f} %   "
            f"vs sync x{results['sync'] / t_step:.2f}"
        )
        rows.append({"label": labels[name], "ms": t_step, "hidden": hidden, "vs_sync": results["sync"] / t_step})
    print("  (naive has no stream sync: its numbers are a speed bound, its values may be wrong)")
    return {
        "title": f"CUDA ({torch.cuda.get_device_name(device)}), {batch_mb} MB batches",
        "columns": [["ms", "ms per step", ".2f"], ["gb_per_s", "GB/s", ".1f"], ["hidden", "copy hidden %", ".1f"],
                    ["vs_sync", "x sync", ".2f"]],
        "rows": rows,
        "notes": (f"{steps} steps of {repeats} matmuls each (about {compute_ms:g} ms), unpinned host batches; CUDA events, "
                  f"median of {runs}"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-mb", type=int, default=64)
    parser.add_argument("--compute-ms", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cpu-batches", type=int, default=20_000)
    args = parser.parse_args()

    tables = {"cpu-overhead": cpu_overhead(args.cpu_batches, args.runs),
              "cpu-overlap": cpu_overlap(steps=100, source_ms=2.0, step_ms=2.0, runs=3)}
    if torch.cuda.is_available():
        tables["cuda"] = cuda_overlap(torch.device("cuda", torch.cuda.current_device()),
                                      args.batch_mb, args.compute_ms, args.steps, args.runs)
    else:
        print("CUDA: skipped (torch.cuda.is_available() is False); the copy/compute overlap "
              "part needs a CUDA GPU")
    save("device_overlap", tables)


if __name__ == "__main__":
    main()
