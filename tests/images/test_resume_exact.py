"""Augmentations that resume exactly: every random choice from (seed, epoch, dataset row), bit for bit.

The same sample in the same epoch gets the same crop, flip and user noise
whatever the thread count, thread or process workers, the world size, or a
resume in between (docs/loader.md, "Randomness").
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

import chute
from chute.images import Decode, HorizontalFlip, RandomResizedCrop
from tests.images._data import jpeg

pytest.importorskip("simplejpeg")

N = 96
BATCH = 16


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume") / "ds"
    samples = ({"jpg": jpeg(i, 40, 56), "x": np.full(4, i, np.float32), "label": i} for i in range(N))
    return chute.write(samples, path, shard_size=40_000)  # several shards


def augment():
    return Decode("jpg", RandomResizedCrop(24, scale=(0.3, 1.0)), HorizontalFlip())


def jitter(sample):
    """A per-sample user transform with randomness of its own: numpy's from sample_rng, torch's from sample_seed."""
    noise = chute.sample_rng().normal(size=4).astype(np.float32)
    gen = torch.Generator().manual_seed(chute.sample_seed() & 0x7FFF_FFFF_FFFF_FFFF)
    shift = torch.randint(0, 1000, (1,), generator=gen)
    return {"x": sample["x"] + torch.from_numpy(noise), "shift": shift[0], "label": sample["label"]}


def fingerprints(loader, epoch=0, stop_after=None):
    """``{label: digest of what the sample became}`` for one pass (or its first ``stop_after`` batches)."""
    loader.set_epoch(epoch)
    out = {}
    for k, batch in enumerate(loader):
        for j, label in enumerate(batch["label"].tolist()):
            parts = [batch[key][j].numpy().tobytes() for key in sorted(batch) if key != "label"]
            out.setdefault(label, hashlib.sha1(b"".join(parts)).hexdigest())
        if stop_after is not None and k + 1 == stop_after:
            break
    return out


def resumed(make, epoch=0):
    """Half a pass on 2 threads, then the rest on a new loader with 1 thread, from the state dict."""
    first = make(workers=2)
    seen = fingerprints(first, epoch, stop_after=3)
    state = first.state_dict()
    second = make(workers=1)
    second.load_state_dict(state)
    rest = {}
    for batch in second:
        for j, label in enumerate(batch["label"].tolist()):
            parts = [batch[key][j].numpy().tobytes() for key in sorted(batch) if key != "label"]
            rest[label] = hashlib.sha1(b"".join(parts)).hexdigest()
    assert not set(seen) & set(rest) and len(seen) + len(rest) == N
    return {**seen, **rest}


@pytest.mark.parametrize("kind", ["images", "per_sample"])
def test_the_same_sample_gets_the_same_augmentation_on_any_workers_and_after_a_resume(ds, kind):
    def make(**kw):
        transform = augment() if kind == "images" else jitter
        return chute.Loader(ds, BATCH, shuffle=True, seed=3, transform=transform, **kw)

    one = fingerprints(make(workers=1))
    assert len(one) == N
    assert fingerprints(make(workers=2)) == one
    assert resumed(make) == one
    processes = make(workers=chute.Workers("processes", count=2))
    try:
        assert fingerprints(processes) == one
    finally:
        processes.close()
    ranks = [fingerprints(make(workers=1, rank=r, world_size=2)) for r in range(2)]
    assert {**ranks[0], **ranks[1]} == one
    other_epoch = fingerprints(make(workers=1), epoch=1)
    assert sum(other_epoch[k] != one[k] for k in one) > N * 0.9  # a new epoch draws anew
    other_seed = fingerprints(chute.Loader(ds, BATCH, shuffle=True, seed=4, transform=augment() if kind == "images" else jitter))
    assert sum(other_seed[k] != one[k] for k in one) > N * 0.9


def test_sample_rng_outside_a_per_sample_transform_says_where_it_works():
    with pytest.raises(chute.ChuteError, match="inside a Loader's per-sample transform"):
        chute.sample_rng()
