"""Regenerate the tables of docs/benchmarks.md from benchmarks/results/*.json.

Every table in the doc sits between two markers::

    <!-- table:loader/w2 -->
    ... generated, do not edit ...
    <!-- /table -->

where ``loader`` is the JSON file (``benchmarks/results/loader.json``, written by
``benchmarks/loader.py``) and ``w2`` the table in it. This script replaces what is
between the markers with the table drawn from the JSON, plus one line saying
which run produced it. Text outside the markers is left alone.

    python benchmarks/tables.py            # rewrite docs/benchmarks.md
    python benchmarks/tables.py --check    # exit 1 if the doc is not what the JSON gives
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
MARKER = re.compile(r"(<!-- table:([\w.-]+)/([\w.-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def cell(value: Any, spec: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str) or not spec:
        return str(value)
    return format(value, spec)


def render(table: dict) -> str:
    """A table dict (benchmarks/_results.py) as a markdown table, its notes and the run below it."""
    columns = table["columns"]
    head = [table.get("title", "")] + [c[1] for c in columns]
    align = ["---"] + ["---" if not c[2] else "---:" for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for row in table["rows"]:
        cells = [row.get("label", "")] + [cell(row.get(key), spec) for key, _, spec in columns]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if table.get("notes"):
        text += "\n" + table["notes"] + "\n"
    run = table.get("run")
    if run:
        m = run.get("machine", {})
        versions = ", ".join(f"{k} {m[k]}" for k in ("python", "torch", "numpy", "pyarrow") if k in m)
        text += (f"\n<sub>`{run['command']}`, {run['date']}, commit {run['commit']}; {m.get('cpus', '?')} CPUs, "
                 f"{versions}; load average {m.get('load_avg_1m_at_save', '?')} when saved.</sub>\n")
    return text


def load(name: str) -> dict:
    with open(os.path.join(RESULTS, f"{name}.json")) as f:
        return json.load(f)


def regenerate(text: str) -> str:
    """``text`` with every marked table redrawn from its JSON (a missing file or table is an error)."""
    cache: dict[str, dict] = {}

    def draw(m: re.Match) -> str:
        name, key = m.group(2), m.group(3)
        if name not in cache:
            cache[name] = load(name)
        tables = cache[name]["tables"]
        if key not in tables:
            raise SystemExit(f"docs/benchmarks.md names table {name}/{key}, which benchmarks/results/{name}.json lacks")
        return m.group(1) + render(tables[key]) + m.group(5)

    return MARKER.sub(draw, text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the doc differs from the JSON")
    parser.add_argument("--doc", default=DOC)
    args = parser.parse_args()
    with open(args.doc) as f:
        text = f.read()
    new = regenerate(text)
    if args.check:
        if new != text:
            print(f"{args.doc} is out of date: run python benchmarks/tables.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(args.doc, "w") as f:
            f.write(new)
        print(f"rewrote {os.path.relpath(args.doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
