"""chute.images.Decode in a Loader: the issue's exact call, pixels against Pillow, floats, errors, every column kind."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import chute
from chute.images import Decode, DecodeCrop, HorizontalFlip, Normalize, RandomResizedCrop, Resize
from chute.images.codec import decode_pillow
from chute.pipeline.transform import BatchContext, TransformError
from tests.images._data import encode, jpeg, pixels

pytest.importorskip("simplejpeg")
PIL = pytest.importorskip("PIL.Image")

N = 130
SIDE = 256


@pytest.fixture(scope="module")
def w4(tmp_path_factory):
    """W4 in small: 130 JPEGs of 256 x 256 (two and a bit batches of 64)."""
    path = tmp_path_factory.mktemp("images") / "w4"
    return chute.write(({"jpg": jpeg(i, SIDE, SIDE), "label": i} for i in range(N)), path, shard_size=1_000_000)


@pytest.fixture(autouse=True)
def no_threads_left():
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith("chute-loader")] == []


def window_of(crop: np.ndarray, image: np.ndarray) -> tuple[int, int] | None:
    """``(top, left)`` where ``crop`` (``[3, h, w]``) is exactly a window of ``image`` (``[H, W, 3]``), if it is one."""
    hwc = crop.transpose(1, 2, 0)
    h, w = hwc.shape[:2]
    for top in range(image.shape[0] - h + 1):
        for left in range(image.shape[1] - w + 1):
            if np.array_equal(image[top, left:left + 4], hwc[0, :4]) and np.array_equal(image[top:top + h, left:left + w], hwc):
                return top, left
    return None


def test_the_issues_call_delivers_random_224_crops_of_pillows_pixels(w4):
    loader = chute.Loader(w4, batch_size=64, shuffle=True, transform=chute.images.DecodeCrop("jpg", size=224, random=True))
    seen, windows = [], set()
    for batch in loader:
        assert batch["jpg"].dtype == torch.uint8 and batch["jpg"].shape[1:] == (3, 224, 224)
        assert batch["label"].dtype == torch.int64  # the other columns as usual
        for crop, label in zip(batch["jpg"].numpy(), batch["label"].tolist()):
            window = window_of(crop, decode_pillow(w4[label]["jpg"]))
            assert window is not None, f"sample {label}: not a 224 window of Pillow's decode"
            windows.add(window)
            seen.append(label)
    assert sorted(seen) == list(range(N))
    assert [len(b) for b in [seen[:64], seen[64:128], seen[128:]]] == [64, 64, 2]
    assert len(windows) > 50  # positions vary (33 x 33 possible)


def test_mirrored_random_crops_are_exact_mirrored_windows(w4):
    # the crop is laid out as planes and mirrored in one native pass: exactly Pillow's pixels, mirrored
    loader = chute.Loader(w4, 64, shuffle=True, transform=chute.images.DecodeCrop("jpg", size=224, random=True, flip=True))
    mirrored = 0
    for batch in loader:
        for crop, label in zip(batch["jpg"].numpy(), batch["label"].tolist()):
            image = decode_pillow(w4[label]["jpg"])
            if window_of(crop, image) is None:
                assert window_of(crop[:, :, ::-1], image) is not None, f"sample {label}: neither a window nor a mirrored one"
                mirrored += 1
    assert 30 < mirrored < 100  # of 130


def context(rows, seed=0, epoch=0):
    return BatchContext(np.asarray(rows, dtype=np.int64), epoch, seed, None)


def test_resampled_flipped_crops_are_pillows_resize_of_the_planned_box(w4):
    # scaled=False: every image decoded in full (the default decodes some at 1/2: tests/images/test_scaled.py)
    transform = Decode("jpg", Resize(300), RandomResizedCrop(96, scale=(0.2, 0.9)), HorizontalFlip(), scaled=False)
    loader = chute.Loader(w4, 16, shuffle=True, seed=7, transform=transform)
    checked = flips = 0
    for batch in loader:
        rows = batch["label"].numpy()
        plan = transform.plan(np.full((len(rows), 2), SIDE), context(rows, seed=7))
        for j, row in enumerate(rows):
            source = PIL.fromarray(decode_pillow(w4[int(row)]["jpg"]))
            expected = np.asarray(source.resize((96, 96), PIL.BILINEAR, box=tuple(plan.box[j])))
            if plan.flip[j]:
                expected = expected[:, ::-1]
                flips += 1
            got = batch["jpg"][j].numpy().transpose(1, 2, 0)
            assert np.abs(got.astype(np.int16) - expected).max() <= 1
            checked += 1
    assert checked == N and 30 < flips < 100


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
def test_normalize_gives_floats_of_the_stated_formula(w4, dtype, tolerance):
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    plain = chute.Loader(w4, 32, transform=DecodeCrop("jpg", 64))
    floats = chute.Loader(w4, 32, transform=DecodeCrop("jpg", 64, normalize=Normalize(mean, std, dtype)))
    for a, b in zip(plain, floats):
        assert b["jpg"].dtype == dtype and b["jpg"].shape == a["jpg"].shape
        expected = (a["jpg"].double() / 255 - torch.tensor(mean)[:, None, None].double()) / torch.tensor(std)[:, None, None].double()
        assert torch.allclose(b["jpg"].double(), expected, atol=tolerance * 4, rtol=tolerance)


def test_other_formats_arrow_columns_and_stored_pixels_give_the_same_batches(tmp_path):
    arrays = [pixels(i, 48, 60) for i in range(40)]
    png = chute.write(({"img": encode(a, "PNG"), "label": i} for i, a in enumerate(arrays)), tmp_path / "png")
    stored = chute.write(({"img": a.transpose(2, 0, 1).copy(), "label": i} for i, a in enumerate(arrays)), tmp_path / "px")
    make = lambda: Decode("img", RandomResizedCrop(32), HorizontalFlip())  # noqa: E731
    runs = [
        list(chute.Loader(png, 8, shuffle=True, transform=make())),
        list(chute.Loader(png, 8, shuffle=True, transform=make(), columnar=True)),
        list(chute.Loader(stored, 8, shuffle=True, transform=make())),
    ]
    for batches in runs[1:]:
        assert len(batches) == len(runs[0]) == 5
        for a, b in zip(runs[0], batches):
            assert torch.equal(a["label"], b["label"]) and torch.equal(a["img"], b["img"])


def test_a_broken_image_names_its_sample_and_shard_or_is_skipped(tmp_path):
    def sample(i):
        data = jpeg(i)
        return {"jpg": data[: len(data) // 3] if i == 13 else b"not an image" if i == 21 else data, "label": i}

    ds = chute.write((sample(i) for i in range(30)), tmp_path / "broken")
    with chute.Loader(ds, 10, transform=DecodeCrop("jpg", 32)) as failing, \
            pytest.raises(TransformError, match=r"cannot decode the image in column 'jpg' for sample 13 \(shard .*, row 13\)") as caught:
        list(failing)
    assert "on_error='skip'" in str(caught.value)
    loader = chute.Loader(ds, 10, transform=DecodeCrop("jpg", 32), on_error="skip")
    batches = list(loader)
    labels = [int(x) for b in batches for x in b["label"]]
    assert labels == [i for i in range(30) if i not in (13, 21)]
    assert [b["jpg"].shape[0] for b in batches] == [10, 9, 9]
    assert sorted(loader.skipped) == [13, 21]


def test_ops_that_leave_sizes_unequal_or_out_of_order_are_refused():
    with pytest.raises(ValueError, match="same size"):
        Decode("jpg", Resize(256))
    with pytest.raises(ValueError, match="same size"):
        Decode("jpg", RandomResizedCrop(224), Resize(100))
    with pytest.raises(ValueError, match="Normalize must be the last"):
        Decode("jpg", Normalize(), RandomResizedCrop(224))
    with pytest.raises(TypeError, match="expected a chute.images op"):
        Decode("jpg", lambda x: x)


def test_native_resample_is_within_one_level_of_pillows_resize_of_the_box():
    from chute import _native

    rng = np.random.default_rng(0)
    for _ in range(60):
        height, width = (int(v) for v in rng.integers(20, 200, 2))
        image = np.clip(np.cumsum(rng.integers(0, 30, (height, width, 3)), axis=1) % 256, 0, 255).astype(np.uint8)
        x0, y0 = rng.uniform(0, width / 2), rng.uniform(0, height / 2)
        box = (x0, y0, rng.uniform(x0 + 1, width), rng.uniform(y0 + 1, height))
        oh, ow = (int(v) for v in rng.integers(8, 120, 2))
        expected = np.asarray(PIL.fromarray(image).resize((ow, oh), PIL.BILINEAR, box=box))
        out = np.empty((3, oh, ow), np.uint8)
        _native.resample(image, height, width, box, out, oh, ow)
        # Pillow 13 runs its two passes in either order, which moves some values by one level
        assert np.abs(out.transpose(1, 2, 0).astype(np.int16) - expected).max() <= 1
