"""The example at the top of docs/tokens.md runs as written, and its model learns."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tokens.md"


def test_the_ten_line_example_trains(tmp_path, monkeypatch):
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) <= 12
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, str(DOC), "exec"), scope)
    assert scope["step"] == 59 and scope["loss"].item() < 1.0
    assert (tmp_path / "corpus" / "manifest.json").exists()
