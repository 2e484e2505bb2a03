"""``import chute`` stays light: the public names load their modules on first use."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "pyarrow", "fsspec")


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON value, returned here."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_import_chute_loads_neither_torch_pyarrow_nor_fsspec():
    loaded = _python(f"import json, sys, chute; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert loaded == []


def test_every_public_name_resolves_and_from_import_works():
    out = _python(
        "import json, chute\n"
        "from chute import Loader, open, write, ChuteError\n"
        "names = {n: type(getattr(chute, n)).__name__ for n in chute.__all__}\n"
        "print(json.dumps({'names': names, 'dir': sorted(set(chute.__all__) - set(dir(chute))),\n"
        "                  'open': open.__module__, 'loader': Loader.__module__}))"
    )
    assert set(out["names"]) >= {"Loader", "TorchIterable", "open", "write", "Dataset", "observe", "to_device", "ChuteError"}
    assert out["dir"] == []  # dir(chute) lists every public name
    assert out["open"] == "chute.storage.open" and out["loader"] == "chute.pipeline.loader"


def test_chute_observe_is_one_callable_package():
    out = _python(
        "import json, sys, chute\n"
        "f = chute.observe\n"
        "chute.Loader  # imports chute.observe.* underneath\n"
        "from chute.observe.report import Report\n"
        "import chute.tools.bench\n"
        "observed = chute.observe([1, 2])\n"
        "print(json.dumps([chute.observe is f is sys.modules['chute.observe'], type(observed).__name__, list(observed)]))"
    )
    assert out == [True, "Observed", [1, 2]]


def test_an_unknown_name_is_an_attribute_error():
    out = _python(
        "import json, chute\n"
        "try:\n    chute.Lodaer\nexcept AttributeError as exc:\n    print(json.dumps(str(exc)))"
    )
    assert out == "module 'chute' has no attribute 'Lodaer'"


def test_help_and_version_do_not_import_torch():
    for argv in (["--help"], ["--version"], ["convert", "--help"], ["bench", "--help"]):
        loaded = _python(
            "import json, sys, contextlib, io\n"
            "from chute.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
        )
        assert loaded == [], argv


# What only a remote dataset needs: the network clients and chute's modules that drive them.
REMOTE_STACK = ("asyncio", "ssl", "http.client", "urllib3", "fsspec", "botocore", "boto3", "aiohttp")
REMOTE_CHUTE = ("chute.storage.net", "chute.storage.node.cache", "chute.storage.node.fetcher", "chute.storage.node.share")
# chute's modules a local Loader's first batch does without (made lazy): the report builder and the loop wrapper
# (loaded by ``loader.report()`` and ``chute.observe(...)``), the dataset writer and its schema inference.
NOT_ON_THE_PATH = ("chute.observe.report", "chute.observe.consumer", "chute.format.writer", "chute.format.infer",
                   "chute.storage.write")


def test_a_local_loader_imports_nothing_of_the_remote_stack(tmp_path):
    """A local dataset's first batch imports none of it: chute's remote modules stay out, and of the network
    stack only what torch itself imports is there (each module is recorded with the module that imported it).
    Nor does it import chute's modules that are not on its path (NOT_ON_THE_PATH); ``loader.report()`` then
    loads the report builder."""
    import numpy as np

    import chute

    chute.write(({"x": np.full(3, i, np.uint8), "label": i} for i in range(40)), tmp_path / "ds")
    out = _python(
        "import json, sys\n"
        f"WATCH = {REMOTE_STACK!r}\n"
        "importers = {}\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name in WATCH and name not in importers:\n"
        "            f = sys._getframe(1)\n"
        "            while f is not None and f.f_globals.get('__name__', '').startswith(('importlib', '_frozen_importlib')):\n"
        "                f = f.f_back\n"
        "            importers[name] = f.f_globals.get('__name__', '?') if f is not None else '?'\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import chute\n"
        f"loader = chute.Loader(chute.open({str(tmp_path / 'ds')!r}), 8, shuffle=True, seed=0)\n"
        "batch = next(iter(loader))\n"
        f"lazy = sorted(m for m in {NOT_ON_THE_PATH!r} if m in sys.modules)\n"
        "report = loader.report().source\n"
        "loader.close()\n"
        f"remote = sorted(m for m in sys.modules if m.startswith({REMOTE_CHUTE!r}))\n"
        "by_chute = sorted(n for n, who in importers.items() if who.split('.')[0] == 'chute')\n"
        "print(json.dumps({'rows': batch['label'].tolist(), 'remote': remote, 'by_chute': by_chute, 'lazy': lazy,\n"
        "                  'report': [report, 'chute.observe.report' in sys.modules],\n"
        "                  'third': sorted(m for m in ('urllib3', 'fsspec', 'botocore', 'boto3', 'aiohttp') if m in sys.modules)}))"
    )
    assert sorted(out["rows"]) == sorted(set(out["rows"])) and len(out["rows"]) == 8
    assert out["remote"] == [] and out["by_chute"] == [] and out["third"] == []
    assert out["lazy"] == [] and out["report"] == ["chute.Loader", True]


def test_chute_format_names_are_lazy_through_the_same_helper():
    """``chute.format`` resolves its names as ``chute`` does (chute/_lazy.py): a reader never imports the writer."""
    out = _python(
        "import json, sys, chute.format as f\n"
        "before = 'chute.format.writer' in sys.modules\n"
        "listed = sorted(set(f.__all__) - set(dir(f)))\n"
        "schema = f.Schema.__module__\n"
        "try:\n    f.Wirter\nexcept AttributeError as exc:\n    error = str(exc)\n"
        "print(json.dumps([before, listed, schema, 'chute.format.writer' in sys.modules, f.Writer.__module__, error]))"
    )
    assert out == [False, [], "chute.format.schema", False, "chute.format.writer", "module 'chute.format' has no attribute 'Wirter'"]


def test_chute_pipeline_names_are_lazy_through_the_same_helper():
    """``chute.pipeline`` resolves its names as ``chute`` does: ``chute.Loader`` does not load ``TorchIterable``'s module."""
    out = _python(
        "import json, sys, chute.pipeline as p\n"
        "loader = p.Loader.__module__\n"
        "before = 'chute.pipeline.torch_iterable' in sys.modules\n"
        "listed = sorted(set(p.__all__) - set(dir(p)))\n"
        "print(json.dumps([loader, before, listed, p.TorchIterable.__module__, p.Workers.__module__]))"
    )
    assert out == ["chute.pipeline.loader", False, [], "chute.pipeline.torch_iterable", "chute.pipeline.config"]


# chute's modules a local Loader's first batch may import (the modules its path runs). A module that joins the path
# is added here on purpose, after checking that the first batch calls into it (docs/benchmarks.md, "Imports of a
# local dataset's first Loader"): the import is paid by every program's first Loader.
ON_THE_PATH = {
    "chute", "chute._arena", "chute._bounded", "chute._channel", "chute._lazy", "chute._native", "chute._paths", "chute._sched",
    "chute._sizes", "chute._state", "chute._version", "chute.errors",
    "chute.format", "chute.format.columns", "chute.format.manifest", "chute.format.reader", "chute.format.schema",
    "chute.format.validate",
    "chute.observe", "chute.observe.autotune", "chute.observe.counters", "chute.observe.hooks", "chute.observe.inflight",
    "chute.observe.passes", "chute.observe.watchdog",
    "chute.order",
    "chute.pipeline", "chute.pipeline.build", "chute.pipeline.chain", "chute.pipeline.collate", "chute.pipeline.config",
    "chute.pipeline.gather", "chute.pipeline.indices", "chute.pipeline.kept", "chute.pipeline.lifecycle", "chute.pipeline.loader",
    "chute.pipeline.native_gather",
    "chute.pipeline.randomness", "chute.pipeline.relay", "chute.pipeline.run", "chute.pipeline.spec",
    "chute.pipeline.stage", "chute.pipeline.task", "chute.pipeline.threads", "chute.pipeline.transform",
    "chute.storage", "chute.storage.open",
}
# Of the packages outside the standard library, chute's path imports only pyarrow (the shards' Arrow IPC reader) and
# xxhash (the shards' checksum, on a machine that has not verified them yet).
THIRD_PARTY_ON_THE_PATH = {"pyarrow", "xxhash"}

# The first batch of a local dataset in a fresh process that imported numpy and torch first: each module imported
# after that is recorded with the chute module (or '-') whose code imported it; the collections Python ran meanwhile
# are counted per generation, after a gc.collect() (import torch leaves its objects one young collection short of
# a full one, which whoever allocates next pays: not chute's own).
_FIRST_BATCH = """
import gc, json, sys
import numpy, torch
importers = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name not in sys.modules and name not in importers:
            f = sys._getframe(1)
            while f is not None and f.f_globals.get('__name__', '').startswith(('importlib', '_frozen_importlib')):
                f = f.f_back
            who = f.f_globals.get('__name__', '') if f is not None else ''
            importers[name] = who if who.split('.')[0] == 'chute' else '-'
        return None
sys.meta_path.insert(0, Spy())
gc.collect()
collections = [0, 0, 0]
gc.callbacks.append(lambda phase, info: collections.__setitem__(info['generation'], collections[info['generation']] + (phase == 'start')))
import chute
loader = chute.Loader(PATH, 8, shuffle=True, seed=0)
rows = next(iter(loader))['label'].tolist()
del gc.callbacks[-1]
loader.close()
print(json.dumps({'rows': rows, 'importers': importers, 'collections': collections}))
"""


def test_a_local_loaders_first_batch_imports_only_its_path(tmp_path):
    """The modules a local dataset's first batch imports, beyond numpy and torch: chute's own are those of ON_THE_PATH,
    and what chute's code imports from outside chute is the standard library, pyarrow and xxhash."""
    import numpy as np

    import chute

    chute.write(({"x": np.full(3, i, np.uint8), "label": i} for i in range(40)), tmp_path / "ds")
    out = _python(_FIRST_BATCH.replace("PATH", repr(str(tmp_path / "ds"))))
    assert sorted(out["rows"]) == sorted(set(out["rows"])) and len(out["rows"]) == 8
    own = {name for name in out["importers"] if name.split(".")[0] == "chute"}
    assert sorted(own - ON_THE_PATH) == [], "new on a local Loader's path: lazy, or add to ON_THE_PATH on purpose"
    outside = {name.split(".")[0] for name, who in out["importers"].items() if who != "-" and name.split(".")[0] != "chute"}
    assert sorted(outside - set(sys.stdlib_module_names) - THIRD_PARTY_ON_THE_PATH) == []
    assert "sysconfig" not in out["importers"]  # the hang watchdog's stack filter computes it on a stall's first report


def test_a_local_loaders_first_batch_runs_no_full_collection_of_its_own(tmp_path):
    """After a gc.collect(), importing chute and a local dataset's first batch allocate too little for Python to run
    a full (generation 2) collection: the one a training script sees after ``import torch`` is torch's."""
    import numpy as np

    import chute

    chute.write(({"x": np.full(3, i, np.uint8), "label": i} for i in range(40)), tmp_path / "ds")
    out = _python(_FIRST_BATCH.replace("PATH", repr(str(tmp_path / "ds"))))
    assert len(out["rows"]) == 8
    assert out["collections"][2] == 0, out["collections"]  # (young, middle, full): 14, 1, 0 on W2 in the benchmark
