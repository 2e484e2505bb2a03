"""``chute bench`` and ``chute tune``: run a Loader over a dataset and say how fast it goes, and why.

``bench`` reads the dataset as fast as the loader delivers (the loop does
nothing else), for a number of epochs or seconds, and records throughput
(samples/s, MB/s), time to the first batch, throughput over time, and the
loader's own report (per-stage utilisation, bottleneck, settings).

MB/s counts the dataset's stored bytes (its shards' size per row, on average)
for every sample delivered, so map, string and JSON columns count as much as
tensors do, and the loop pays nothing per batch to measure it. Besides the
mean over the whole run, which includes the wait for the first batch, the
result gives the steady-state rate: the rate after start-up (see
:func:`steady_rate`).

``tune`` runs the autotuner (``Loader(num_threads=None)``) against a simulated
training loop that spends ``step_ms`` per batch (a sleep: the CPU stays free
for the loader, as it would while a GPU computes), and reports the settings it
found and its decisions. A loop that no longer waits for data is the goal: the
best possible rate is ``batch_size / step_ms``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from chute._sizes import format_size
from chute.errors import ChuteError

TIMELINE_BINS = 60  # points of throughput over time (for the plot and the JSON)
STARTUP_FRACTION = 0.2  # of the time after the first batch, left out of the steady-state rate


@dataclasses.dataclass
class BenchResult:
    """What one run measured. ``to_json()`` for machines, ``str()`` for people."""

    dataset: str
    rows: int
    shards: int
    nbytes: int
    batch_size: int
    workers: str
    step_ms: float
    epochs: int  # passes started (the last may be partial)
    batches: int
    samples: int
    bytes: int  # stored bytes of the samples delivered (the dataset's bytes per row x samples)
    elapsed_s: float  # from iter() to the last batch
    first_batch_s: float  # from Loader construction to the first batch
    timeline: list[tuple[float, float]]  # (seconds since the first iter(), samples/s over the bin)
    steady: tuple[float, float]  # (from, samples/s): the steady-state rate and when its window starts
    report: dict[str, Any]  # loader.report(since="start").to_json()
    report_text: str
    transform: str = ""  # the per-sample transform's name, if any
    given: tuple[str, ...] = ()  # the settings the caller gave: "threads", "prefetch"

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0

    @property
    def steady_samples_per_s(self) -> float:
        return self.steady[1]

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("report_text")
        out.pop("steady")
        out["samples_per_s"] = round(self.samples_per_s, 3)
        out["steady_samples_per_s"] = round(self.steady_samples_per_s, 3)
        out["steady_from_s"] = round(self.steady[0], 4)
        out["mb_per_s"] = round(self.mb_per_s, 3)
        out["timeline"] = [[round(t, 4), round(r, 3)] for t, r in self.timeline]
        return out

    def summary(self) -> str:
        settings = self.report.get("settings", {})
        threads = settings.get("num_threads")
        tuned = settings.get("tuned") or []
        how = ", ".join(f"{name} {_how(name, self.given, tuned if settings.get('autotune') else [])}" for name in ("threads", "prefetch"))
        lines = [
            f"dataset      {self.dataset}: {self.rows:,} rows in {self.shards} shard(s), {format_size(self.nbytes)}",
            f"loader       batch {self.batch_size}, workers={self.workers!r}, {threads} worker(s), prefetch {settings.get('prefetch')} ({how})"
            + (f", transform {self.transform}" if self.transform else ""),
            f"throughput   {self.samples_per_s:,.0f} samples/s, {self.mb_per_s:,.1f} MB/s of stored data "
            f"({self.samples:,} samples in {self.batches:,} batches, {self.elapsed_s:.2f} s, {self.epochs} pass(es))",
            f"steady state {self.steady_samples_per_s:,.0f} samples/s (from {self.steady[0]:.2f} s on, after start-up)",
            f"first batch  {self.first_batch_s:.3f} s after the Loader was made",
        ]
        if self.step_ms:
            best = self.batch_size / (self.step_ms / 1000)
            lines.append(
                f"training     simulated step {self.step_ms:g} ms: at most {best:,.0f} samples/s; "
                f"waited for data {self.report.get('wait_fraction', 0.0):.0%} of the loop's time"
            )
        stages = self.report.get("stages") or {}
        busy = [(name, s) for name, s in stages.items() if s.get("busy_s") or s.get("items")]
        if busy:
            lines.append("utilisation  " + ", ".join(f"{name} {s.get('utilisation', 0.0):.0%}" for name, s in busy))
        return "\n".join(lines)


def run(
    dataset: Any,
    *,
    batch_size: int = 256,
    num_threads: int | None = None,
    workers: str = "threads",
    prefetch: int | None = None,
    max_count: int | None = None,
    epochs: int | None = 1,
    seconds: float | None = None,
    step_ms: float = 0.0,
    shuffle: bool = True,
    seed: int = 0,
    max_batches: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    loader_kwargs: dict[str, Any] | None = None,
) -> BenchResult:
    """Iterate a :class:`chute.Loader` over ``dataset`` until ``epochs`` passes, ``seconds`` or ``max_batches``, whichever first.

    ``dataset``: a :class:`chute.Dataset`, a path or a URL (remote shards go through ``cache_dir``), or a view that
    reads like one (``chute.tokens.sequences(...)``, a mixture).
    ``step_ms``: a simulated training step per batch (``time.sleep``), as ``chute tune`` uses.
    ``num_threads``, ``workers``, ``prefetch`` and ``max_count`` are those of :class:`chute.Workers`.
    """
    from chute.format.reader import Dataset
    from chute.pipeline.config import Workers
    from chute.pipeline.loader import Loader
    from chute.storage.open import open_dataset

    if epochs is None and seconds is None and max_batches is None:
        raise ValueError("give epochs, seconds or max_batches: a run must end")
    ds = dataset if isinstance(dataset, Dataset) or hasattr(dataset, "shards") else open_dataset(dataset, cache_dir=cache_dir)
    made = time.perf_counter()
    loader = Loader(
        ds, batch_size, shuffle=shuffle, seed=seed, workers=Workers(workers, count=num_threads, prefetch=prefetch, max_count=max_count),
        **(loader_kwargs or {}),
    )
    stamps: list[tuple[float, int]] = []  # (time since start, samples in the batch)
    first_batch: float | None = None
    batches = samples = passes = 0
    start = time.perf_counter()
    deadline = start + seconds if seconds is not None else None
    step_s = step_ms / 1000.0
    done = False
    try:
        while not done and (epochs is None or passes < epochs):
            passes += 1
            got = 0
            left = _rows_left(loader)
            for _batch in loader:
                now = time.perf_counter()
                if first_batch is None:
                    first_batch = now - made
                n = min(batch_size, left)  # the loader's own count: every batch but a pass's last is full
                left -= n
                stamps.append((now - start, n))
                samples += n
                batches += 1
                got += 1
                if step_s:
                    time.sleep(step_s)  # the simulated training step (the CPU is free meanwhile, as on a GPU)
                if (deadline is not None and time.perf_counter() >= deadline) or (max_batches is not None and batches >= max_batches):
                    done = True
                    break
            if not got:
                break  # an empty dataset: nothing more will come
        elapsed = (stamps[-1][0] if stamps else time.perf_counter() - start) or 1e-9
        report = loader.report(since="start")
        report_json, report_text = report.to_json(), str(report)
    finally:
        loader.close()
    return BenchResult(
        dataset=str(ds.root), rows=len(ds), shards=len(ds.shards), nbytes=int(ds.nbytes), batch_size=batch_size,
        workers=workers, step_ms=step_ms, epochs=passes, batches=batches, samples=samples,
        bytes=round(samples * ds.nbytes / len(ds)) if len(ds) else 0,
        elapsed_s=elapsed, first_batch_s=first_batch or 0.0, timeline=timeline(stamps, elapsed), steady=steady_rate(stamps),
        report=report_json, report_text=report_text, transform=_name((loader_kwargs or {}).get("transform")),
        given=tuple(name for name, value in (("threads", num_threads), ("prefetch", prefetch)) if value is not None),
    )


def _how(setting: str, given: tuple[str, ...], tuned: list[str]) -> str:
    """How a setting got its value: the caller gave it, the autotuner chose it, or it is chute's default."""
    if setting in given:
        return "set by hand"
    return "autotuned" if setting in tuned else "chute's default"


def _name(fn: Any) -> str:
    if fn is None:
        return ""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _rows_left(loader: Any) -> int:
    """Rows the next pass of ``loader`` delivers on this rank: its full steps' batches, then a partial last step's
    equal share. Counted from the loader's order, never from a batch's columns (the first tensor of a ragged column
    is one sample's, not the batch's)."""
    order, world, size = loader.order, loader.world_size, loader.batch_size
    consumed = int(loader.state_dict()["consumed"])
    steps = order.num_batches(world, consumed)
    full = min(steps, order.full_steps(world, consumed))
    rows = full * size
    if steps > full:  # the last, partial step: what is left, in equal shares over the ranks
        rows += -(-(int(order.num_rows) - consumed - full * size * world) // world)
    return rows


def timeline(stamps: list[tuple[float, int]], elapsed: float, bins: int = TIMELINE_BINS) -> list[tuple[float, float]]:
    """Samples/s in ``bins`` equal time bins over ``[0, elapsed]``: ``(bin end time, rate)``."""
    if not stamps or elapsed <= 0:
        return []
    bins = max(1, min(bins, len(stamps)))
    width = elapsed / bins
    counts = [0] * bins
    for t, n in stamps:
        counts[min(bins - 1, int(t / width))] += n
    return [((i + 1) * width, c / width) for i, c in enumerate(counts)]


def steady_rate(stamps: list[tuple[float, int]], startup: float = STARTUP_FRACTION) -> tuple[float, float]:
    """``(window start, samples/s)`` once start-up is over.

    Start-up is the wait for the first batch plus the first ``startup`` of the time
    after it (threads starting, caches warming, the autotuner's first steps); the
    rate counts the samples that arrived after it. ``stamps`` are ``(seconds, samples)``
    per batch, in arrival order. With fewer than two batches there is no window: ``(0, 0)``.
    """
    if len(stamps) < 2:
        return 0.0, 0.0
    first, last = stamps[0][0], stamps[-1][0]
    start = first + startup * (last - first)
    if last <= start:
        return start, 0.0
    samples = sum(n for t, n in stamps if t > start)
    return start, samples / (last - start)


def plot(result: BenchResult, path: str | os.PathLike, title: str | None = None) -> str:
    """Write throughput over time and stage utilisation to an image (PNG, SVG, PDF by extension)."""
    try:
        import matplotlib
    except ImportError:
        raise ChuteError("--plot needs matplotlib: pip install 'chute[plot]'") from None
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    stages = {name: s for name, s in (result.report.get("stages") or {}).items() if s.get("busy_s") or s.get("items")}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), gridspec_kw={"height_ratios": [3, 2]})
    try:
        xs = [t for t, _ in result.timeline]
        ys = [r for _, r in result.timeline]
        top.plot(xs, ys, drawstyle="steps-pre", color="tab:blue")
        since, rate = result.steady
        if rate:
            top.hlines(rate, since, result.elapsed_s, color="tab:gray", linestyle="--", linewidth=1,
                       label=f"steady state {rate:,.0f}/s (from {since:.2f} s)")
        top.set_xlabel("seconds")
        top.set_ylabel("samples/s")
        top.set_ylim(bottom=0)
        top.legend(loc="lower right")
        top.set_title(title or f"chute bench: {os.path.basename(result.dataset.rstrip('/'))}, batch {result.batch_size}")
        names = list(stages)
        bottom.barh(names, [100 * stages[n].get("utilisation", 0.0) for n in names], color="tab:orange")
        bottom.set_xlim(0, 100)
        bottom.set_xlabel("utilisation of the stage's workers (%)")
        bottom.invert_yaxis()
        fig.tight_layout()
        fig.savefig(os.fspath(path), dpi=100)
    finally:
        plt.close(fig)
    return os.fspath(path)


def tune_text(result: BenchResult) -> str:
    """What the autotuner found and why, from the run's report."""
    settings = result.report.get("settings", {})
    decisions = result.report.get("decisions") or []
    lines = [
        f"settings found: chute.Workers(count={settings.get('num_threads')}, prefetch={settings.get('prefetch')})"
        + ("" if settings.get("autotune") else "  (the autotuner was off for this loader)"),
        f"waiting for data: {result.report.get('wait_fraction', 0.0):.0%} of the simulated loop's time "
        f"({result.samples_per_s:,.0f} samples/s; the step allows at most "
        + (f"{result.batch_size / (result.step_ms / 1000):,.0f}/s)" if result.step_ms else "unlimited)"),
    ]
    if decisions:
        lines.append(f"decisions ({len(decisions)}, latest last):")
        for d in decisions[-20:]:
            lines.append(f"  {d.get('time_s', 0.0):7.2f} s  {d.get('change')}: {d.get('reason')}")
    else:
        lines.append("decisions: none (the starting settings were kept)")
    lines.append(
        f"use them: chute.Loader(ds, {result.batch_size}, workers=chute.Workers(count={settings.get('num_threads')}, "
        f"prefetch={settings.get('prefetch')}))"
    )
    return "\n".join(lines)


def dumps(result: BenchResult) -> str:
    return json.dumps(result.to_json(), indent=2)
