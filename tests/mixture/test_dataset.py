"""chute.mix's dataset side: a Mixture reads its sources' rows as one dataset; schemas must agree."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import chute
from chute.mixture import Mixture, mix


def _write(path, start: int, n: int, extra: bool = False, shard_size: int = 2000):
    samples = []
    for i in range(start, start + n):
        s = {"x": np.full((2, 3), i % 251, np.uint8), "label": i, "name": f"row-{i}"}
        if extra:
            s["extra"] = i * 0.5
        samples.append(s)
    return chute.write(samples, path, shard_size=shard_size)


@pytest.fixture
def two(tmp_path):
    a = _write(tmp_path / "a", 0, 100)
    b = _write(tmp_path / "b", 1000, 300)
    yield a, b
    a.close()
    b.close()


def test_the_mixture_reads_the_sources_rows_one_after_the_other(two, tmp_path):
    a, b = two
    m = mix({"a": tmp_path / "a", "b": b}, {"a": 0.75, "b": 0.25})
    assert len(m) == 400 and m.schema == a.schema
    assert [s.file for s in m.shards] == [s.file for s in a.shards] + [s.file for s in b.shards]
    assert m[5]["label"] == 5 and m[100]["label"] == 1000 and m[-1]["label"] == 1299
    shard, row = m.locate(150)
    assert m.shard_path(shard) == b.shard_path(b.locate(50)[0]) and row == b.locate(50)[1]
    assert int(m.offsets[-1]) == 400
    m.close()


def test_get_batch_fills_each_sources_slice_of_out(two):
    a, b = two
    m = mix({"a": a, "b": b}, {"a": 1, "b": 1})
    order = m.order(batch_size=16, shuffle=True, seed=3)
    rows = order.batch(0, 0)
    out = {"x": torch.empty((16, 2, 3), dtype=torch.uint8), "label": torch.empty(16, dtype=torch.int64)}
    got = m.get_batch(rows, out=out)
    assert got["x"] is out["x"] and got["label"] is out["label"]
    expected = [m[int(r)] for r in rows]
    assert got["label"].tolist() == [e["label"] for e in expected]
    assert got["name"] == [e["name"] for e in expected]
    torch.testing.assert_close(got["x"], torch.stack([e["x"] for e in expected]))


def test_get_batch_in_any_order(two):
    a, b = two
    m = mix({"a": a, "b": b}, {"a": 1, "b": 1})
    rows = np.array([399, 0, 150, 3, 101, 99])
    out = {"x": torch.empty((6, 2, 3), dtype=torch.uint8), "label": torch.empty(6, dtype=torch.int64)}
    got = m.get_batch(rows, out=out)
    assert got["label"] is out["label"]
    assert got["label"].tolist() == [1299, 0, 1050, 3, 1001, 99]
    assert got["name"] == [f"row-{i}" for i in [1299, 0, 1050, 3, 1001, 99]]
    assert m.get_batch(np.array([], dtype=np.int64))["label"].shape == (0,)
    with pytest.raises(IndexError, match="row 400 is out of range"):
        m.get_batch([400])


def test_different_schemas_are_refused_naming_the_columns(tmp_path):
    a = _write(tmp_path / "a", 0, 10)
    b = _write(tmp_path / "b", 0, 10, extra=True)
    with pytest.raises(chute.SchemaError, match=r"\['extra'\] only in 'b'.*columns=\[\.\.\.\]"):
        mix({"a": a, "b": b}, {"a": 1, "b": 1})
    m = mix({"a": a, "b": b}, {"a": 1, "b": 1}, columns=["label", "x"])
    assert m.schema.names == ["label", "x"]
    assert set(m.get_batch([0, 15])) == {"label", "x"} and set(m[15]) == {"label", "x"}
    with pytest.raises(chute.SchemaError, match="'extra' selected with columns= is not in dataset"):
        mix({"a": a, "b": b}, {"a": 1, "b": 1}, columns=["extra"])
    c = chute.write(({"x": np.zeros(3, np.float32), "label": i, "name": ""} for i in range(5)), tmp_path / "c")
    with pytest.raises(chute.SchemaError, match="column 'x' is uint8 tensor of shape \\(2, 3\\) in 'a' but float32 tensor"):
        mix({"a": a, "c": c}, {"a": 1, "c": 1})
    for ds in (a, b, c):
        ds.close()


def test_weights_must_name_every_dataset(two):
    a, b = two
    with pytest.raises(ValueError, match="one weight per dataset"):
        mix({"a": a, "b": b}, {"a": 1})
    with pytest.raises(ValueError, match="positive finite"):
        mix({"a": a, "b": b}, {"a": 1, "b": -2})


def test_a_mixture_pickles_for_worker_processes(two):
    a, b = two
    m = mix({"a": a, "b": b}, {"a": 2, "b": 1}, epoch_rows=1000)
    again = pickle.loads(pickle.dumps(m))
    assert isinstance(again, Mixture) and again.weights == {"a": 2, "b": 1} and again.order(8).num_rows == 1000
    assert again.get_batch([0, 399])["label"].tolist() == [0, 1299]
    again.close()


def test_remote_sources_read_through_their_cache(tmp_path, two):
    from tests.servers import FaultyHTTPServer

    root = tmp_path / "www"
    root.mkdir()
    _write(root / "web", 5000, 50)
    with FaultyHTTPServer(root) as server:
        m = mix({"local": tmp_path / "a", "web": f"{server.url}/web"}, {"local": 1, "web": 1}, cache_dir=tmp_path / "cache")
        assert m.cache is None
        assert m.get_batch([0, 100, 149])["label"].tolist() == [0, 5000, 5049]
        m.close()


def test_chute_mix_is_the_function_and_import_chute_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, chute; assert 'chute.mixture' not in sys.modules and 'ray' not in sys.modules; "
        "import chute.mixture; assert callable(chute.mix) and chute.mix.__module__ == 'chute.mixture.dataset'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
