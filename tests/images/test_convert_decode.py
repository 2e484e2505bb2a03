"""``chute convert --decode``: an image folder stored as decoded pixels, read by chute.images without decoding."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import chute
from chute.cli import main
from chute.images import Decode, HorizontalFlip, RandomResizedCrop
from chute.images.codec import decode_pillow
from tests.images._data import encode, jpeg_bomb, pixels

pytest.importorskip("simplejpeg")


def folder(root, sizes=None):
    """``root/<cat|dog>/<i>.jpg|png``: 12 images of 40 x 56 (or ``sizes[i]``)."""
    for i in range(12):
        h, w = (sizes or {}).get(i, (40, 56))
        cls = root / ("cat" if i % 2 else "dog")
        cls.mkdir(parents=True, exist_ok=True)
        fmt = "PNG" if i % 3 == 0 else "JPEG"
        (cls / f"{i:02d}.{fmt.lower()}").write_bytes(encode(pixels(i, h, w), fmt))
    return root


def test_decoded_pixels_are_the_decoders_and_give_the_same_batches(tmp_path, capsys):
    src = folder(tmp_path / "src")
    assert main(["convert", str(src), str(tmp_path / "bytes"), "--workers", "0", "--quiet"]) == 0
    assert main(["convert", str(src), str(tmp_path / "pixels"), "--decode", "--workers", "0"]) == 0
    assert "stored as 6,720 bytes each" in capsys.readouterr().err  # the size cost is said
    encoded, decoded = chute.open(tmp_path / "bytes"), chute.open(tmp_path / "pixels")
    assert decoded.schema["image"] == chute.Tensor("uint8", (3, 40, 56))
    assert decoded.metadata["source"]["decoded"] is True
    for i in range(len(encoded)):
        row = encoded[i]
        assert decoded[i]["path"] == row["path"] and decoded[i]["label"] == row["label"]
        assert np.array_equal(decoded[i]["image"].numpy(), decode_pillow(row["image"]).transpose(2, 0, 1))
    make = lambda ds: chute.Loader(ds, 4, shuffle=True, transform=Decode("image", RandomResizedCrop(24), HorizontalFlip()))  # noqa: E731
    for a, b in zip(make(encoded), make(decoded)):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_images_of_different_sizes_are_refused_and_nothing_is_left(tmp_path, capsys):
    src = folder(tmp_path / "src", sizes={7: (40, 60)})
    dst = tmp_path / "pixels"
    assert main(["convert", str(src), str(dst), "--decode", "--workers", "0", "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "--decode needs every image to have the same size: image cat/07.jpeg is 60 x 40" in err
    assert "convert without --decode" in err
    assert not dst.exists() or not os.listdir(dst)


def test_a_decompression_bomb_is_named_by_its_file_and_nothing_is_left(tmp_path, capsys):
    src = folder(tmp_path / "src")
    (src / "cat" / "99.jpg").write_bytes(jpeg_bomb())
    dst = tmp_path / "pixels"
    assert main(["convert", str(src), str(dst), "--decode", "--workers", "0", "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "cannot decode image" in err and "99.jpg" in err and "more than max_pixels=89,478,485" in err
    assert not dst.exists() or not os.listdir(dst)


def test_decode_applies_to_image_folders_only(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    assert main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "out"), "--decode", "--quiet"]) != 0
    assert "decode= (--decode) does not apply to numpy sources" in capsys.readouterr().err
