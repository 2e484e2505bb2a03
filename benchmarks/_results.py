"""The one place a benchmark's figures are kept: ``benchmarks/results/<name>.json``.

A benchmark script measures, prints what it likes, and calls :func:`save` with
its tables; ``benchmarks/tables.py`` turns every saved table into the markdown
between ``<!-- table:<name>/<table> -->`` and ``<!-- /table -->`` in
docs/benchmarks.md, so a figure in the docs is always the one a script wrote.

A table is a dict::

    {"title": "W2, batch 256",                       # the first header cell
     "columns": [["samples_per_s", "samples/s", ",.0f"],   # key, header, format spec
                 ["ratio_limit", "/ limit", ".2f"]],
     "rows": [{"label": "numpy x[idx] ...", "samples_per_s": 2.5e6, "ratio_limit": 1.0}, ...],
     "notes": "optional text printed under the table"}

A cell whose value is missing or ``None`` prints as empty; a string prints as
it is; a number with the column's format (``","`` thousands, ``".2f"`` ...).
Raw numbers stay in the JSON: rounding happens only when the table is drawn.
A row may hold more keys than the columns show (each run's figures, the
settings): they stay in the JSON for whoever wants them.

Some scripts once wrote their own files, a flat JSON list of rows. Their
``--from-json PATH`` option redraws such a file's rows as tables (no new
measurement), stamped by :func:`earlier_run` with where they came from.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any

#: where the JSON goes; CHUTE_BENCH_RESULTS moves it (a trial run that must not touch the committed figures)
RESULTS = os.environ.get("CHUTE_BENCH_RESULTS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine() -> dict[str, Any]:
    """What the figures were measured on (and how busy it was)."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_1m_at_save": round(os.getloadavg()[0], 2),
    }
    for module in ("torch", "numpy", "pyarrow"):
        mod = sys.modules.get(module)
        if mod is not None:
            info[module] = mod.__version__
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20)
    except OSError:
        pass
    return info


def commit() -> str:
    """The short commit the benchmark ran at ("+dirty" when the tree had changes)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def save(name: str, tables: dict[str, dict], command: str | None = None, notes: str = "", merge: bool = True,
         run: dict[str, Any] | None = None) -> str:
    """Write (or update, with ``merge``) ``benchmarks/results/<name>.json``; returns its path.

    With ``merge`` the tables of an earlier run that this run did not measure
    (``--only w2`` after a full run) are kept, each with its own date and commit
    (a file in the old list form has no tables to keep). ``run`` replaces parts
    of the stamp (date, commit, command, machine) each table gets: for figures
    measured earlier (:func:`earlier_run`).
    """
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    old: dict[str, Any] = {}
    if merge and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if not isinstance(old, dict):  # the old list of rows: nothing to merge
            old = {}
    stamp = {
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "command": command or "python " + " ".join(["benchmarks/" + os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "machine": machine(),
        **(run or {}),
    }
    merged = dict(old.get("tables", {}))
    for key, table in tables.items():
        merged[key] = {**table, "run": stamp}
    out = {"benchmark": name, "notes": notes or old.get("notes", ""), "tables": merged}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"\nwrote {os.path.relpath(path)} (regenerate the docs: python benchmarks/tables.py)")
    return path


def earlier_rows(path: str) -> tuple[list[dict], dict[str, Any]]:
    """The rows of a results file in the old list form, and the run stamp for :func:`save`'s ``run``.

    The stamp says where the figures came from: the git commit and date that
    last changed the file (or "uncommitted" and today when it has changes), the
    command that converted them, and the CPU count and median load average the
    rows recorded. Raises SystemExit when the file is not a list of rows.
    """
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SystemExit(f"{path} is not a list of rows (already converted?)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(path, root) if os.path.abspath(path).startswith(root + os.sep) else path
    where = os.path.dirname(os.path.abspath(path))
    sha, date = "uncommitted", datetime.date.today().isoformat()
    try:
        changed = subprocess.run(["git", "-C", where, "status", "--porcelain", "--", os.path.abspath(path)],
                                 capture_output=True, text=True, check=True).stdout.strip()
        if not changed:
            log = subprocess.run(["git", "-C", where, "log", "-1", "--format=%h %cs", "--", os.path.abspath(path)],
                                 capture_output=True, text=True, check=True).stdout.split()
            if len(log) == 2:
                sha, date = log
    except (OSError, subprocess.CalledProcessError):
        pass
    loads = sorted(r["load_average"] for r in rows if isinstance(r.get("load_average"), (int, float)))
    machine_info: dict[str, Any] = {"cpus": next((r["cpus"] for r in rows if r.get("cpus")), "?")}
    if loads:
        machine_info["load_avg_1m_at_save"] = round(loads[len(loads) // 2], 2)
    script = os.path.basename(sys.argv[0])
    return rows, {
        "date": date,
        "commit": sha,
        "command": f"python benchmarks/{script} (earlier run's rows, redrawn by --from-json {rel})",
        "machine": machine_info,
    }


def _live_children_cpu(pid: int) -> float:
    """User + system seconds of ``pid``'s live descendants, from /proc (0 where /proc lacks them)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
            total += _live_children_cpu(child)
    return total


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, its reaped children and its live ones.

    For CPU-per-sample figures: the difference of two readings. A worker process
    counts while alive (read from /proc, Linux) and once exited and waited for
    (os.times), so the difference is right whether the workers live across the
    run, start in it or exit in it.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_children_cpu(os.getpid())
