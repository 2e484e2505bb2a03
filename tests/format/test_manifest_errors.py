"""A damaged manifest is a one-line chute error, never a raw OSError or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import chute


def _write(root):
    return chute.write(({"x": np.full(4, i, np.float32), "y": i} for i in range(20)), root, shard_size=200)


def _edit(root, change):
    path = os.path.join(root, "manifest.json")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    change(manifest)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("name", ["{first}/inner.arrow", "x" * 300 + ".arrow"])
def test_a_shard_path_the_file_system_refuses_is_a_shard_error(tmp_path, name):
    """A path through a file (ENOTDIR) or a name too long (ENAMETOOLONG) is an OSError, not a
    missing file: it must still be a chute error naming the shard."""
    ds = _write(tmp_path / "ds")
    bad = name.format(first=ds.shards[0].file)
    _edit(str(tmp_path / "ds"), lambda m: m["shards"][1].update(file=bad))
    with pytest.raises(chute.ChuteError, match="inner.arrow|xxxx"):
        chute.open(tmp_path / "ds")


def test_chute_inspect_of_a_damaged_manifest_prints_one_line(tmp_path):
    _write(tmp_path / "ds")
    _edit(str(tmp_path / "ds"), lambda m: m.update(arrow_schema="QUFBQUFBQUE="))
    done = subprocess.run([sys.executable, "-m", "chute", "inspect", str(tmp_path / "ds")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "arrow_schema" in err and "manifest.json" in err
