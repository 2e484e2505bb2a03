"""``chute demo``: the "why does my DataLoader hang?" dataset, read both ways.

The write-up's layout: a CSV index and one gzip-compressed pickle per sample
(each a dict of ten 5-digit-string keys to 5-digit-string values), read by a
map-style Dataset that opens one file per item. The demo generates that layout,
converts it with ``chute convert``, checks that a chute Loader delivers every
sample exactly once and identical to its file, then times both ways like for
like: the same batches, four torch DataLoaders (``__getitem__`` per sample, and
a batch at a time through ``sampler=BatchSampler(...)``, ``batch_size=None``,
each at ``num_workers=0`` and ``num_workers=N``; the fastest is the baseline),
several passes each taken in turn, medians printed. A second part trains a tiny CNN on images fed each way
and reports samples/s of the whole loop and how long it waited for data. The model runs on the same number
of torch intra-op threads in every row (half the CPUs by default, printed): with as many as the machine has
cores (torch's default), the model's threads wait on each other at every operation whenever something else
needs a core (a loader's threads or processes, another program), and a busy machine's rows measure the
scheduler more than the loaders.

Nothing is printed that the run cannot measure reliably: no single-run ratios,
no losses (two runs with different shuffles end at different losses by chance).
"""

from __future__ import annotations

import csv
import gzip
import os
import pickle
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any, cast

import numpy as np
import torch

from chute._sizes import format_size

READ_BATCH = 64
TRAIN_BATCH = 128
TRAIN_ROWS = 10_000


class PickleFilesDataset(torch.utils.data.Dataset):
    """The write-up's Dataset: a CSV index of paths, one gzipped pickle per sample."""

    def __init__(self, index_csv: str) -> None:
        self.root = os.path.dirname(index_csv)
        with open(index_csv, newline="") as f:
            self.rows = [(row["path"], int(row["label"])) for row in csv.DictReader(f)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path, label = self.rows[i]
        with gzip.open(os.path.join(self.root, path), "rb") as f:
            return {"path": path, "label": label, "data": pickle.load(f)}


class BatchPickleFilesDataset(PickleFilesDataset):
    """The same files fetched a batch at a time: ``__getitem__(list of indices)`` returns the batch's samples.

    With ``sampler=BatchSampler(...)`` and ``batch_size=None`` a DataLoader calls it once
    per batch, so a worker hands over one list per batch instead of collating samples.
    """

    def __getitem__(self, indices: list[int]) -> list[dict[str, Any]]:  # type: ignore[override]
        return [PickleFilesDataset.__getitem__(self, i) for i in indices]


def generate(root: str, files: int, seed: int = 0) -> str:
    """Write ``files`` gzipped pickles of ten random 5-digit keys/values and a CSV index."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "pickles"), exist_ok=True)
    index = os.path.join(root, "index.csv")
    with open(index, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        for i in range(files):
            sample = {f"{rng.randrange(10**5):05d}": f"{rng.randrange(10**5):05d}" for _ in range(10)}
            name = f"pickles/{i}.pkl.gz"
            with gzip.open(os.path.join(root, name), "wb") as out:
                pickle.dump(sample, out)
            writer.writerow([name, i % 10])
    return index


class ArrayDataset(torch.utils.data.Dataset):
    """The usual map-style Dataset over a .npy file of images and one of labels (memory-mapped)."""

    def __init__(self, images: str, labels: str) -> None:
        self.paths = (images, labels)
        self.arrays: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(np.load(self.paths[1], mmap_mode="r"))

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.arrays is None:  # mapped lazily, so each worker process maps the files itself
            self.arrays = (np.load(self.paths[0], mmap_mode="r"), np.load(self.paths[1], mmap_mode="r"))
        return self.arrays

    def __getitem__(self, i: int) -> dict[str, Any]:
        images, labels = self._arrays()
        return {"image": torch.from_numpy(np.array(images[i])), "label": int(labels[i])}


class BatchArrayDataset(ArrayDataset):
    """The same arrays fetched a batch at a time: ``__getitem__(list of indices)`` is one fancy index per array."""

    def __getitem__(self, indices: list[int]) -> dict[str, Any]:  # type: ignore[override]
        images, labels = self._arrays()
        idx = np.asarray(indices, dtype=np.int64)
        return {"image": torch.from_numpy(images[idx]), "label": torch.from_numpy(np.asarray(labels[idx]))}


def learnable_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy uint8[3,32,32] images whose label (0-9) is their mean brightness bucket."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    base = (labels * 25 + 5).astype(np.int16)[:, None, None, None]
    noise = rng.integers(-20, 21, (n, 3, 32, 32), dtype=np.int16)
    return np.clip(base + noise, 0, 255).astype(np.uint8), labels.astype(np.int64)


class TinyCNN:
    """A small model and its optimiser; ``step(batch)`` is one training step."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
            torch.nn.Linear(128, 10),
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def step(self, batch: dict[str, Any]) -> int:
        images = batch["image"].float().div_(255)
        loss = torch.nn.functional.cross_entropy(self.model(images), batch["label"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return len(images)


def read_pass(batches: Iterable[Any]) -> int:
    """Consume one pass; the number of batches."""
    return sum(1 for _ in batches)


def train_run(batches: Iterable[Any], steps: int, seed: int) -> tuple[float, float]:
    """Train a fresh TinyCNN for ``steps`` batches; (samples/s, share of the loop's time spent waiting for data)."""
    import chute

    model = TinyCNN(max(seed, 0))
    observed = chute.observe(batches)
    seen = done = 0
    start = time.perf_counter()
    while done < steps:
        for batch in observed:
            seen += model.step(batch)
            done += 1
            if done == steps:
                break
    elapsed = time.perf_counter() - start
    return seen / elapsed, observed.report(whole=True).wait_fraction


def medians(contenders: dict[str, Callable[[int], Any]], runs: int) -> dict[str, list[Any]]:
    """Run each contender ``runs`` times, taking turns (so a busy moment hits all of them), after one warm-up run each."""
    for run in contenders.values():
        run(-1)
    results: dict[str, list[Any]] = {name: [] for name in contenders}
    for i in range(runs):
        for name, run in contenders.items():
            results[name].append(run(i))
    return results


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _rate(value: float) -> str:
    return f"{value:>11,.0f} samples/s"


def _times(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def _torch_loader(dataset: torch.utils.data.Dataset, workers: int, batch_size: int, batch_fetch: bool = False,
                  **kwargs: Any) -> torch.utils.data.DataLoader:
    """A shuffled DataLoader fetching one sample per ``__getitem__``, or (``batch_fetch``) a list of indices per call."""
    if batch_fetch:
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(cast("Sized", dataset)), batch_size,
                                                drop_last=kwargs.pop("drop_last", False))
        kwargs.pop("collate_fn", None)  # a batch-fetching Dataset returns the batch as it is
        return torch.utils.data.DataLoader(
            dataset, sampler=sampler, batch_size=None, num_workers=workers, persistent_workers=workers > 0, **kwargs
        )
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, persistent_workers=workers > 0, **kwargs
    )


def _torch_name(workers: int, batch_fetch: bool) -> str:
    how = "batch __getitem__(list)" if batch_fetch else "per-sample __getitem__"
    return f"torch DataLoader, {how}, num_workers={workers}"


def _torch_loaders(sample_ds: torch.utils.data.Dataset, batch_ds: torch.utils.data.Dataset, workers: int, batch_size: int,
                   **kwargs: Any) -> dict[str, torch.utils.data.DataLoader]:
    """The four DataLoaders a torch user would try, by name: per-sample and batch fetch, at 0 and ``workers`` processes."""
    loaders = {}
    for batch_fetch, dataset in ((False, sample_ds), (True, batch_ds)):
        for w in sorted({0, workers}):
            loaders[_torch_name(w, batch_fetch)] = _torch_loader(dataset, w, batch_size, batch_fetch, **dict(kwargs))
    return loaders


def compare_reading(index: str, ds: Any, workers: int, runs: int) -> dict[str, float]:
    """Every sample, shuffled, in batches of 64, through each DataLoader setting and a chute Loader."""
    import chute

    files = len(ds)
    baseline = PickleFilesDataset(index)
    torch_loaders = _torch_loaders(baseline, BatchPickleFilesDataset(index), workers, READ_BATCH, collate_fn=list)
    chute_loader = chute.Loader(ds, READ_BATCH, shuffle=True)
    try:
        _check_identical(baseline, torch_loaders[_torch_name(workers, True)], chute_loader)
        def timed_pass(loader: Any) -> Callable[[int], Any]:
            return lambda _: _timed(lambda: read_pass(loader))

        contenders = {name: timed_pass(loader) for name, loader in torch_loaders.items()}
        contenders["chute Loader"] = lambda _: _timed(lambda: read_pass(chute_loader))
        seconds = medians(contenders, runs)
    finally:
        chute_loader.close()
    rates = {name: files / statistics.median(times) for name, times in seconds.items()}
    print(f"  reading every sample, shuffled, in batches of {READ_BATCH} (median of {runs} passes each):")
    _print_rates(rates)
    return rates


def _check_identical(baseline: PickleFilesDataset, torch_loader: Any, chute_loader: Any) -> None:
    import chute

    expected = {path: baseline[i]["data"] for i, (path, _) in enumerate(baseline.rows)}
    from_torch = {sample["path"]: sample["data"] for batch in torch_loader for sample in batch}
    from_chute: dict[str, dict[str, str]] = {}
    delivered = 0
    for batch in chute_loader:
        from_chute.update(zip(batch["path"], batch["data"]))
        delivered += len(batch["path"])
    if delivered != len(expected) or from_chute != expected or from_torch != expected:
        raise chute.ChuteError("chute delivered different samples than the pickle files hold: please report this as a bug")
    print(f"  a shuffled pass delivers all {len(expected):,} samples once, identical to the files, both ways")


def default_model_threads() -> int:
    """The demo model's torch intra-op threads: half the CPUs this process may run on (the loaders get the rest)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus // 2)


def compare_training(root: str, workers: int, runs: int, steps: int, model_threads: int | None = None) -> dict[str, float]:
    """Train the same tiny CNN for ``steps`` batches of 128 images, fed by each DataLoader setting and by chute.

    The model runs on ``model_threads`` torch intra-op threads in every row (default
    :func:`default_model_threads`); torch's setting is restored afterwards.
    """
    threads = default_model_threads() if model_threads is None else model_threads
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _compare_training(root, workers, runs, steps, threads)
    finally:
        torch.set_num_threads(before)


def _compare_training(root: str, workers: int, runs: int, steps: int, threads: int) -> dict[str, float]:
    import chute

    images, labels = learnable_images(TRAIN_ROWS)
    np.save(os.path.join(root, "images.npy"), images)
    np.save(os.path.join(root, "labels.npy"), labels)
    ds = chute.write(
        ({"image": im, "label": int(lb)} for im, lb in zip(images, labels)), os.path.join(root, "images-chute"), shard_size="16MB"
    )
    paths = (os.path.join(root, "images.npy"), os.path.join(root, "labels.npy"))
    torch_loaders = _torch_loaders(ArrayDataset(*paths), BatchArrayDataset(*paths), workers, TRAIN_BATCH, drop_last=True)
    chute_loader = chute.Loader(ds, TRAIN_BATCH, shuffle=True, drop_last=True)
    try:
        def training(loader: Any) -> Callable[[int], Any]:
            return lambda i: train_run(loader, steps if i >= 0 else 5, i)

        contenders = {name: training(loader) for name, loader in torch_loaders.items()}
        contenders["chute Loader"] = lambda i: train_run(chute_loader, steps if i >= 0 else 5, i)
        results = medians(contenders, runs)
    finally:
        chute_loader.close()
    print(
        f"  training a tiny CNN on the CPU with {threads} torch thread{'s' if threads != 1 else ''} in every row "
        f"(torch.set_num_threads({threads})), {steps} steps of {TRAIN_BATCH} uint8[3,32,32] images, shuffled "
        f"(median of {runs} runs each), the rate of the whole loop, loading and training:"
    )
    rates = {name: statistics.median(r for r, _ in runs_) for name, runs_ in results.items()}
    waits = {name: statistics.median(w for _, w in runs_) for name, runs_ in results.items()}
    _print_rates(rates, {name: f"   the loop waited for data {w:.0%} of its time" for name, w in waits.items()})
    return rates


def _print_rates(rates: dict[str, float], notes: dict[str, str] | None = None) -> None:
    best_torch = max(rate for name, rate in rates.items() if name.startswith("torch"))
    width = max(len(name) for name in rates)
    for name, rate in rates.items():
        note = (notes or {}).get(name, "")
        if name.startswith("chute"):
            note += f"   {_times(rate / best_torch)} the fastest DataLoader"
        print(f"    {name:<{width}} {_rate(rate)}{note}")


def run_demo(files: int = 2000, workers: int | None = None, keep: bool = False, steps: int = 60, runs: int = 5,
             model_threads: int | None = None) -> dict[str, float]:
    """Run the demo and print the comparison; returns the median rates (samples/s) by name.

    ``model_threads``: the training part's torch intra-op threads, the same in every
    row (default: half the CPUs, :func:`default_model_threads`).
    """
    from chute.sources import convert

    if workers is None:
        workers = os.cpu_count() or 1
    root = tempfile.mkdtemp(prefix="chute-demo-")
    try:
        print(f"chute demo: {files:,} per-sample .pkl.gz files plus a CSV index (a dict of ten 5-digit strings each), in {root}")
        start = time.perf_counter()
        index = generate(root, files)
        print(f"  generated the files in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        ds = convert(index, os.path.join(root, "chute-dataset"), kind="index", allow_pickle=True, progress=False)
        print(
            f"  converted to a chute dataset ({len(ds.shards)} shard, {format_size(ds.nbytes)}) in "
            f"{time.perf_counter() - start:.1f} s: chute convert {index} DST --allow-pickle"
        )
        rates = {f"read: {k}": v for k, v in compare_reading(index, ds, workers, runs).items()}
        rates.update({f"train: {k}": v for k, v in compare_training(root, workers, runs, steps, model_threads).items()})
        return rates
    finally:
        if keep:
            print(f"  kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
