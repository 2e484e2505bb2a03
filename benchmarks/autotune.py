"""The autotuner against the best fixed setting: a sweep of worker threads x prefetch depth on W1-W4.

For each workload, one process per repeat runs every configuration in turn
(round-robin within the process, so load that drifts hits them alike; a new
Loader for each, the data in the page cache): one shuffled epoch, then whole
epochs measured until they add up to MEASURE_S (1 s) (the autotuner tunes during
the first and goes on in the measured ones, where it got to; a fixed setting gets
the same warm-up). The table shows medians of
samples/s over the repeats, each configuration's ratio to the best fixed one
of the same run, and the settings the autotuner reached.

  W1  20,000 pickled dicts (the converted dataset), batch 64
  W2  200,000 uint8[3,32,32] + int64 labels, batch 256
  W3  2,000 float32 records of 1 MiB, batch 8
  W4  2,000 JPEGs of 256x256 (built as benchmarks/_w4.py builds W4), DecodeCrop random 224, batch 64;
      threads 1, 2, 3 at prefetch 8 only (decoding makes each configuration slow)

Fixed settings: chute.Workers(count=T, prefetch=P) for T in --threads and P in --prefetch.
"auto" is chute.Loader's default (threads and prefetch autotuned).

    python benchmarks/autotune.py --data-dir bench-data --repeats 5
    python benchmarks/autotune.py --only w2 --threads 1,2,3,4 --prefetch 4,8,16 --repeats 5

    python benchmarks/autotune.py --from-json PATH   # no run: an earlier run's list of rows as tables

Results go to benchmarks/results/autotune.json through benchmarks/_results.py: a table per workload ("w1" ...
"w4"), a row per configuration (docs/benchmarks.md draws them with benchmarks/tables.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import earlier_rows, save  # noqa: E402

BATCH = {"w1": 64, "w2": 256, "w3": 8, "w4": 64}
W4_ROWS = 2_000
#: W4 decodes: a run of its configurations is slow, so fewer of them (threads x prefetch)
SWEEP = {"w4": ("1,2,3", "8")}


def _data(workload: str, data_dir: str):
    from _data import array_dataset, pickle_dataset

    if workload == "w1":
        return pickle_dataset(data_dir)[0]
    if workload == "w4":
        from _w4 import jpeg_dataset

        root = os.path.join(data_dir, f"w4-{W4_ROWS}")
        os.makedirs(root, exist_ok=True)
        return jpeg_dataset(root, rows=W4_ROWS)[0]
    return array_dataset(workload, data_dir)[0]


#: Whole shuffled epochs after the first are measured until they add up to this many seconds: W1-W3 epochs
#: last 0.1-0.2 s, and one such epoch on this VM varies by tens of percent, which a "best of 12 fixed settings"
#: turns into a bias against the one autotuned configuration (the best of many noisy draws).
MEASURE_S = 1.0
MAX_EPOCHS = 40


def _one(ds, workload: str, config: str) -> dict:
    import chute

    transform = chute.images.DecodeCrop("jpeg", size=224, random=True) if workload == "w4" else None
    if config == "auto":
        workers = None
    else:
        t, p = (int(v) for v in config.split("x"))
        workers = chute.Workers(count=t, prefetch=p)
    loader = chute.Loader(ds, BATCH[workload], shuffle=True, seed=0, transform=transform, workers=workers)
    for _ in loader:  # the first epoch: the tuner tunes, a fixed setting warms up
        pass
    samples, seconds, epochs = 0, 0.0, 0
    while seconds < MEASURE_S and epochs < MAX_EPOCHS:
        start = time.perf_counter()
        for batch in loader:
            samples += len(batch["label"]) if "label" in batch else BATCH[workload]
        seconds += time.perf_counter() - start
        epochs += 1
    report = loader.report(since="start")
    out = {"samples_per_s": samples / seconds, "measured_epochs": epochs, "threads": report.settings["num_threads"], "prefetch": report.settings["prefetch"],
           "decisions": [f"{d.change}: {d.reason}" for d in report.decisions]}
    loader.close()
    return out


def child(workload: str, configs: list[str], data_dir: str) -> dict:
    ds = _data(workload, data_dir)
    return {c: _one(ds, workload, c) for c in configs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "..", "bench-data"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=sorted(BATCH), action="append")
    parser.add_argument("--threads", default=None, help="default 1,2,3,4 (W4: 1,2,3)")
    parser.add_argument("--prefetch", default=None, help="default 4,8,16 (W4: 8)")
    parser.add_argument("--from-json", metavar="PATH", help="no run: redraw the rows of an earlier run's list-form JSON as tables")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--configs", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = os.path.abspath(args.data_dir)
    if args.child:
        print(json.dumps(child(args.child, args.configs.split(","), data_dir)))
        return
    if args.from_json:
        rows, stamp = earlier_rows(args.from_json)
        save("autotune", tables(rows), run=stamp, merge=False)
        return
    rows = []
    for workload in args.only or ["w1", "w2", "w3", "w4"]:
        threads, prefetch = SWEEP.get(workload, ("1,2,3,4", "4,8,16"))
        fixed = [f"{t}x{p}" for t in (args.threads or threads).split(",") for p in (args.prefetch or prefetch).split(",")]
        configs = ["auto", *fixed]
        _data(workload, data_dir)  # built before any clock
        runs: dict[str, list[dict]] = {c: [] for c in configs}
        load = []
        for r in range(args.repeats):
            order = configs[r % len(configs):] + configs[:r % len(configs)]  # a different one first each time
            done = subprocess.run(
                [sys.executable, __file__, "--child", workload, "--configs", ",".join(order), "--data-dir", data_dir],
                capture_output=True, text=True, cwd=HERE,
            )
            if done.returncode != 0:
                sys.exit(f"{workload} failed:\n{done.stderr}")
            for c, result in json.loads(done.stdout.strip().splitlines()[-1]).items():
                runs[c].append(result)
            load.append(os.getloadavg()[0])
            print(f"  {workload} run {r + 1}/{args.repeats} (load average {load[-1]:.1f})", file=sys.stderr, flush=True)
        median = {c: statistics.median(x["samples_per_s"] for x in rs) for c, rs in runs.items()}
        best = max(fixed, key=lambda c: median[c])
        # the autotuner against the best fixed setting of each run (ratios within a run), then their median
        per_run = [runs["auto"][k]["samples_per_s"] / max(runs[c][k]["samples_per_s"] for c in fixed) for k in range(args.repeats)]
        print(f"\n{workload.upper()}: batch {BATCH[workload]}, medians of {args.repeats} runs (load average {statistics.median(load):.1f} "
              f"on {os.cpu_count()} CPUs); best fixed: {best}")
        print(f"  {'config':10s} {'samples/s':>12s} {'/best fixed':>12s}  settings reached (each run)")
        for c in configs:
            row = {
                "label": f"{workload.upper()} {'autotuned' if c == 'auto' else 'threads %s, prefetch %s' % tuple(c.split('x'))}",
                "workload": workload, "config": c, "batch_size": BATCH[workload],
                "threads": None if c == "auto" else int(c.split("x")[0]),
                "prefetch": None if c == "auto" else int(c.split("x")[1]),
                "samples_per_s_median": median[c], "ratio_to_best_fixed": median[c] / median[best],
                "samples_per_s_runs": [x["samples_per_s"] for x in runs[c]], "repeats": args.repeats,
                "load_average": statistics.median(load), "cpus": os.cpu_count(),
            }
            if c == "auto":
                row["reached"] = [f"threads {x['threads']}, prefetch {x['prefetch']}" for x in runs[c]]
                row["ratio_to_best_fixed_per_run_median"] = statistics.median(per_run)
                row["decisions_last_run"] = runs[c][-1]["decisions"]
            rows.append(row)
            reached = ", ".join(f"t{x['threads']}/p{x['prefetch']}" for x in runs[c]) if c == "auto" else ""
            print(f"  {c:10s} {median[c]:12,.0f} {median[c] / median[best]:12.3f}  {reached}")
        print(f"  autotuned / best fixed of the same run, median over runs: {statistics.median(per_run):.3f}")
        for d in runs["auto"][-1]["decisions"]:
            print(f"    {d}")
        save("autotune", tables([r for r in rows if r["workload"] == workload]))  # after each workload


def tables(rows: list[dict]) -> dict[str, dict]:
    """``rows`` (one per workload and configuration, as main() makes them) as benchmarks/_results.py tables, one per workload."""
    out: dict[str, dict] = {}
    for row in rows:
        w = row["workload"]
        table = out.setdefault(w, {
            "title": f"{w.upper()}, batch {row['batch_size']}",
            "columns": [["samples_per_s_median", "samples/s", ",.0f"], ["ratio_to_best_fixed", "/ best fixed", ".2f"],
                        ["ratio_to_best_fixed_per_run_median", "/ best fixed of the same run (median)", ".2f"],
                        ["reached_text", "settings reached (each run)", ""]],
            "rows": [],
            "notes": (f"medians of {row['repeats']} runs; each run a process that runs every configuration in turn "
                      f"(a shuffled epoch, then whole epochs measured until they add up to {MEASURE_S:g} s); "
                      "fixed settings are chute.Workers(count=threads, "
                      "prefetch=...), autotuned is chute.Loader's default"),
        })
        shown = {**row, "label": row["label"].removeprefix(w.upper() + " ")}
        if row.get("reached"):
            shown["reached_text"] = "; ".join(row["reached"])
        table["rows"].append(shown)
    return out


if __name__ == "__main__":
    main()
