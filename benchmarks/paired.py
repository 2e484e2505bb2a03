"""Two checkouts of chute, alternated in one run: each workload's Loader throughput under both, paired.

A change to the pipeline must not slow a workload down by more than a run's
own noise. On a shared machine absolute figures move by tens of percent from
one minute to the next, so this compares like with like: for each workload,
``--pairs`` pairs of runs, each pair one run of this checkout's chute and one
of ``--base``'s (the order alternates from pair to pair), every run in a fresh
process with the same benchmark code and data, only ``import chute`` differing
(``PYTHONPATH``). The table gives each side's median and the ratio of the
medians, and the spread of the pairs' own ratios (lowest to highest): a ratio
within that spread is not a change. CPU time per sample (all the process's
threads, worker processes included) is the steadier figure on a busy machine:
its ratio is the last column.

The workloads are the Loader rows of ``benchmarks/loader.py`` (W1-W4, the
default ``chute`` configuration, autotuned) and of ``benchmarks/tokens.py``
(sequences of 2048, batch 8, ``pack="concat"`` and ``"documents"``), on the same
generated data (``--data-dir``).

    python benchmarks/paired.py --base ../chute-main --data-dir bench-data --pairs 5
    python benchmarks/paired.py --base ../chute-main --only w2 --only tokens-concat
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _results import RESULTS, save  # noqa: E402

#: Passes per run (the first a warm-up): about 2 s of measured passes each on a 2-core machine.
EPOCHS = {"w1": 4, "w2": 16, "w3": 6, "w4": 2, "tokens-concat": 9, "tokens-documents": 9}
WORKLOADS = {
    "w1": "W1, 20,000 dicts of 10 str keys, batch 64",
    "w2": "W2, 200,000 x uint8[3,32,32], batch 256",
    "w3": "W3, 2,000 x float32 1 MiB rows, batch 8",
    "w4": "W4, 20,000 JPEGs, decode + crop 224 in the Loader, batch 256",
    "tokens-concat": 'tokens, seq_len 2048, batch 8, pack="concat"',
    "tokens-documents": 'tokens, seq_len 2048, batch 8, pack="documents"',
}


def measure(workload: str, data_dir: str, epochs: int, tokens: int) -> dict:
    """One run of ``workload`` with whichever chute this process imports; samples (or positions) per second."""
    if workload.startswith("tokens-"):
        import tokens as bench_tokens

        import chute

        ds, _ = bench_tokens.corpus(data_dir, tokens)
        view = chute.tokens.sequences(ds, bench_tokens.SEQ_LEN, pack=workload.split("-", 1)[1])
        rate, cpu_us, threads = bench_tokens.loader_rate(view, seed=0, passes=max(1, epochs - 1))
        return {"rate": rate, "cpu": cpu_us / 1e6 / (bench_tokens.BATCH * bench_tokens.SEQ_LEN), "threads": threads}
    import loader as bench_loader

    config = "chute-auto" if workload == "w4" else "chute"
    out = bench_loader.measure(workload, config, data_dir, epochs)
    return {"rate": out["samples_per_s"], "cpu": out["cpu_s_per_1000"] / 1000, "threads": out.get("threads")}


def run_one(checkout: str, workload: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout + os.pathsep + os.environ.get("PYTHONPATH", "")}
    epochs = args.epochs or EPOCHS[workload]
    out = subprocess.run(
        [sys.executable, __file__, "--measure", workload, "--data-dir", args.data_dir, "--epochs", str(epochs),
         "--tokens", str(args.tokens)],
        capture_output=True, text=True, env=env,
    )
    if out.returncode != 0:
        raise SystemExit(f"{workload} with {checkout} failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if os.path.realpath(result["chute"]) != os.path.realpath(os.path.join(checkout, "chute")):
        raise SystemExit(f"the run meant for {checkout} imported chute from {result['chute']}")
    return result


def _earlier_rows() -> list[dict]:
    """The rows of the last saved table (a run with ``--only`` keeps the other workloads' rows)."""
    try:
        with open(os.path.join(RESULTS, "paired.json")) as f:
            return list(json.load(f)["tables"]["pipeline"]["rows"])
    except (OSError, KeyError, ValueError):
        return []


def commit_of(checkout: str) -> str:
    try:
        return subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="the other checkout (its root: the folder holding chute/)")
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, help="passes per run, the first a warm-up (default: EPOCHS)")
    parser.add_argument("--tokens", type=int, default=100_000_000, help="the token corpus's size")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.measure:
        import chute

        out = measure(args.measure, args.data_dir, args.epochs or 3, args.tokens)
        out["chute"] = os.path.dirname(os.path.abspath(chute.__file__))
        print(json.dumps(out))
        return
    if not args.base:
        parser.error("--base is required")
    sides = {"base": os.path.abspath(args.base), "this": ROOT}
    rows, loads = [], []
    for workload in args.only or list(WORKLOADS):
        rates: dict[str, list[float]] = {"base": [], "this": []}
        cpus: dict[str, list[float]] = {"base": [], "this": []}  # CPU seconds per sample, all the process's threads
        for pair in range(args.pairs):
            loads.append(os.getloadavg()[0])
            for side in (("base", "this") if pair % 2 == 0 else ("this", "base")):
                result = run_one(sides[side], workload, args)
                rates[side].append(result["rate"])
                cpus[side].append(result["cpu"])
            print(f"{workload} pair {pair}: base {rates['base'][-1]:,.0f}, this {rates['this'][-1]:,.0f} "
                  f"({rates['this'][-1] / rates['base'][-1]:.3f}x), load {loads[-1]:.1f}", flush=True)
        pairs = [t / b for t, b in zip(rates["this"], rates["base"])]
        rows.append({
            "label": WORKLOADS[workload], "workload": workload, "epochs": args.epochs or EPOCHS[workload],
            "base": statistics.median(rates["base"]), "this": statistics.median(rates["this"]),
            "ratio": statistics.median(rates["this"]) / statistics.median(rates["base"]),
            "spread": f"{min(pairs):.2f}-{max(pairs):.2f}", "pairs": pairs, "runs": rates,
            "cpu_ratio": statistics.median(cpus["this"]) / statistics.median(cpus["base"]), "cpu_runs": cpus,
        })
    measured = {row["workload"] for row in rows}
    rows += [row for row in _earlier_rows() if row.get("workload") not in measured]  # workloads not rerun now
    rows.sort(key=lambda row: list(WORKLOADS).index(row["workload"]))
    table = {
        "title": "workload (samples/s; positions/s for tokens)",
        "columns": [["epochs", "passes", "d"], ["base", "base", ",.0f"], ["this", "this", ",.0f"],
                    ["ratio", "this / base", ".2f"], ["spread", "pairs' ratios", ""],
                    ["cpu_ratio", "CPU per sample, this / base", ".2f"]],
        "rows": rows,
        "notes": (f"medians of {args.pairs} pairs of runs alternated in one run (each run a fresh process, "
                  f"the passes the table gives, the first a warm-up); base: {commit_of(sides['base'])}, this: "
                  f"{commit_of(sides['this'])}; load average (1 min) {statistics.median(loads):.1f} (median at the "
                  f"pairs' starts) on a machine shared with other jobs"),
    }
    save("paired", {"pipeline": table})
    for row in rows:
        print(f"{row['workload']}: base {row['base']:,.0f}, this {row['this']:,.0f}, {row['ratio']:.3f}x (pairs {row['spread']})")


if __name__ == "__main__":
    main()
