"""Single-byte corruptions of a small dataset with every column kind, read in a child process.

Used by tests/format/test_corruption.py (a few hundred cases in CI) and by
benchmarks/fuzz_shards.py (as many as asked). A case flips one byte of one
shard file (XOR with a non-zero value), opens the dataset and reads every row,
in a shuffled batch and one by one. Its outcome is one of:

* ``exact``: every value read equals the uncorrupted dataset's;
* ``shard_error``: chute raised ``ShardError`` (the corruption was detected);
* ``wrong``: values were returned that differ from the original (silent corruption);
* ``error:<type>``: another exception escaped;
* ``crash`` / ``hang``: the reading process died, or gave no answer in time.

The reads run in a child process (``python -m tests.format.corruption``), so a
crash is observed rather than fatal: the parent restarts a child at the next case.
"""

from __future__ import annotations

import collections
import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
GOOD = ("exact", "shard_error")


def write_reference(root: str | os.PathLike, samples: int = 48) -> None:
    """A small dataset of three shards with a column of every kind chute stores."""
    import chute
    from chute.format.schema import Bytes, Json, Map, Ragged, Scalar, String, Tensor

    rng = np.random.default_rng(7)
    schema = {
        "tensor": Tensor("float32", (3, 4)),
        "scalar": Scalar("int64"),
        "flag": Scalar("bool"),
        "text": String(),
        "blob": Bytes(),
        "tags": Map("string"),
        "extra": Map("json"),
        "meta": Json(),
        "ragged": Ragged("float32", 1),
        "grid": Ragged("int16", 2),
    }

    def sample(i: int) -> dict[str, Any]:
        return {
            "tensor": rng.standard_normal((3, 4)).astype(np.float32),
            "scalar": int(rng.integers(-(2**40), 2**40)),
            "flag": bool(i % 3),
            "text": f"row {i} " + "é" * (i % 4) + "x" * int(rng.integers(0, 9)),
            "blob": rng.bytes(int(rng.integers(0, 12))),
            "tags": {f"k{j}": f"v{i}-{j}" for j in range(i % 4)},
            "extra": {"n": i, "list": [i, i + 1]} if i % 2 else {},
            "meta": {"id": i, "name": f"s{i}", "score": i / 7},
            "ragged": rng.standard_normal(int(rng.integers(0, 6))).astype(np.float32),
            "grid": rng.integers(-100, 100, (int(rng.integers(1, 3)), int(rng.integers(0, 4)))).astype(np.int16),
        }

    chute.write((sample(i) for i in range(samples)), root, schema=schema, shard_size=1500)


def read_everything(root: str, verify: bool = True) -> list[dict[str, Any]]:
    """Every row of the dataset at ``root``: from one shuffled ``get_batch`` and from ``ds[i]``."""
    import chute

    ds = chute.open(root, verify=verify)
    try:
        order = np.random.default_rng(0).permutation(len(ds))
        batch = ds.get_batch(order)
        rows: list[dict[str, Any]] = [{} for _ in range(len(ds))]
        for name, values in batch.items():
            for position, row in enumerate(order.tolist()):
                rows[row][name] = values[position]
        singles = [ds[i] for i in range(len(ds))]
        return [{**row, **{f"single.{k}": v for k, v in single.items()}} for row, single in zip(rows, singles)]
    finally:
        ds.close()


def same(a: Any, b: Any) -> bool:
    """Exact equality of values read from chute (tensors, lists, dicts, bytes, numbers)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def make_cases(root: str, count: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """``count`` corruptions ``(shard file, byte offset, xor mask)`` spread over the shards' bytes."""
    import chute

    shards = [(s.file, s.bytes) for s in chute.open(root).shards]
    total = sum(size for _, size in shards)
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        at = rng.randrange(total)
        for file, size in shards:
            if at < size:
                cases.append((file, at, rng.randrange(1, 256)))
                break
            at -= size
    return cases


def _outcome(pristine: str, scratch: str, case: tuple[str, int, int], expected: list[dict], verify: bool) -> str:
    import chute

    file, offset, mask = case
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(pristine, scratch)
    with open(os.path.join(scratch, file), "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))
    try:
        got = read_everything(scratch, verify)
    except chute.ShardError:
        return "shard_error"
    except Exception as exc:  # noqa: BLE001 - what escaped is the finding
        return f"error:{type(exc).__name__}:{str(exc)[:200]}"
    return "exact" if same(got, expected) else "wrong"


def child(pristine: str, cases_file: str, verify: str) -> None:
    """The reading process: one line per case, ``<index> <outcome>``, after a ``start <index>`` line."""
    expected = read_everything(pristine)
    with open(cases_file, encoding="utf-8") as f:
        cases = json.load(f)
    scratch = tempfile.mkdtemp(prefix="chute-corrupt-")
    try:
        for k, case in cases:
            print(f"start {k}", flush=True)
            print(f"{k} {_outcome(pristine, scratch, tuple(case), expected, verify == 'verify')}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fuzz(pristine: str, cases: list[tuple[str, int, int]], *, verify: bool = True, case_timeout: float = 60.0,
         start_timeout: float = 180.0) -> dict[str, Any]:
    """Run ``cases`` in child processes; the outcome of each, and their counts."""
    outcomes: dict[int, str] = {}
    pending = list(enumerate(cases))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    cases_file = os.path.join(tempfile.mkdtemp(prefix="chute-cases-"), "cases.json")
    while pending:
        with open(cases_file, "w", encoding="utf-8") as f:
            json.dump(pending, f)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.format.corruption", pristine, cases_file, "verify" if verify else "structure"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        current, deadline = None, time.monotonic() + start_timeout
        try:
            while True:
                with selectors.DefaultSelector() as selector:  # not select(): the suite may hold descriptors past 1024
                    selector.register(proc.stdout, selectors.EVENT_READ)
                    ready = selector.select(max(0.0, deadline - time.monotonic()))
                if not ready:  # no answer in time: the case hangs (or the child never started)
                    if current is None:
                        raise RuntimeError(f"the corruption child did not start: {proc.stderr.read() if proc.poll() is not None else ''}")
                    outcomes[current] = "hang"
                    break
                line = proc.stdout.readline()
                if not line:  # the child died
                    if current is not None and current not in outcomes:
                        outcomes[current] = "crash"
                    elif current is None:
                        raise RuntimeError(f"the corruption child failed: {proc.stderr.read()}")
                    break
                word, _, rest = line.strip().partition(" ")
                if word == "start":
                    current, deadline = int(rest), time.monotonic() + case_timeout
                else:
                    outcomes[int(word)] = rest
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
            proc.stdout.close()
            proc.stderr.close()
        pending = [(k, case) for k, case in pending if k not in outcomes]
    shutil.rmtree(os.path.dirname(cases_file), ignore_errors=True)
    kinds = collections.Counter(o if not o.startswith("error:") else ":".join(o.split(":")[:2]) for o in outcomes.values())
    return {"outcomes": outcomes, "counts": dict(kinds), "bad": {k: (cases[k], o) for k, o in outcomes.items() if o not in GOOD}}


if __name__ == "__main__":
    child(*sys.argv[1:4])
