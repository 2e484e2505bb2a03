"""Public names resolved on first use (PEP 562): one ``__getattr__``/``__dir__`` pair for every package that re-exports lazily.

A package lists its public names in a table, ``{name: "module"}`` or
``{name: "module:attribute"}`` where the attribute is named otherwise there;
a name whose module is the package's own submodule of that name (``chute.images``)
is the module itself. The first lookup imports the module and stores the value
in the package's globals, so later lookups never come back here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, table: Mapping[str, str], namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose globals are ``namespace``, resolving the names of ``table``."""

    def __getattr__(name: str) -> Any:
        """Import the module behind a public name the first time the name is used."""
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = target.partition(":")
        imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, attribute or name)
        namespace[name] = value  # later lookups do not come back here
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
