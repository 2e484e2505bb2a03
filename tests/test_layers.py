"""chute's packages form layers: a module imports only from its own layer or below, and no packages import each other.

Every ``import`` and ``from ... import`` of every module counts, also inside
functions (a lazy import still ties the packages together), and so does every
``importlib.import_module("chute....")`` and every public name used as
``chute.<name>`` (resolved to the module that defines it). The layers, lowest
first, are :data:`LAYERS`; two packages in one layer may import each other only
one way.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import chute

ROOT = pathlib.Path(__file__).resolve().parent.parent / "chute"

#: Lowest first. ``_x`` are top-level modules (``chute/_x.py``); a package is its folder.
LAYERS: list[set[str]] = [
    {"errors", "_lazy", "_sizes", "_bounded", "_paths", "_native", "_jpeg", "_channel", "_arena", "_version", "__version__", "_deprecation", "_state", "_sched"},  # leaves: no chute import at all
    {"order", "observe"},  # pure order; measurement, watchdog, hooks (every layer may report to them)
    {"format"},  # shards: schema, writer, reader
    {"storage"},  # where shards come from: local, remote through the node cache, progressive
    {"images", "mixture"},  # codecs and views over datasets
    {"sources", "ray"},  # converters from other layouts, Ray Data
    {"tokens"},  # token datasets: the writer, sequence views, text conversion (through sources and ray)
    {"device"},  # pinned ring + side stream, usable around any iterable
    {"pipeline"},  # the Loader and its stages
    {"tools", "demo"},  # what the command line runs: bench, tune, doctor, demo
    {"cli", "__main__", "chute"},  # the command line and the public names (chute/__init__.py)
]

#: Imports that break the rule, each a deprecated path (CHANGELOG.md) kept for one minor version:
#: (importing package, imported package) -> the chute version that removes it. The test fails once
#: chute reaches that version with the import still there. Nothing else may be added here.
KNOWN: dict[tuple[str, str], str] = {
    # sources/dispatch.py: chute.sources.convert(ray=), deprecated for chute.ray.convert_on_ray
    ("sources", "ray"): "0.2",
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "chute"


def _layer(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"chute/{package} is in no layer of tests/test_layers.py: add it to LAYERS")


def imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> where ("file:line"), for every import between two packages."""
    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "chute":
                targets = [f"chute.{a.name}" for a in node.names] if node.module == "chute" else [node.module]
            elif isinstance(node, ast.Import):
                # ``import chute`` loads nothing (its names are lazy): what counts is each ``chute.<name>`` used
                targets = [a.name for a in node.names if a.name.split(".")[0] == "chute" and a.name != "chute"]
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                and node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("chute.")
            ):
                targets = [str(node.args[0].value)]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "chute":
                targets = [chute._EXPORTS.get(node.attr, f"chute.{node.attr}").partition(":")[0]]
            else:
                continue
            for target in targets:
                a, b = _package(module), _package(target)
                if a != b:
                    found[a, b].append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return found


def test_every_package_is_in_a_layer():
    for a, b in imports():
        _layer(a), _layer(b)


def test_no_module_imports_a_higher_layer():
    upward = {
        (a, b): where for (a, b), where in imports().items()
        if _layer(b) > _layer(a) and (a, b) not in KNOWN
    }
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(
        f"  {a} -> {b}: {', '.join(where)}" for (a, b), where in sorted(upward.items())
    )


def test_no_two_packages_import_each_other():
    edges = imports()
    cycles = sorted(
        (a, b) for (a, b) in edges
        if a < b and (b, a) in edges and (a, b) not in KNOWN and (b, a) not in KNOWN
    )
    assert not cycles, "packages that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in cycles)


def test_the_known_exceptions_are_still_there():
    """An exception that was fixed must leave KNOWN (so the list only shrinks)."""
    edges = imports()
    assert not [pair for pair in KNOWN if pair not in edges], "fixed: remove from KNOWN in tests/test_layers.py"


def test_a_deprecated_path_goes_in_the_version_that_removes_it():
    version = tuple(int(part) for part in chute.__version__.split(".")[:2])
    due = [f"{a} -> {b} (due in {v})" for (a, b), v in KNOWN.items() if version >= tuple(int(p) for p in v.split("."))]
    assert not due, "remove the deprecated path and its KNOWN entry: " + ", ".join(due)


#: Inside chute/storage, lowest first (chute/storage/README.md): the network clients know nothing of
#: the node cache, and neither knows the top-level modules that open and write datasets.
STORAGE_LAYERS: list[set[str]] = [{"net"}, {"node"}, {"open", "write", "upload", "storage"}]


def test_storage_network_clients_sit_below_the_node_cache():
    found: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    storage = ROOT / "storage"
    for path in sorted(storage.rglob("*.py")):
        part = path.relative_to(storage).parts[0].removesuffix(".py").replace("__init__", "storage")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("chute.storage"):
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "chute.storage" else [node.module]
                for name in names:
                    target = (name.split(".") + ["storage"])[2]
                    found[part, target].append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    rank = {member: i for i, layer in enumerate(STORAGE_LAYERS) for member in layer}
    upward = {pair: where for pair, where in found.items() if rank[pair[1]] > rank[pair[0]]}
    assert not upward, "storage imports upward:\n" + "\n".join(f"  {a} -> {b}: {', '.join(w)}" for (a, b), w in sorted(upward.items()))
