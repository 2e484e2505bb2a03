"""The Hugging Face converter: a Dataset object or a save_to_disk directory, values and order kept."""

from __future__ import annotations

import numpy as np
import pytest
from source_data import image_bytes

import chute
from chute.errors import ChuteError
from chute.sources import from_hf

datasets = pytest.importorskip("datasets")

N = 24


def _dataset():
    features = datasets.Features({
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=["cat", "dog", "emu"]),
        "text": datasets.Value("string"),
        "score": datasets.Value("float32"),
        "tokens": datasets.Sequence(datasets.Value("int32")),
        "box": datasets.Sequence(datasets.Value("float32"), length=4),
        "grid": datasets.Array2D((2, 3), "int16"),
        "info": {"source": datasets.Value("string"), "n": datasets.Value("int64")},
    })
    images = [image_bytes("PNG" if i % 2 else "JPEG", seed=i) for i in range(N)]
    data = {
        "image": [{"bytes": b, "path": None} for b in images],
        "label": [i % 3 for i in range(N)],
        "text": [f"sample {i}" for i in range(N)],
        "score": [i / 8 for i in range(N)],
        "tokens": [list(range(i % 5)) for i in range(N)],
        "box": [[i, i + 1, i + 2, i + 3] for i in range(N)],
        "grid": [np.full((2, 3), i, dtype=np.int16) for i in range(N)],
        "info": [{"source": "web", "n": i} for i in range(N)],
    }
    return datasets.Dataset.from_dict(data, features=features), images


def _check(ds: chute.Dataset, hf, images, order) -> None:
    ds.verify()
    assert len(ds) == len(order)
    s = ds.schema
    assert s["image"] == chute.Bytes() and s["label"] == chute.Scalar("int64") and s["text"] == chute.String()
    assert s["score"] == chute.Scalar("float32") and s["tokens"] == chute.Ragged("int32", 1)
    assert s["box"] == chute.Tensor("float32", (4,)) and s["grid"] == chute.Tensor("int16", (2, 3))
    # a dict feature is flattened: one column per field (nullable, as Arrow struct fields are)
    assert s["info.source"] == chute.Nullable(chute.String()) and s["info.n"] == chute.Nullable(chute.Scalar("int64"))
    assert ds.metadata["class_names"] == {"label": ["cat", "dog", "emu"]}
    assert ds.metadata["hf_features"]["image"]["_type"] == "Image"
    for row, i in enumerate(order):
        got = ds[row]
        assert got["image"] == images[i]
        assert got["label"] == i % 3 and got["text"] == f"sample {i}" and got["score"] == i / 8
        assert got["tokens"].tolist() == list(range(i % 5))
        assert got["box"].tolist() == [i, i + 1, i + 2, i + 3]
        assert got["grid"].tolist() == [[i] * 3] * 2
        assert got["info.source"] == "web" and int(got["info.n"]) == i


def test_in_memory_dataset(tmp_path):
    hf, images = _dataset()
    ds = from_hf(hf, tmp_path / "out", progress=False)
    _check(ds, hf, images, list(range(N)))


def test_saved_dataset_directory(tmp_path):
    hf, images = _dataset()
    hf.save_to_disk(str(tmp_path / "saved"))
    ds = from_hf(tmp_path / "saved", tmp_path / "out", progress=False)
    _check(ds, hf, images, list(range(N)))


def test_shuffled_and_selected_rows_keep_the_dataset_order(tmp_path):
    hf, images = _dataset()
    view = hf.shuffle(seed=3).select(range(10))
    order = [int(t.split()[1]) for t in view["text"]]
    assert order != sorted(order)
    ds = from_hf(view, tmp_path / "out", progress=False)
    _check(ds, hf, images, order)


def test_dataset_dict_needs_a_split_when_it_has_several(tmp_path):
    hf, _ = _dataset()
    dd = datasets.DatasetDict({"train": hf, "test": hf.select(range(3))})
    dd.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ChuteError, match=r"splits \['test', 'train'\].*split="):
        from_hf(tmp_path / "saved", tmp_path / "out", progress=False)
    ds = from_hf(tmp_path / "saved", tmp_path / "out", split="test", columns=["text"], progress=False)
    assert [ds[i]["text"] for i in range(len(ds))] == ["sample 0", "sample 1", "sample 2"]
    assert ds.metadata["source"]["split"] == "test"


def test_not_a_saved_dataset(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ChuteError, match="save_to_disk"):
        from_hf(tmp_path / "empty", tmp_path / "out", progress=False)
