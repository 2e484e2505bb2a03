"""Whole-loader throughput: chute.Loader against the best way to do the same job on this machine, and torch's DataLoader.

Shuffled epochs, data in the page cache. Every configuration runs in a fresh
subprocess (so its peak RSS, CPU time and first batch are its own), --repeats
times, round-robin (load that drifts during the run hits every configuration
alike); the tables show medians and ratios between medians of the same run.
samples/s is the steady state: the epochs after the first (a process's first
epoch also maps and page-faults the files, starts its workers, and for the
limits copies the data in; "1st epoch" shows it, "1st batch" the time from
creating the loader to its first batch).

  W1  20,000 pickled dicts (ten 5-digit str keys -> str values each), batch 64: chute reads the
      converted dataset (as dicts, and as a columnar batch), torch's DataLoader the .pkl.gz files
  W2  200,000 uint8[3,32,32] + int64 labels, batch 256
  W3  2,000 float32 records of 1 MiB, batch 8
  W4  20,000 JPEGs of 256x256, Pillow decode + random crop to 224 (benchmarks/_w4.py), batch 256

The limits ("the best known way to do that job on this machine"):
  W2  numpy fancy indexing x[idx] of the whole array held in RAM, one random batch at a time
  W3  the same random 1 MiB rows read from the page cache with os.preadv into a page-aligned
      buffer reused for every batch; and, for scale, memcpy of 1 GiB in RAM (np.copyto)

    python benchmarks/loader.py --data-dir bench-data --repeats 5
    python benchmarks/loader.py --only w2 --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _torch  # noqa: E402
from _results import cpu_seconds, save  # noqa: E402

CONFIGS = {
    "w2": ["limit", "chute", "chute-t1", "chute-t2", "chute-py", *_torch.CONFIGS],
    "w3": ["limit-read", "limit-memcpy", "chute", "chute-t1", *_torch.CONFIGS],
    "w1": ["chute", "chute-columnar", *_torch.CONFIGS],
    "w4": ["limit-1", "limit-2proc", "limit-2proc-pil", "torch-2", "chute-2", "chute-auto", "chute-proc2"],
    "w2tune": ["chute-auto", "chute-t1", "chute-t2", "chute-t4"],  # the autotuner against hand-picked thread counts
}
BATCH = {"w1": 64, "w2": 256, "w3": 8, "w4": 256, "w2tune": 256}
LABELS = {
    "limit": "numpy x[idx], whole array in RAM (the limit)",
    "limit-read": "os.preadv into an aligned buffer, page cache (the limit)",
    "limit-memcpy": "memcpy of 1 GiB in RAM (for scale)",
    "chute": "chute Loader, default (autotuned threads)",
    "chute-columnar": "chute Loader, columnar=True (Arrow arrays)",
    "chute-t1": "chute Loader, workers=1",
    "chute-t2": "chute Loader, workers=2",
    "chute-py": "chute Loader, default, Python worker threads (CHUTE_NATIVE_GATHER=0)",
    **{c: _torch.label(c) for c in _torch.CONFIGS},
}


def _first(batch):
    return batch


def _count(batch) -> int:
    if isinstance(batch, dict):
        value = next(iter(batch.values()))
        return len(value)
    if isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape"):
        return len(batch[0])
    return len(batch)


def measure(workload: str, config: str, data_dir: str, epochs: int) -> dict:
    """Run one configuration in this process; return its figures."""
    if workload == "w4":
        from _w4 import measure as measure_w4

        return measure_w4(config, data_dir, epochs)
    if workload == "w2tune":
        return measure_tune(config, data_dir, epochs)
    import numpy as np
    from _data import array_dataset, pickle_dataset

    import chute

    batch = BATCH[workload]
    if workload == "w1":
        ds, index = pickle_dataset(data_dir)
    else:
        ds, raw = array_dataset(workload, data_dir)
    row_bytes = ds.nbytes / len(ds)
    settings = ""
    first_batch = None
    samples = 0
    marks: list[tuple[float, int]] = []  # (time, samples) at the end of each epoch
    cpu0 = cpu_seconds()
    if config == "limit":  # W2: numpy fancy indexing of the same data held in RAM
        data = np.array(np.load(raw, mmap_mode="r"))
        labels = np.arange(len(data))
        start = time.perf_counter()
        for epoch in range(epochs):
            order = np.random.default_rng(epoch).permutation(len(data))
            for a in range(0, len(order), batch):
                idx = order[a : a + batch]
                data[idx], labels[idx]
                samples += len(idx)
                first_batch = first_batch or time.perf_counter() - start
            marks.append((time.perf_counter(), samples))
    elif config == "limit-read":  # W3: random rows read from the page cache into one aligned buffer
        array = np.load(raw, mmap_mode="r")
        header, rows, row = array.offset, len(array), array[0].nbytes
        buffer = mmap.mmap(-1, batch * row)  # page-aligned, reused for every batch
        views = [memoryview(buffer)[i * row : (i + 1) * row] for i in range(batch)]
        fd = os.open(raw, os.O_RDONLY)
        start = time.perf_counter()
        for epoch in range(epochs):
            order = np.random.default_rng(epoch).permutation(rows)
            for a in range(0, rows, batch):
                for view, i in zip(views, order[a : a + batch].tolist()):
                    os.preadv(fd, [view], header + i * row)
                samples += len(order[a : a + batch])
                first_batch = first_batch or time.perf_counter() - start
            marks.append((time.perf_counter(), samples))
        os.close(fd)
    elif config == "limit-memcpy":  # memory bandwidth: 1 GiB copies in RAM
        src = np.ones(1 << 30, np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        rows_per_gib = (1 << 30) / row_bytes
        start = time.perf_counter()
        for _ in range(epochs):
            for _ in range(3):
                np.copyto(dst, src)
                samples += int(rows_per_gib)
            marks.append((time.perf_counter(), samples))
        first_batch = 0.0
    elif config.startswith("chute"):
        kwargs: dict = {}
        if config == "chute-t1":
            kwargs["workers"] = 1
        elif config == "chute-t2":
            kwargs["workers"] = 2
        elif config == "chute-columnar":
            kwargs["columnar"] = True
        start = time.perf_counter()
        loader = chute.Loader(ds.root, batch, shuffle=True, seed=0, **kwargs)
        for _ in range(epochs):
            for b in loader:
                samples += _count(b)
                first_batch = first_batch or time.perf_counter() - start
            marks.append((time.perf_counter(), samples))
        report = loader.report(since="start").settings
        settings = f"threads {report['num_threads']}, prefetch {report['prefetch']}" + (" (autotuned)" if report["autotune"] else "")
        if type(loader._pass.executor).__name__ == "NativePass":
            settings += ", native gather threads"
        loader.close()
    else:
        batch_fetch, workers = _torch.parse(config)
        start = time.perf_counter()
        if workload == "w1":
            from chute.demo import BatchPickleFilesDataset, PickleFilesDataset

            dataset = (BatchPickleFilesDataset if batch_fetch else PickleFilesDataset)(index)
            kwargs = {} if batch_fetch else dict(collate_fn=list)  # the samples as they are: dicts
            loader = _torch.loader(dataset, batch, workers, batch_fetch, **kwargs)
        else:
            loader = _torch.memmap_loader(raw, workload == "w2", batch, config)
        for _ in range(epochs):
            for b in loader:
                samples += _count(b)
                first_batch = first_batch or time.perf_counter() - start
            marks.append((time.perf_counter(), samples))
        settings = ("BatchSampler, batch_size=None" if batch_fetch else f"batch_size={batch}") + (
            f", num_workers={workers}, persistent_workers" if workers else ""
        )
        end = time.perf_counter()
        del loader, b  # shuts the workers down, so their CPU time counts below
        gc.collect()
    if not config.startswith("torch"):
        end = time.perf_counter()
    elapsed = end - start
    cpu = cpu_seconds() - cpu0
    first_epoch = marks[0][1] / (marks[0][0] - start)
    if len(marks) > 1:  # the steady state: the epochs after the first
        steady = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
    else:
        steady = samples / elapsed
    return {
        "samples_per_s": steady,
        "first_epoch_per_s": first_epoch,
        "mb_per_s": steady * row_bytes / 1e6,
        "first_batch_s": first_batch or 0.0,
        "peak_rss_mb": _rss_mb(children=True),
        "cpu_s_per_1000": 1000 * cpu / max(samples, 1),
        "settings": settings,
    }


def measure_tune(config: str, data_dir: str, epochs: int) -> dict:
    """W2 through chute.Loader with the autotuner ("chute-auto") or ``workers=N`` ("chute-tN")."""
    from _data import array_dataset

    import chute

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
    return {"samples_per_s": samples / elapsed, "threads": settings["num_threads"], "prefetch": settings["prefetch"]}


def print_tune(results: dict, repeats: int) -> None:
    rate = {c: r["samples_per_s"] for c, r in results.items()}
    best = max((c for c in rate if c != "chute-auto"), key=rate.get)
    print(f"\nW2 autotuner vs hand-picked workers (batch {BATCH['w2tune']}, median of {repeats}, round-robin)")
    print(f"  {'config':12s} {'samples/s':>11s} {'/best hand-picked':>18s} {'threads':>8s} {'prefetch':>9s}  runs")
    for c, r in results.items():
        print(
            f"  {c:12s} {rate[c]:11,.0f} {rate[c] / rate[best]:18.2f} {r['threads']:8.1f} {r['prefetch']:9.1f}  "
            f"{', '.join(f'{x:,.0f}' for x in r.get('runs', []))}"
        )
    print(f"  autotuner / best hand-picked ({best}): {rate['chute-auto'] / rate[best]:.2f}")


def tune_table(results: dict, repeats: int, epochs: int) -> dict:
    """The W2 autotuner against hand-picked thread counts, for benchmarks/results/loader.json (table "w2tune")."""
    rate = {c: r["samples_per_s"] for c, r in results.items()}
    best = max((c for c in rate if c != "chute-auto"), key=rate.__getitem__)
    rows = [{
        "label": "chute Loader, default (autotuned)" if c == "chute-auto" else f"chute Loader, workers={c.removeprefix('chute-t')}",
        "config": c, "samples_per_s": r["samples_per_s"], "ratio_best": r["samples_per_s"] / rate[best],
        "threads": r["threads"], "prefetch": r["prefetch"], "runs": r["runs"],
    } for c, r in results.items()]
    return {
        "title": f"W2, batch {BATCH['w2tune']}",
        "columns": [["samples_per_s", "samples/s", ",.0f"], ["ratio_best", "/ best hand-picked", ".2f"],
                    ["threads", "threads (median)", ".1f"], ["prefetch", "prefetch (median)", ".1f"]],
        "rows": rows,
        "notes": (f"median of {repeats} runs of {epochs} shuffled epochs (the first included), each run a fresh process; "
                  f"best hand-picked: {LABELS.get(best, best)}; threads and prefetch: what each run ended with"),
    }


def table(workload: str, results: dict, repeats: int, epochs: int) -> dict:
    """The workload's table for benchmarks/results/loader.json: medians, ratios to the limit and to the best torch."""
    rates = {config: r["samples_per_s"] for config, r in results.items()}
    best_torch, best_rate = _torch.best(rates)
    limit_key = next((k for k in results if k in ("limit", "limit-read")), None)
    rows = []
    for config, r in results.items():
        rows.append({
            "label": LABELS.get(config, config),
            "config": config,
            "samples_per_s": r["samples_per_s"],
            "mb_per_s": r["mb_per_s"] if workload != "w1" else None,
            "cpu_s_per_1000": r["cpu_s_per_1000"],
            "ratio_limit": r["samples_per_s"] / rates[limit_key] if limit_key else None,
            "ratio_torch": r["samples_per_s"] / best_rate,
            "first_epoch_per_s": r["first_epoch_per_s"],
            "first_batch_s": r["first_batch_s"],
            "settings": r.get("settings", ""),
            "runs": r["runs"],
        })
    columns = [["samples_per_s", "samples/s", ",.0f"], ["mb_per_s", "MB/s", ",.0f"],
               ["cpu_s_per_1000", "CPU s / 1k samples", ".4f"], ["ratio_limit", "/ limit", ".2f"],
               ["ratio_torch", "/ best torch", ".2f"], ["first_epoch_per_s", "1st epoch", ",.0f"],
               ["first_batch_s", "1st batch s", ".3f"], ["settings", "settings", ""]]
    if workload == "w1":
        columns = [c for c in columns if c[0] not in ("mb_per_s", "ratio_limit")]
    return {
        "title": f"{workload.upper()}, batch {BATCH[workload]}",
        "columns": columns,
        "rows": rows,
        "notes": (f"median of {repeats} runs of {epochs} shuffled epochs, each run a fresh process; samples/s over epoch(s) "
                  f"{'2-' + str(epochs) if epochs > 2 else '2'}; best torch: {_torch.label(best_torch)}; CPU s / 1k samples: the process's and its worker "
                  "processes' user + system time over all epochs"),
    }


def print_table(workload: str, results: dict, repeats: int, epochs: int) -> dict:
    from tables import render

    t = table(workload, results, repeats, epochs)
    print()
    print(render(t))
    for row in t["rows"]:
        print(f"  runs, {row['config']}: {', '.join(f'{x:,.0f}' for x in row['runs'])}")
    chute = {k: v["samples_per_s"] for k, v in results.items() if k.startswith("chute")}
    if "chute-t1" in chute and "chute-t2" in chute:
        print(f"  2 threads / 1 thread: {chute['chute-t2'] / chute['chute-t1']:.2f}")
    return t


def _rss_mb(children: bool = False) -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        rss += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return rss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="shuffled epochs per run (the first is reported apart)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.data_dir, args.epochs)))
        return
    import torch

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"median of {args.repeats} runs of {args.epochs} epoch(s)")
    tables = {}
    for workload in args.only or ["w2", "w3", "w1"]:
        runs: dict[str, list[dict]] = {config: [] for config in CONFIGS[workload]}
        for done_rounds in range(1, args.repeats + 1):
            for config in CONFIGS[workload]:
                out = subprocess.run(
                    [sys.executable, __file__, "--data-dir", args.data_dir, "--epochs", str(args.epochs), "--one", workload, config],
                    capture_output=True, text=True,
                    env=dict(os.environ, CHUTE_NATIVE_GATHER="0") if config == "chute-py" else None,
                )
                if out.returncode != 0:
                    raise SystemExit(f"{workload} {config} failed:\n{out.stderr}")
                runs[config].append(json.loads(out.stdout.strip().splitlines()[-1]))
            if workload in ("w4", "w2tune"):
                continue
            # the table after every round (medians of the rounds so far), so a run cut short keeps what it measured
            tables[workload] = print_table(workload, summarize(runs), done_rounds, args.epochs)
            save("loader", {workload: tables[workload]})
        results = summarize(runs)
        if workload == "w4":
            from _w4 import print_table as print_w4

            print_w4(results, args.repeats)
        elif workload == "w2tune":
            print_tune(results, args.repeats)
            save("loader", {"w2tune": tune_table(results, args.repeats, args.epochs)})


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per configuration: the median of each figure over its runs, the last settings, and every run's samples/s."""
    results = {}
    for config, done in runs.items():
        results[config] = {k: statistics.median(r[k] for r in done) for k in done[0] if isinstance(done[0][k], (int, float))}
        results[config]["settings"] = done[-1].get("settings", "")
        results[config]["runs"] = [r["samples_per_s"] for r in done]
    return results

if __name__ == "__main__":
    main()
