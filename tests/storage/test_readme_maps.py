"""The file maps of chute/storage/README.md and chute/storage/node/README.md name every module of their folders,
and only modules that exist: a reader finds the code from them."""

from __future__ import annotations

import pathlib
import re

import pytest

STORAGE = pathlib.Path(__file__).resolve().parents[2] / "chute" / "storage"


def _mapped(readme: pathlib.Path) -> set[str]:
    """The paths in the README's first code block (the map), relative to its folder: ``net/http.py``."""
    block = readme.read_text().split("```", 2)[1]
    names, folder = set(), ""
    for line in block.splitlines():
        match = re.match(r"^(\s*)(\S+)", line)
        if not match or not re.fullmatch(r"[\w.]+/?", match[2]):
            continue
        name = match[2]
        if name.endswith("/"):
            folder = name
            names.add(name)
        elif name.endswith(".py") or name == "README.md":
            names.add((folder if match[1] else "") + name)
    return names


def _present(folder: pathlib.Path, prefix: str = "") -> set[str]:
    return {prefix + p.name for p in folder.iterdir() if p.suffix == ".py" and p.name != "__init__.py"}


@pytest.mark.parametrize("readme, want", [
    ("README.md", lambda: _present(STORAGE) | {"node/", "net/", "node/README.md"}
     | _present(STORAGE / "node", "node/") | _present(STORAGE / "net", "net/")),
    ("node/README.md", lambda: _present(STORAGE / "node")),
])
def test_the_storage_readmes_map_every_module(readme, want):
    assert _mapped(STORAGE / readme) == want()
