"""docs/benchmarks.md shows the figures benchmarks/results/*.json hold: regenerating its tables changes nothing.

After a benchmark run, ``python benchmarks/tables.py`` redraws them; this test fails
when a table was edited by hand or the JSON was updated without redrawing.
"""

from __future__ import annotations

import importlib.util
import json
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


def test_a_results_file_of_old_rows_names_the_command_that_redraws_it(tmp_path, monkeypatch):
    tables = _tables()
    (tmp_path / "first_batch.json").write_text('[{"label": "W1 chute Loader(path)"}]')
    monkeypatch.setattr(tables, "RESULTS", str(tmp_path))
    text = "<!-- table:first_batch/w1 -->\n<!-- /table -->"
    try:
        tables.regenerate(text)
    except SystemExit as e:
        assert "--from-json benchmarks/results/first_batch.json" in str(e)
    else:
        raise AssertionError("a list-form results file was drawn")
    assert tables.missing(text) == [
        "first_batch (a list of rows: redraw it with the script's --from-json benchmarks/results/first_batch.json)"
    ]


def test_old_rows_redrawn_by_a_script_become_the_tables_the_doc_draws(tmp_path, monkeypatch):
    """The path a list-form file takes (``first_batch.py --from-json``): its figures, unrounded, in tables with a stamp."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import _results
    import first_batch

    row = {"label": "W2 chute Loader(path)", "workload": "w2", "config": "chute", "batch_size": 256, "ttfb_median_s": 0.3674,
           "ttfb_min_s": 0.1691, "ttfb_max_s": 0.8726, "cpu_median_s": 0.0318, "runs": 5, "load_average": 30.7, "cpus": 2}
    old = tmp_path / "old.json"
    old.write_text(json.dumps([row]))
    monkeypatch.setattr(_results, "RESULTS", str(tmp_path))
    rows, stamp = _results.earlier_rows(str(old))
    _results.save("first_batch", first_batch.tables(rows), run=stamp, merge=False)
    saved = json.loads((tmp_path / "first_batch.json").read_text())
    table = saved["tables"]["w2"]
    assert table["rows"][0]["ttfb_median_s"] == 0.3674  # raw figures stay
    assert table["run"]["machine"] == {"cpus": 2, "load_avg_1m_at_save": 30.7}
    assert "--from-json" in table["run"]["command"]
    tables = _tables()
    monkeypatch.setattr(tables, "RESULTS", str(tmp_path))
    drawn = tables.regenerate("<!-- table:first_batch/w2 -->\n<!-- /table -->")
    assert "| chute Loader(path) | 367 | 169 | 873 | 32 |" in drawn
    assert "2 CPUs; load average 30.7 when saved." in drawn
