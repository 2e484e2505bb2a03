"""docs/benchmarks.md shows the figures benchmarks/results/*.json hold: regenerating its tables changes nothing.

After a benchmark run, ``python benchmarks/tables.py`` redraws them; this test fails
when a table was edited by hand or the JSON was updated without redrawing.
"""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tables():
    spec = importlib.util.spec_from_file_location("chute_bench_tables", os.path.join(ROOT, "benchmarks", "tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_benchmarks_tables_are_the_json_results():
    tables = _tables()
    with open(tables.DOC) as f:
        text = f.read()
    assert tables.MARKER.search(text), "docs/benchmarks.md has no generated table"
    assert tables.regenerate(text) == text, "docs/benchmarks.md is out of date: run python benchmarks/tables.py"


def test_a_table_is_drawn_from_its_rows_with_the_column_formats():
    tables = _tables()
    table = {
        "title": "W2",
        "columns": [["rate", "samples/s", ",.0f"], ["ratio", "/ best torch", ".2f"], ["note", "settings", ""]],
        "rows": [{"label": "chute", "rate": 1234567.8, "ratio": 2.345, "note": "2 threads"}, {"label": "torch", "rate": 5.0}],
    }
    assert tables.render(table) == (
        "| W2 | samples/s | / best torch | settings |\n"
        "|---|---:|---:|---|\n"
        "| chute | 1,234,568 | 2.35 | 2 threads |\n"
        "| torch | 5 |  |  |\n"
    )
