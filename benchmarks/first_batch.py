"""Time to the first batch, from a fresh process: chute.Loader(path) against torch's DataLoader on the same data.

Each run is a new Python process (PYTHONDONTWRITEBYTECODE unset, as users run
it) that first imports what it needs (torch, numpy, ``from chute import
Loader``: imports are not counted), then times, with ``perf_counter``, from
constructing the loader to holding batch 0 (``next(iter(loader))``), and the
CPU time of the whole process over the same span (all threads). Configurations
run round-robin, --repeats times; the table shows medians with min-max.

  W1  20,000 pickled dicts, batch 64: chute reads the converted dataset, torch the .pkl.gz files (CSV index)
  W2  200,000 uint8[3,32,32] + int64 labels, batch 256, shuffled
  W3  2,000 float32 records of 1 MiB, batch 8, shuffled

Configurations:
  chute            chute.Loader(path, batch_size, shuffle=True): opens the dataset, builds the order, starts its
                   thread, maps and checks batch 0's shards (their checksums were verified on this machine before)
  chute-cold       the same with a new, empty chute cache directory: batch 0's shards are hashed (verify=True)
                   before batch 0, as on a machine that never read them
  torch-0          torch DataLoader(Dataset over a numpy memmap (W1: the pickles), shuffle=True, num_workers=0)
  torch-batch      the strongest torch setup: a memmap Dataset whose __getitem__ takes a whole batch of indices,
                   DataLoader(sampler=BatchSampler(RandomSampler), batch_size=None) (W2, W3)
  torch-2          torch DataLoader(..., num_workers=2) (workers forked, as on Linux by default)

    python benchmarks/first_batch.py --data-dir bench-data --repeats 7
    python benchmarks/first_batch.py --only w2 --repeats 7
    python benchmarks/first_batch.py --from-json benchmarks/results/first_batch.json   # an old list of rows as tables

The imports (``--only imports``): fresh processes that have imported torch and numpy (a training script's own
imports). The goal's row ("after gc.collect()") runs ``gc.collect()`` before the clock: ``import torch`` leaves
its objects one young collection short of Python's first full collection, which whoever allocates next pays
(chute, the user's next import, the training loop's first allocations), so the row counts what chute itself
costs, as it is in any script that did anything after ``import torch``. Then it times ``from chute import Loader``,
and that plus ``Loader(path)`` and batch 0 of W2, counting the collections Python runs meanwhile per generation.
Beside it, in the same round: the expert torch DataLoader (whole-batch fetch over W2's .npy, as ``torch-batch``)
built and holding batch 0, after the same ``gc.collect()``; chute's import and batch 0 without the collection
before the clock, with the time of the first full collection in it; and chute's again under ``python -X importtime``
for the import time of chute's own modules and of pyarrow (the shards' Arrow IPC reader, which chute imports).
Each lists chute's remote-storage modules and the network clients that a local dataset loaded: none is expected.

Results go to benchmarks/results/first_batch.json through benchmarks/_results.py: a table per workload, a row
per configuration, and table "imports" (docs/benchmarks.md draws them with benchmarks/tables.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import earlier_rows, save  # noqa: E402

BATCH = {"w1": 64, "w2": 256, "w3": 8}
CONFIGS = {
    "w1": ["chute", "chute-cold", "torch-0", "torch-2"],
    "w2": ["chute", "chute-cold", "torch-0", "torch-batch", "torch-2"],
    "w3": ["chute", "chute-cold", "torch-0", "torch-batch", "torch-2"],
}
LABELS = {
    "chute": "chute Loader(path)",
    "chute-cold": "chute Loader(path), shards not yet verified on this machine",
    "torch-0": "torch DataLoader, num_workers=0",
    "torch-batch": "torch DataLoader, whole-batch fetch (BatchSampler)",
    "torch-2": "torch DataLoader, num_workers=2",
}


class _BatchMemmap:
    """A map Dataset whose item is a whole batch: ``ds[list_of_indices]`` (what an expert writes)."""

    def __init__(self, path: str, label: bool) -> None:
        import numpy as np

        self.data, self.label = np.load(path, mmap_mode="r"), label

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, idx):
        import numpy as np
        import torch

        idx = np.sort(np.asarray(idx))
        x = torch.from_numpy(self.data[idx])
        return (x, torch.from_numpy(idx)) if self.label else x


def child(workload: str, config: str, data_dir: str) -> dict:
    """One measurement, in this (fresh) process."""
    import time

    import numpy as np  # noqa: F401  (imports are not timed)
    import torch

    import chute  # noqa: F401
    from chute import Loader

    batch = BATCH[workload]
    path = os.path.join(data_dir, "w1-20000-chute" if workload == "w1" else workload)
    if config.startswith("torch"):
        from _data import MemmapDataset

        if workload == "w1":
            from chute.demo import PickleFilesDataset
        raw = os.path.join(data_dir, f"{workload}.npy")
    clock, cpu = time.perf_counter, time.process_time
    start, cpu0 = clock(), cpu()
    if config.startswith("chute"):
        loader = Loader(path, batch_size=batch, shuffle=True)
    elif config == "torch-batch":
        dataset = _BatchMemmap(raw, label=workload == "w2")
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), batch, drop_last=False)
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None)
    else:
        workers = int(config.split("-")[1])
        if workload == "w1":
            dataset = PickleFilesDataset(os.path.join(data_dir, "w1-20000", "index.csv"))
            loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, collate_fn=list)
        else:
            dataset = MemmapDataset(raw, label=workload == "w2")
            loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
    it = iter(loader)
    next(it)
    elapsed, used = clock() - start, cpu() - cpu0
    del it
    if hasattr(loader, "close"):
        loader.close()
    return {"ttfb_s": elapsed, "cpu_s": used}


REMOTE = ("chute.storage.net", "chute.storage.node.cache", "chute.storage.node.fetcher", "urllib3", "fsspec", "botocore", "aiohttp")
IMPORTS = ("chute", "torch", "chute-natural")
"""The --only imports children: chute after gc.collect(), the torch DataLoader after gc.collect(), chute without it."""


def imports_child(data_dir: str, which: str) -> dict:
    """A local dataset's first batch, in this (fresh) process, imports included; see the module docstring."""
    import gc
    import time

    import numpy  # noqa: F401  (a training script's own imports, before the clock)
    import torch

    if which != "chute-natural":
        gc.collect()  # import torch's objects collected before the clock, as in any script by its first batch
    full: list[float] = []
    collections = [0, 0, 0]

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            collections[info["generation"]] += 1
        if info["generation"] == 2:
            full.append(time.perf_counter() if phase == "start" else time.perf_counter() - full.pop())

    gc.callbacks.append(watch)
    w0, c0 = time.perf_counter(), time.process_time()
    if which == "torch":
        dataset = _BatchMemmap(os.path.join(data_dir, "w2.npy"), label=True)
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), BATCH["w2"], drop_last=False)
        loader: Any = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None)
        w1, c1 = w0, c0
    else:
        from chute import Loader

        w1, c1 = time.perf_counter(), time.process_time()
        loader = Loader(os.path.join(data_dir, "w2"), batch_size=BATCH["w2"], shuffle=True)
    next(iter(loader))
    w2, c2 = time.perf_counter(), time.process_time()
    gc.callbacks.remove(watch)
    if hasattr(loader, "close"):
        loader.close()
    return {"import_s": w1 - w0, "import_cpu_s": c1 - c0, "first_s": w2 - w0, "first_cpu_s": c2 - c0, "gc_s": sum(full),
            "collections": collections, "remote": sorted(m for m in sys.modules if m.startswith(REMOTE))}


def imports_run(data_dir: str, which: str, *python_flags: str) -> tuple[dict, str]:
    """One fresh process of :func:`imports_child` (``.pyc`` files written, as users run): its figures and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, *python_flags, __file__, "--imports-child", which, "--data-dir", data_dir],
                          env=env, capture_output=True, text=True, check=True, cwd=HERE)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def importtime(data_dir: str) -> dict:
    """Import seconds of chute's own modules and of pyarrow (self times, ``-X importtime``, after gc.collect())."""
    out, stderr = imports_run(data_dir, "chute", "-X", "importtime")
    own = arrow = 0
    after = False  # modules imported after torch: what chute adds to a training script
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if not self_us.isdigit():
            continue
        if name in ("torch", "numpy") and after is False:
            after = name == "torch"
            continue
        if after:
            own += int(self_us) if name.startswith("chute") else 0
            arrow += int(self_us) if name.startswith("pyarrow") else 0
    return {"chute_s": own / 1e6, "pyarrow_s": arrow / 1e6, "remote": out["remote"]}


def run(workload: str, config: str, data_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cold = None
    if config == "chute-cold":
        cold = tempfile.mkdtemp(prefix="chute-cold-cache-")
        env["CHUTE_CACHE_DIR"] = cold
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--child", workload, config, "--data-dir", data_dir],
            env=env, capture_output=True, text=True, check=True, cwd=HERE,
        ).stdout
    finally:
        if cold is not None:
            shutil.rmtree(cold, ignore_errors=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "..", "bench-data"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=sorted([*CONFIGS, "imports"]), action="append")
    parser.add_argument("--from-json", metavar="PATH", help="no run: redraw the rows of an earlier run's list-form JSON as tables")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONFIG"))
    parser.add_argument("--imports-child", choices=IMPORTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_dir = os.path.abspath(args.data_dir)
    if args.child:
        print(json.dumps(child(*args.child, data_dir)))
        return
    if args.imports_child:
        print(json.dumps(imports_child(data_dir, args.imports_child)))
        return
    if args.from_json:
        rows, stamp = earlier_rows(args.from_json)
        save("first_batch", tables(rows), run=stamp, merge=False)
        return
    from _data import array_dataset, pickle_dataset

    workloads = [w for w in args.only or ["w1", "w2", "w3", "imports"] if w != "imports"]
    if "imports" in (args.only or ["imports"]):
        return save_imports(data_dir, args.repeats, workloads)
    for w in workloads:  # generated once, and read once so that the files are in the page cache
        pickle_dataset(data_dir) if w == "w1" else array_dataset(w, data_dir)
        run(w, "chute", data_dir)  # verifies the shards batch 0 reads on this machine (as any earlier run would)
    results: dict[tuple[str, str], list[dict]] = {(w, c): [] for w in workloads for c in CONFIGS[w]}
    load = []
    for r in range(args.repeats):
        for (w, c), runs in results.items():
            runs.append(run(w, c, data_dir))
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.repeats} done (load average {load[-1]:.1f})", file=sys.stderr)
    rows = []
    print(f"\nTime to first batch, fresh processes, medians of {args.repeats} (min-max); load average {statistics.median(load):.1f} "
          f"on {os.cpu_count()} CPUs\n")
    print(f"{'workload':8} {'loader':64} {'first batch':>22} {'CPU':>8}")
    for (w, c), runs in results.items():
        t = sorted(x["ttfb_s"] for x in runs)
        cpu = statistics.median(x["cpu_s"] for x in runs)
        row = {
            "label": f"{w.upper()} {LABELS[c]}", "workload": w, "config": c, "batch_size": BATCH[w],
            "ttfb_median_s": statistics.median(t), "ttfb_min_s": t[0], "ttfb_max_s": t[-1], "cpu_median_s": cpu,
            "runs": len(t), "load_average": statistics.median(load), "cpus": os.cpu_count(),
        }
        rows.append(row)
        print(f"{w:8} {LABELS[c]:64} {row['ttfb_median_s'] * 1e3:7.1f} ms ({t[0] * 1e3:.0f}-{t[-1] * 1e3:.0f}) {cpu * 1e3:6.1f} ms")
    save("first_batch", tables(rows))


def save_imports(data_dir: str, repeats: int, then: list[str]) -> None:
    """Table "imports" (then the workloads in ``then``, if any): ``repeats`` rounds, each every child in turn."""
    from _data import array_dataset

    array_dataset("w2", data_dir)
    for which in IMPORTS:  # writes the .pyc files and verifies batch 0's shards, as any earlier run would
        imports_run(data_dir, which)
    runs: dict[str, list[dict]] = {which: [] for which in IMPORTS}
    times, load = [], []
    for r in range(repeats):
        for which in IMPORTS:
            runs[which].append(imports_run(data_dir, which)[0])
        times.append(importtime(data_dir))
        load.append(os.getloadavg()[0])
        print(f"round {r + 1}/{repeats}: {[(w, x[-1]) for w, x in runs.items()]}, {times[-1]}", file=sys.stderr)

    def row(label: str, values: list[float], cpu: list[float] | None = None, **extra: Any) -> dict:
        v = sorted(values)
        return {"label": label, "median_ms": statistics.median(v) * 1e3, "min_ms": v[0] * 1e3, "max_ms": v[-1] * 1e3,
                "cpu_median_ms": None if cpu is None else statistics.median(cpu) * 1e3, "runs": len(v), **extra}

    chute, torch, natural = (runs[which] for which in IMPORTS)
    ratio = statistics.median(c["first_s"] / t["first_s"] for c, t in zip(chute, torch))
    remote = sorted({m for x in chute + natural + times for m in x["remote"]})
    counts = {g: sorted(x["collections"][g] for x in chute) for g in range(3)}
    table = {
        "title": "Imports of a local dataset's first Loader (torch, numpy imported before)",
        "columns": [["median_ms", "ms (wall, median)", ",.0f"], ["min_ms", "min ms", ",.0f"], ["max_ms", "max ms", ",.0f"],
                    ["cpu_median_ms", "CPU ms (median)", ",.0f"]],
        "rows": [
            row("after gc.collect(): from chute import Loader", [x["import_s"] for x in chute], [x["import_cpu_s"] for x in chute]),
            row("after gc.collect(): from chute import Loader, Loader(path) and batch 0 (W2)", [x["first_s"] for x in chute],
                [x["first_cpu_s"] for x in chute]),
            row("after gc.collect(): of which Loader(path) and batch 0, after the import", [x["first_s"] - x["import_s"] for x in chute],
                [x["first_cpu_s"] - x["import_cpu_s"] for x in chute]),
            row("after gc.collect(): torch DataLoader, whole-batch fetch, and batch 0 (W2 .npy)", [x["first_s"] for x in torch],
                [x["first_cpu_s"] for x in torch]),
            row("import torch's garbage left: from chute import Loader, Loader(path) and batch 0", [x["first_s"] for x in natural],
                [x["first_cpu_s"] for x in natural]),
            row("of which the first full garbage collection after import torch", [x["gc_s"] for x in natural]),
            row("chute's own modules: their import times (-X importtime, after gc.collect())", [x["chute_s"] for x in times]),
            row("pyarrow, imported by chute: the same", [x["pyarrow_s"] for x in times]),
        ],
        "ratio_chute_torch_median": ratio,
        "notes": (f"{repeats} rounds, each its four fresh processes in turn (.pyc files written); load average "
                  f"{statistics.median(load):.1f} (median of the rounds); chute's import and batch 0 / torch's batch 0, "
                  f"round by round: {ratio:.2f}x (median); collections Python ran on chute's path after gc.collect() "
                  f"(generations 0/1/2, min-max of the rounds): {counts[0][0]}-{counts[0][-1]} / {counts[1][0]}-{counts[1][-1]} / "
                  f"{counts[2][0]}-{counts[2][-1]}; chute's remote-storage modules and network clients loaded: {', '.join(remote) or 'none'}"),
    }
    save("first_batch", {"imports": table})
    if then:
        raise SystemExit("--only imports runs alone: run the workloads in another call")


def tables(rows: list[dict]) -> dict[str, dict]:
    """The figures of ``rows`` (one per workload and configuration, as main() makes them) as benchmarks/_results.py tables."""
    out: dict[str, dict] = {}
    for row in rows:
        w = row["workload"]
        table = out.setdefault(w, {
            "title": f"{w.upper()}, batch {row['batch_size']}",
            "columns": [["ttfb_median_ms", "first batch ms (wall, median)", ",.0f"], ["ttfb_min_ms", "min ms", ",.0f"],
                        ["ttfb_max_ms", "max ms", ",.0f"], ["cpu_median_ms", "CPU ms (median)", ",.0f"]],
            "rows": [],
            "notes": (f"medians of {row['runs']} runs, round-robin, each a fresh process with its imports done before "
                      "the clock; wall time from creating the loader to holding batch 0, CPU time of the whole process "
                      "(all threads) over the same span"),
        })
        label = row["label"].removeprefix(w.upper() + " ")
        table["rows"].append({**row, "label": label, "ttfb_median_ms": row["ttfb_median_s"] * 1e3,
                              "ttfb_min_ms": row["ttfb_min_s"] * 1e3, "ttfb_max_ms": row["ttfb_max_s"] * 1e3,
                              "cpu_median_ms": row["cpu_median_s"] * 1e3})
    return out


if __name__ == "__main__":
    main()
