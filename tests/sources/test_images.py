"""The image-folder converter: bytes identical to the files, labels from the sorted class dirs."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image
from source_data import image_bytes, no_dataset_at

import chute
from chute.errors import ChuteError
from chute.sources import from_image_folder


def _make_folder(root, per_class: int = 5) -> dict[str, tuple[bytes, str]]:
    """``root/{cat,dog,zebra}/...``: JPEGs, PNGs, a nested dir and some non-image files."""
    expected = {}
    for c, name in enumerate(["dog", "cat", "zebra"]):  # created unsorted on purpose
        for i in range(per_class):
            fmt, ext = ("JPEG", "jpg") if i % 2 else ("PNG", "PNG")  # upper-case extension counts too
            sub = "nested/" if i == 3 else ""
            relative = f"{name}/{sub}img{i:02d}.{ext}"
            os.makedirs(os.path.dirname(os.path.join(root, relative)), exist_ok=True)
            data = image_bytes(fmt, seed=100 * c + i)
            with open(os.path.join(root, relative), "wb") as f:
                f.write(data)
            expected[relative] = (data, name)
    for junk in ["cat/notes.txt", "dog/labels.csv", "README.md"]:
        with open(os.path.join(root, junk), "w") as f:
            f.write("not an image")
    os.makedirs(os.path.join(root, ".cache"))  # hidden: not a class
    return expected


def test_image_bytes_labels_and_paths_round_trip(tmp_path):
    expected = _make_folder(tmp_path / "src")
    ds = from_image_folder(tmp_path / "src", tmp_path / "out", workers=0, progress=False)
    ds.verify()
    assert ds.metadata["class_names"] == ["cat", "dog", "zebra"]
    assert ds.schema["label"] == chute.Scalar("int64") and ds.schema["image"] == chute.Bytes()
    assert len(ds) == len(expected)
    rows = [ds[i] for i in range(len(ds))]
    assert [r["path"] for r in rows] == sorted(expected, key=lambda p: (p.split("/")[0], p))
    for row in rows:
        data, class_name = expected[row["path"]]
        assert row["image"] == data  # encoded bytes, exactly the file
        assert ds.metadata["class_names"][row["label"]] == class_name
    decoded = Image.open(io.BytesIO(rows[0]["image"]))
    assert decoded.size == (8, 6)


def test_workers_give_the_same_dataset(tmp_path):
    _make_folder(tmp_path / "src", per_class=30)
    a = from_image_folder(tmp_path / "src", tmp_path / "a", workers=0, progress=False)
    b = from_image_folder(tmp_path / "src", tmp_path / "b", workers=2, progress=False)
    b.verify()
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]


def test_skipped_files_are_counted_and_reported(tmp_path, capsys):
    _make_folder(tmp_path / "src")
    ds = from_image_folder(tmp_path / "src", tmp_path / "out", workers=0, progress=True)
    assert ds.metadata["source"]["skipped_files"] == 3
    err = capsys.readouterr().err
    assert "skipping 3 file(s)" in err
    assert "15 images" in err  # the final progress line


def test_a_folder_without_images_is_a_clear_error(tmp_path):
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.txt").write_text("x")
    with pytest.raises(ChuteError, match="found no images"):
        from_image_folder(tmp_path / "src", tmp_path / "out", workers=0, progress=False)
    assert no_dataset_at(tmp_path / "out")
    with pytest.raises(ChuteError, match="does not exist"):
        from_image_folder(tmp_path / "nowhere", tmp_path / "out", workers=0, progress=False)


def test_an_unreadable_image_mid_way_leaves_no_dataset(tmp_path):
    _make_folder(tmp_path / "src", per_class=20)
    (tmp_path / "src" / "dog" / "img05b.jpg").symlink_to(tmp_path / "gone.jpg")  # listed, unreadable
    with pytest.raises(ChuteError, match=r"dog/img05b\.jpg"):
        from_image_folder(tmp_path / "src", tmp_path / "out", workers=2, shard_size=500, progress=False)
    assert no_dataset_at(tmp_path / "out")


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    """torchvision's ImageFolder refuses it too: the empty class would take label 1 and shift "dog" to 2."""
    _make_folder(tmp_path / "src")
    (tmp_path / "src" / "cow").mkdir()  # sorts between cat and dog
    (tmp_path / "src" / "emu").mkdir()
    (tmp_path / "src" / "emu" / "notes.txt").write_text("not an image")  # no image: empty as a class
    with pytest.raises(ChuteError) as info:
        from_image_folder(tmp_path / "src", tmp_path / "out", workers=0, progress=False)
    assert str(info.value).startswith(
        f"class folder {tmp_path / 'src' / 'cow'} holds no images (.bmp .gif .jpeg .jpg .png .tif .tiff .webp) "
        "(and 1 more: emu); every class folder becomes a label, so an empty one would shift the labels of the "
        "classes after it: remove it or add its images"
    )
    assert not (tmp_path / "out").exists()


def test_the_parallel_planner_refuses_an_empty_class_folder_too(tmp_path):
    """``chute convert --ray`` plans through chute.sources.parts: the same folder checks as ``chute convert``."""
    from chute.sources.parts import plan

    _make_folder(tmp_path / "src")
    (tmp_path / "src" / "cow").mkdir()
    with pytest.raises(ChuteError, match=r"class folder .*cow holds no images"):
        plan(tmp_path / "src", "images")
