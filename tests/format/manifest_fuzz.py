"""Fuzzed manifests: hypothesis strategies shared by the test and benchmarks/fuzz_manifest.py.

A case takes a valid manifest and changes some of its fields (a value replaced by
any JSON value, a boundary integer or a near-valid one, a field removed), or
replaces the whole text; then it opens the dataset and, if that works, reads
what a user would: its length, ``verify()``, its first and last rows. Only
chute errors may come out.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from hypothesis import strategies as st

import chute

INTEGERS = st.sampled_from([0, 1, -1, 7, 2**31, 2**53, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 10**30])
FLOATS = st.sampled_from([0.0, 7.0, -1.5, 1e400, float("nan")])
SCALARS = st.one_of(st.none(), st.booleans(), INTEGERS, st.integers(), FLOATS, st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=10)

#: Where a change can land: top-level fields, a shard entry's, a column entry's.
TOP = ["format", "format_version", "created_by", "rows", "columns", "arrow_schema", "shards", "metadata"]
SHARD = ["file", "rows", "bytes", "checksum", "compression", "stored_bytes"]
COLUMN = ["name", "kind", "dtype", "shape", "ndim", "value"]


def write_base(root: str) -> dict[str, Any]:
    """A small dataset of several column kinds and shards; its manifest as a dict."""
    rng = np.random.default_rng(0)
    samples = ({"image": rng.integers(0, 255, (2, 3), dtype=np.uint8), "label": i, "name": f"n{i}",
                "tags": {"a": str(i)}, "seq": np.arange(i % 4, dtype=np.int32)} for i in range(24))
    chute.write(samples, root, shard_size=300)
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


@st.composite
def changes(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """Manifest text: ``base`` with one to four fields changed, or other text altogether."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.text(max_size=200), JSON.map(json.dumps)))
    data = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["top", "shard", "column"]))
        if where == "top":
            target, key = data, draw(st.sampled_from(TOP))
        elif where == "shard" and isinstance(data.get("shards"), list) and data["shards"]:
            entry = draw(st.integers(0, len(data["shards"]) - 1))
            target, key = data["shards"][entry], draw(st.sampled_from(SHARD))
        elif where == "column" and isinstance(data.get("columns"), list) and data["columns"]:
            entry = draw(st.integers(0, len(data["columns"]) - 1))
            target, key = data["columns"][entry], draw(st.sampled_from(COLUMN))
        else:
            continue
        if not isinstance(target, dict):
            continue
        if draw(st.integers(0, 5)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(JSON)
    return json.dumps(data, allow_nan=True)


def open_and_read(root: str, text: str) -> None:
    """Write ``text`` as the manifest at ``root``, open the dataset and read it; raises what chute raises."""
    with open(os.path.join(root, "manifest.json"), "w", encoding="utf-8") as f:
        f.write(text)
    ds = chute.open(root)
    try:
        n = len(ds)
        ds.verify()
        if n:
            ds[0]
            ds[n - 1]
            ds.get_batch([n - 1, 0])
    finally:
        ds.close()
