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
    python benchmarks/tables.py --missing  # the tables in the JSON that no marker shows yet
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
        text += (f"\n<sub>`{run['command']}`, {run['date']}, commit {run['commit']}; "
                 f"{str(m['cpus']) + ' CPUs' if m.get('cpus') not in (None, '?') else 'CPUs not recorded'}"
                 f"{', ' + versions if versions else ''}; {load_text(m)}.</sub>\n")
    return text


def load_text(machine: dict) -> str:
    load = machine.get("load_avg_1m_at_save")
    return "load average not recorded" if load is None else f"load average {load} when saved"


def load(name: str) -> dict:
    with open(os.path.join(RESULTS, f"{name}.json")) as f:
        data = json.load(f)
    if not isinstance(data, dict) or "tables" not in data:
        raise SystemExit(f"benchmarks/results/{name}.json is a list of rows from before benchmarks/_results.py: redraw it "
                         f"as tables with the script's --from-json benchmarks/results/{name}.json (or rerun the script)")
    return data


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


def missing(text: str) -> list[str]:
    """``name/table`` of every table in benchmarks/results/*.json that no marker in ``text`` draws."""
    shown = {(m.group(2), m.group(3)) for m in MARKER.finditer(text)}
    out = []
    for file in sorted(os.listdir(RESULTS)):
        if not file.endswith(".json"):
            continue
        name = file[: -len(".json")]
        with open(os.path.join(RESULTS, file)) as f:
            data = json.load(f)
        if not isinstance(data, dict) or "tables" not in data:
            out.append(f"{name} (a list of rows: redraw it with the script's --from-json benchmarks/results/{file})")
            continue
        out += [f"{name}/{key}" for key in data["tables"] if (name, key) not in shown]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the doc differs from the JSON")
    parser.add_argument("--missing", action="store_true", help="list the tables in the JSON that no marker in the doc shows")
    parser.add_argument("--doc", default=DOC)
    args = parser.parse_args()
    with open(args.doc) as f:
        text = f.read()
    if args.missing:
        for line in missing(text):
            print(line)
        return 0
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
