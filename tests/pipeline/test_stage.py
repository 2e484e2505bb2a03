"""The stage protocol: the README's worked example runs as written; Map keeps the order, raises at the batch, resumes exactly."""

from __future__ import annotations

import pathlib
import re
import threading

import numpy as np
import pytest

import chute
from chute.pipeline.stage import LoaderStage, Map

README = pathlib.Path(__file__).resolve().parents[2] / "chute" / "pipeline" / "README.md"


def test_the_readme_example_runs():
    text = README.read_text()
    block = re.search(r"<!-- stage example -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, "chute/pipeline/README.md lost its stage example"
    exec(compile(block.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert not [t.name for t in threading.enumerate() if t.name.startswith("chute-")]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return chute.write(({"x": np.full(2, i, np.int64), "id": i} for i in range(64)), tmp_path_factory.mktemp("stage") / "ds")


def ids(batches):
    return [b["id"].tolist() for b in batches]


def test_map_keeps_the_order_and_resumes_with_the_next_batch(ds):
    expected = ids(chute.Loader(ds, 4, shuffle=True, seed=5))
    release = threading.Event()

    def slow_first(batch):  # the first batch finishes last: the order must hold anyway
        if batch["id"].tolist() == expected[0]:
            release.wait(10)
        else:
            release.set()
        return batch

    with Map(LoaderStage(chute.Loader(ds, 4, shuffle=True, seed=5)), slow_first, threads=3) as stages:
        got = [next(stages)["id"].tolist() for _ in range(5)]
        saved = stages.state()
    assert got == expected[:5]
    with Map(LoaderStage(chute.Loader(ds, 4, shuffle=True, seed=5)), lambda b: b, threads=2) as stages:
        stages.reset(saved)
        assert ids(stages) == expected[5:]  # batches computed ahead were not skipped


def test_map_raises_the_functions_error_at_its_batch(ds):
    seen = []

    def fail_third(batch):
        seen.append(1)
        if len(seen) == 3:
            raise KeyError("third")
        return batch

    with Map(LoaderStage(chute.Loader(ds, 4)), fail_third, threads=1) as stages:
        next(stages), next(stages)
        with pytest.raises(KeyError, match="third"):
            next(stages)


def test_map_refuses_no_threads(ds):
    with pytest.raises(ValueError, match="at least one thread"):
        Map(LoaderStage(chute.Loader(ds, 4)), lambda b: b, threads=0)


def test_a_stage_pipeline_leaves_no_thread_after_close(ds):
    stages = Map(LoaderStage(chute.Loader(ds, 4)), lambda b: b, threads=2)
    next(stages)
    stages.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("chute-")]
