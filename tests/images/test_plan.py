"""The geometry of a batch (chute.images.plan): pure, vectorised, checked against the definitions by hand."""

from __future__ import annotations

import numpy as np
import pytest

from chute.images import CenterCrop, HorizontalFlip, Plan, RandomCrop, RandomResizedCrop, Resize
from chute.pipeline.randomness import uniform


def u(n: int, k: int, seed: int = 0) -> np.ndarray:
    return uniform(seed, 0, np.arange(n), k)


def test_resize_makes_the_shorter_side_the_size_and_keeps_the_aspect():
    plan = Resize(256).apply(Plan.whole([[480, 640], [640, 480], [100, 100]]), u(3, 0))
    assert plan.out.tolist() == [[256, 341], [341, 256], [256, 256]]  # torchvision: int(256 * 640 / 480) = 341
    assert plan.box.tolist() == [[0, 0, 640, 480], [0, 0, 480, 640], [0, 0, 100, 100]]  # the whole source, rescaled
    assert Resize((32, 48)).apply(Plan.whole([[100, 200]]), u(1, 0)).out.tolist() == [[32, 48]]


def test_resize_then_center_crop_maps_the_crop_back_to_source_pixels():
    plan = Plan.whole([[480, 640]])
    plan = CenterCrop(224).apply(Resize(256).apply(plan, u(1, 0)), u(1, 0))
    sx, sy = 640 / 341, 480 / 256  # the resized image is 341 x 256
    left, top = round((341 - 224) / 2), round((256 - 224) / 2)  # 58 (58.5 rounds to even), 16
    assert plan.out.tolist() == [[224, 224]]
    np.testing.assert_allclose(plan.box[0], [left * sx, top * sy, (left + 224) * sx, (top + 224) * sy])
    assert not plan.integral()[0]  # a resample renders it


def test_center_crop_at_the_source_scale_is_a_copy_and_small_images_are_enlarged():
    plan = CenterCrop(32).apply(Plan.whole([[64, 80], [20, 40]]), u(2, 0))
    assert plan.box[0].tolist() == [24, 16, 56, 48]
    assert plan.integral().tolist() == [True, False]
    assert plan.out.tolist() == [[32, 32], [32, 32]]
    # 20x40 enlarged to 32x64 first, so the crop is the central half of the width, the whole height
    np.testing.assert_allclose(plan.box[1], [10, 0, 30, 20])


def test_random_crop_covers_every_offset_and_stays_inside():
    n = 4000
    plan = RandomCrop((30, 40)).apply(Plan.whole(np.tile([40, 45], (n, 1))), u(n, 2))
    x0, y0 = plan.box[:, 0], plan.box[:, 1]
    assert set(x0.astype(int)) == set(range(6)) and set(y0.astype(int)) == set(range(11))
    assert np.all(plan.box[:, 2] <= 45) and np.all(plan.box[:, 3] <= 40)
    assert plan.integral().all()


def test_random_resized_crop_boxes_follow_scale_and_ratio():
    n = 2000
    op = RandomResizedCrop(224, scale=(0.25, 0.5), ratio=(0.5, 2.0))
    plan = op.apply(Plan.whole(np.tile([300, 400], (n, 1))), u(n, op.draws))
    w = plan.box[:, 2] - plan.box[:, 0]
    h = plan.box[:, 3] - plan.box[:, 1]
    area = w * h / (300 * 400)
    assert plan.out.tolist() == [[224, 224]] * n
    assert np.all(plan.box[:, :2] >= 0) and np.all(plan.box[:, 2] <= 400) and np.all(plan.box[:, 3] <= 300)
    # rounding w and h to whole pixels moves the area and ratio a little past the bounds
    assert area.min() > 0.24 and area.max() < 0.51
    assert (w / h).min() > 0.49 and (w / h).max() < 2.03
    assert area.max() - area.min() > 0.2  # the range is used


def test_random_resized_crop_falls_back_to_the_central_box_of_the_nearest_ratio():
    # a 10x1000 strip: no box of ratio <= 4/3 with >= 8% of the area fits; the fallback is the central 10x13
    op = RandomResizedCrop(8)
    plan = op.apply(Plan.whole([[10, 1000]]), u(1, op.draws))
    np.testing.assert_allclose(plan.box[0], [493, 0, 506, 10])


def test_flip_follows_p_and_composes():
    n = 4000
    flips = HorizontalFlip(0.25).apply(Plan.whole(np.tile([8, 8], (n, 1))), u(n, 1)).flip
    assert 0.2 < flips.mean() < 0.3
    twice = HorizontalFlip(1.0).apply(HorizontalFlip(1.0).apply(Plan.whole([[8, 8]]), u(1, 1)), u(1, 1))
    assert not twice.flip[0]


@pytest.mark.parametrize("bad", [0, -3, (2,), (2, 0), 2.5, "224"])
def test_bad_sizes_are_refused(bad):
    with pytest.raises((TypeError, ValueError), match="size"):
        CenterCrop(bad).size
