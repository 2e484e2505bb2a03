"""The format package is a leaf: it never imports storage, the pipeline or chute's public façade.

Writing to a URL and reading through the node cache are wired from chute/storage/
(chute.storage.write, chute.storage.open, the ShardSource seam); a function-level
import counts as much as a top-level one.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import chute

FORMAT = pathlib.Path(chute.__file__).parent / "format"
HIGHER = ("chute.storage", "chute.pipeline", "chute.observe", "chute.device", "chute.sources", "chute.mixture",
          "chute.ray", "chute.cli", "chute.tokens")


def _imports(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "chute":  # ``from chute import _native`` is a module; ``from chute import open`` is the façade
                names += [f"chute.{a.name}" if a.name.startswith("_") else "chute" for a in node.names]
            else:
                names.append(node.module)
    return names


def test_format_imports_nothing_above_it():
    bad = {
        f"{path.name}: {name}"
        for path in sorted(FORMAT.glob("*.py"))
        for name in _imports(path)
        if name == "chute" or name.startswith(HIGHER) or name in {f"chute.{h.split('.')[1]}" for h in HIGHER}
    }
    assert not bad, f"chute.format imports from higher layers: {sorted(bad)}"


def test_importing_the_format_loads_no_storage_module():
    code = ("import sys, chute.format, chute.format.reader, chute.format.writer, chute.format.validate; "
            "print(sorted(m for m in sys.modules if m.startswith(('chute.storage', 'chute.pipeline'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
