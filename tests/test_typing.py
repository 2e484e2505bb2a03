"""chute/__init__.py names every public name twice: in _EXPORTS (resolved lazily at run time) and in
an ``if TYPE_CHECKING:`` block (what type checkers see). The two must agree."""

from __future__ import annotations

import ast
import os

import chute

INIT = os.path.join(os.path.dirname(chute.__file__), "__init__.py")


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(open(INIT).read())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            module = node.module if node.module != "chute" else f"chute.{alias.name}"
            names[alias.asname or alias.name] = module if alias.name == alias.asname or node.module == "chute" else f"{module}:{alias.name}"
    return names


def test_type_checkers_see_every_public_name_from_the_module_that_defines_it():
    exports = dict(chute._EXPORTS)
    seen = _type_checking_imports()
    assert sorted(seen) == sorted(exports)
    for name, target in exports.items():
        module, _, attribute = target.partition(":")
        expected = module if not attribute else f"{module}:{attribute}"
        got = seen[name]
        assert got == expected or got == f"{module}:{name}" or got == module, (name, got, expected)
