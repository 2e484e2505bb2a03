"""The stall report: is the training loop waiting for data, and which stage makes it wait?

:class:`Report` is built from a window of the counters (``chute.observe.counters``)
and says: the share of the loop's time spent waiting for data, each stage's
throughput and utilisation, which stage held the loop back and why, the
cache's hit rate and downloads, skipped samples, the autotuner's settings and
recent decisions, and a what-if line that quotes the autotuner's last
measured step (a change it tried, before and after: never a projection).
``str(report)`` is for people, ``report.to_json()`` for logs.

Every stage of the pass is a row, chute's and the user's alike: the report
reads what each counter says of where its stage runs (``where``: on the
workers, on a thread of its own, in the loop), never a list of names.

Attribution, in this order, once the loop waits at least ``DATA_BOUND`` of its time:

1. **fetch** — readers blocked on shards not yet in the cache (the workers'
   ``wait_in``) for at least a quarter of the workers' busy time: downloads /
   cache misses.
2. **a stage in the loop** — the loop's own stages took at least half of the
   time it spent waiting: the busiest of them (the loop waits for it, not for
   the workers).
3. **a stage on a thread of its own** (the device copy, a user's) — busy at
   least ``SATURATED`` of its time and busier than the worker pool.
4. **the worker pool** — its busiest stage: ``read`` (the gather from the
   shards; ``pack`` over token sequences), ``transform`` split into the per-sample transform (decode /
   augment) and ``collate``, ``order``, or a user's stage. The cause says
   whether the threads were saturated, whether the CPU budget is used, whether
   the work seems to hold the GIL (threads busy but the process using about one
   core), or whether the workers sat idle (batches not started early enough).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from chute.observe.autotune import CPU_SLACK, Decision, Step
from chute.observe.counters import ConsumerTotals, Snapshot

#: The loop is called data-bound when it waits at least this share of its time.
DATA_BOUND = 0.05
#: A stage is saturated when its workers are busy at least this share of their time.
SATURATED = 0.8
#: Counters in the cache's stats() that are differenced over the report's window.
_CACHE_COUNTS = ("bytes_downloaded", "shards_downloaded", "hits", "misses", "evictions", "retries")
_PART_NAMES = {"per_sample": "decode/transform (the per-sample transform)", "collate": "collate"}
#: Share of the loop's wait its own stages must take for one of them to be named.
LOOP_SHARE = 0.5
UNKNOWN_STAGE = "the data pipeline (unknown stage: not a chute Loader)"


@dataclasses.dataclass(frozen=True)
class StageReport:
    """One stage over the report's window."""

    name: str
    unit: str  # what ``items`` counts: "samples" (shards for fetch)
    workers: int  # threads, processes or downloads at once (now)
    busy_s: float
    items: int
    bytes: int
    throughput_per_s: float  # items per second of the loop's time
    utilisation: float  # share of its workers' time spent busy, 0..1
    wait_in_s: float  # waiting for its input
    wait_out_s: float  # waiting for room downstream
    parts: dict[str, float] = dataclasses.field(default_factory=dict)  # busy seconds of its parts

    def to_json(self) -> dict[str, Any]:
        out = {
            "busy_s": round(self.busy_s, 6), "items": self.items, "bytes": self.bytes,
            "throughput_per_s": round(self.throughput_per_s, 3), "utilisation": round(self.utilisation, 4),
            "wait_in_s": round(self.wait_in_s, 6), "wait_out_s": round(self.wait_out_s, 6),
            "workers": self.workers, "unit": self.unit,
        }
        if self.parts:
            out["parts"] = {k: round(v, 6) for k, v in self.parts.items()}
        return out


@dataclasses.dataclass(frozen=True)
class Report:
    """Why the training loop waits (or does not). ``str()`` to read, ``to_json()`` to log."""

    source: str  # "chute.Loader" or "chute.observe"
    window: str  # what the numbers cover: "last pass", "this pass so far", "loader life"
    wait_fraction: float
    batches: int
    samples: int
    elapsed_s: float  # the loop's time: waiting + computing
    wait_s: float
    compute_s: float
    first_batch_s: float | None
    bottleneck_stage: str | None
    bottleneck_cause: str
    stages: dict[str, StageReport]
    cache: dict[str, Any] | None
    skipped: int
    settings: dict[str, Any]
    decisions: list[Decision]
    what_if: str | None
    cpu_cores_used: float | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``json.dumps(report.to_json())`` works)."""
        return {
            "source": self.source,
            "window": self.window,
            "wait_fraction": round(self.wait_fraction, 4),
            "batches": self.batches,
            "samples": self.samples,
            "elapsed_s": round(self.elapsed_s, 6),
            "wait_s": round(self.wait_s, 6),
            "compute_s": round(self.compute_s, 6),
            "first_batch_s": None if self.first_batch_s is None else round(self.first_batch_s, 6),
            "samples_per_s": round(self.samples / self.elapsed_s, 3) if self.elapsed_s > 0 else 0.0,
            "cpu_cores_used": None if self.cpu_cores_used is None else round(self.cpu_cores_used, 3),
            "bottleneck": {"stage": self.bottleneck_stage, "cause": self.bottleneck_cause},
            "stages": {name: stage.to_json() for name, stage in self.stages.items()},
            "cache": _jsonable(self.cache),
            "skipped": self.skipped,
            "settings": dict(self.settings),
            "decisions": [d.to_json() for d in self.decisions],
            "what_if": self.what_if,
        }

    def __str__(self) -> str:
        lines = [
            f"{self.source} report ({self.window}): {self.batches:,} batches, {self.samples:,} samples "
            f"in {self.elapsed_s:.2f} s ({self.samples / self.elapsed_s if self.elapsed_s > 0 else 0:,.0f} samples/s)",
            f"  waiting for data: {self.wait_fraction:.0%} of the loop's time "
            f"({self.wait_s:.2f} s waiting, {self.compute_s:.2f} s computing"
            + (f"; first batch after {self.first_batch_s:.3f} s" if self.first_batch_s is not None else "") + ")",
            f"  bottleneck: {self.bottleneck_stage + ': ' if self.bottleneck_stage else ''}{self.bottleneck_cause}",
        ]
        if self.what_if:
            lines.append(f"  what if: {self.what_if}")
        if self.stages:
            width = max(10, *(len(name) for name in self.stages))
            lines.append(f"  {'stage':{width}s} {'workers':>7s} {'busy s':>8s} {'items':>10s} {'items/s':>11s} {'MB/s':>8s} {'util':>5s} {'wait in':>8s} {'wait out':>8s}")
            for s in self.stages.values():
                mbs = s.bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0
                lines.append(
                    f"  {s.name:{width}s} {s.workers:7d} {s.busy_s:8.3f} {s.items:10,d} {s.throughput_per_s:11,.0f} "
                    f"{mbs:8,.1f} {s.utilisation:5.0%} {s.wait_in_s:8.3f} {s.wait_out_s:8.3f}"
                )
                if s.parts and any(s.parts.values()):
                    lines.append("  " + " " * (width + 1) + ", ".join(f"{k} {v:.3f} s" for k, v in s.parts.items()))
        if self.cpu_cores_used is not None:
            lines.append(f"  CPU: {self.cpu_cores_used:.2f} cores used by this process")
        if self.cache is not None:
            c = self.cache
            rate = c.get("hit_rate")
            lines.append(
                "  cache: " + (f"hit rate {rate:.0%}, " if isinstance(rate, (int, float)) else "")
                + f"{c.get('hits', 0)} hits, {c.get('misses', 0)} misses, "
                f"{c.get('bytes_downloaded', 0) / 1e6:,.1f} MB downloaded in {c.get('shards_downloaded', 0)} shard(s), "
                f"{c.get('evictions', 0)} evictions, {c.get('bytes_cached', 0) / 1e6:,.1f} MB cached"
            )
        if self.source != "chute.observe":
            lines.append(f"  skipped samples: {self.skipped}")
        settings = self.settings
        if settings.get("num_threads") is not None:
            tuned = settings.get("tuned", ["threads", "prefetch"] if settings.get("autotune") else [])
            how = "set by hand" if not tuned else "autotuned" if len(tuned) == 2 else f"{tuned[0]} autotuned"
            inline = "; batches built in the loop (inline)" if settings.get("inline") else ""
            lines.append(f"  settings: {settings.get('workers', 'threads')} {settings['num_threads']}, "
                         f"prefetch {settings.get('prefetch')} ({how}){inline}")
        if self.decisions:
            lines.append("  autotuner decisions (latest last):")
            for d in self.decisions[-8:]:
                lines.append(f"    {d.time_s:8.2f} s  {d.change}: {d.reason}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Report({json.dumps(self.to_json())})"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def cache_window(now: dict[str, Any] | None, start: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cache's stats over a window: counters differenced from ``start``, levels as they are now."""
    if now is None:
        return None
    out = dict(now)
    if start is not None:
        for key in _CACHE_COUNTS:
            if isinstance(now.get(key), (int, float)) and isinstance(start.get(key), (int, float)):
                out[key] = now[key] - start[key]
    hits, misses = out.get("hits"), out.get("misses")
    if isinstance(hits, (int, float)) and isinstance(misses, (int, float)):
        out["hit_rate"] = hits / (hits + misses) if hits + misses else None
    return out


# --------------------------------------------------------------------------- building a report


@dataclasses.dataclass(frozen=True)
class Context:
    """What the report needs besides the counters' window."""

    source: str = "chute.Loader"
    window: str = "last pass"
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()
    cache: dict[str, Any] | None = None
    skipped: int = 0
    cpu_s: float | None = None  # process CPU time over the window
    cpu_budget: int = 1  # CPUs this process may use
    first_batch_s: float | None = None
    workers_kind: str = "threads"  # "threads" or "processes"
    threads_changed: tuple[int, int] | None = None  # the autotuner went from .. to .. threads in the window
    steps: tuple[Step, ...] = ()  # the autotuner's judged trials, latest last


def build(window: Snapshot, context: Context) -> Report:
    """The report for a window of a Loader's counters."""
    consumer = window.consumer
    elapsed = (consumer.wait_ns + consumer.compute_ns) / 1e9
    stages = _stages(window, elapsed, context)
    wait_fraction = _wait_fraction(consumer)
    cores = context.cpu_s / elapsed if context.cpu_s is not None and elapsed > 0 else None
    stage, cause, what_if = _attribute(window, stages, wait_fraction, cores, elapsed, context)
    return Report(
        source=context.source, window=context.window, wait_fraction=wait_fraction,
        batches=consumer.batches, samples=consumer.samples, elapsed_s=elapsed,
        wait_s=consumer.wait_ns / 1e9, compute_s=consumer.compute_ns / 1e9, first_batch_s=context.first_batch_s,
        bottleneck_stage=stage, bottleneck_cause=cause, stages=stages, cache=context.cache, skipped=context.skipped,
        settings=dict(context.settings), decisions=list(context.decisions), what_if=what_if, cpu_cores_used=cores,
    )


def build_consumer_only(consumer: ConsumerTotals, context: Context) -> Report:
    """The report for an iterable chute cannot see into (``chute.observe``): the loop's side only."""
    elapsed = (consumer.wait_ns + consumer.compute_ns) / 1e9
    wait_fraction = _wait_fraction(consumer)
    if consumer.batches == 0:
        cause = "no batches yet"
    elif wait_fraction < DATA_BOUND:
        cause = _not_data_bound(wait_fraction)
    else:
        cause = UNKNOWN_STAGE
    return Report(
        source=context.source, window=context.window, wait_fraction=wait_fraction,
        batches=consumer.batches, samples=consumer.samples, elapsed_s=elapsed,
        wait_s=consumer.wait_ns / 1e9, compute_s=consumer.compute_ns / 1e9, first_batch_s=context.first_batch_s,
        bottleneck_stage=None, bottleneck_cause=cause, stages={}, cache=None, skipped=0,
        settings=dict(context.settings), decisions=[], what_if=None,
        cpu_cores_used=context.cpu_s / elapsed if context.cpu_s is not None and elapsed > 0 else None,
    )


def _wait_fraction(consumer: ConsumerTotals) -> float:
    loop = consumer.wait_ns + consumer.compute_ns
    return consumer.wait_ns / loop if loop > 0 else 0.0


def _not_data_bound(wait_fraction: float) -> str:
    return (
        f"none: the training loop waited for data only {wait_fraction:.0%} of its time, "
        "so its own compute sets the pace"
    )


def _rows(window: Snapshot) -> list[Any]:
    """The stages that are rows of the report, in the order a batch meets them (downloads first)."""
    rows = [t for t in window.stages.values() if t.where != "pool" and (t.active or t.where == "workers")]
    return sorted(rows, key=lambda t: t.where != "storage")


def _stages(window: Snapshot, elapsed: float, context: Context) -> dict[str, StageReport]:
    workers = window.stages.get("workers")
    pool_time = 0.0
    if workers is not None and (workers.busy_ns or workers.wait_out_ns):
        pool_time = (workers.busy_ns + workers.wait_out_ns) / 1e9  # thread time of the pool
    out: dict[str, StageReport] = {}
    for t in _rows(window):
        busy = t.busy_ns / 1e9
        count = t.workers
        wait_out = t.wait_out_s
        if t.where == "workers":
            if workers is not None and workers.active:
                count = workers.workers  # the pool's threads now
            time_available = pool_time or elapsed * max(1, count)
        elif t.where == "thread":
            count = 1
            time_available = busy + t.wait_in_s + t.wait_out_s or elapsed
        elif t.where == "loop":
            count = 1
            time_available = elapsed
        else:
            time_available = elapsed * max(1, t.workers)
        out[t.name] = StageReport(
            name=t.name, unit=t.unit, workers=count, busy_s=busy, items=t.items, bytes=t.nbytes,
            throughput_per_s=t.items / elapsed if elapsed > 0 else 0.0,
            utilisation=min(1.0, busy / time_available) if time_available > 0 else 0.0,
            wait_in_s=t.wait_in_s, wait_out_s=wait_out,
            parts={k: v / 1e9 for k, v in t.parts.items()},
        )
    if workers is not None and out:  # the pool's idle time waiting for a task: its last stage's wait for room
        last = [name for name, t in window.stages.items() if t.where == "workers" and name in out]
        if last:
            row = out[last[-1]]
            out[last[-1]] = dataclasses.replace(row, wait_out_s=workers.wait_out_ns / 1e9)
    return out


def _attribute(
    window: Snapshot, stages: dict[str, StageReport], wait_fraction: float, cores: float | None, elapsed: float, context: Context
) -> tuple[str | None, str, str | None]:
    """``(stage, cause, what_if)``."""
    consumer = window.consumer
    if consumer.batches == 0:
        return None, "no batches yet", None
    if wait_fraction < DATA_BOUND:
        return None, _not_data_bound(wait_fraction), None
    where = {name: t.where for name, t in window.stages.items()}
    pool_names = [n for n in stages if where.get(n) == "workers"]
    workers = window.stages.get("workers")
    pool_busy = workers.busy_ns / 1e9 if workers is not None else 0.0
    pool_idle = workers.wait_out_ns / 1e9 if workers is not None else 0.0
    threads = max(1, stages[pool_names[0]].workers if pool_names else 1)
    pool_util = pool_busy / (pool_busy + pool_idle) if pool_busy + pool_idle > 0 else (
        sum(stages[n].busy_s for n in pool_names) / (elapsed * threads) if elapsed > 0 else 0.0
    )
    wait = f"the loop waited {wait_fraction:.0%} of its time"

    fetch_wait = sum(stages[n].wait_in_s for n in pool_names)
    pool_work = pool_busy or sum(stages[n].busy_s for n in pool_names)
    if fetch_wait > 0 and fetch_wait >= 0.25 * max(pool_work, 1e-9):
        cache = context.cache or {}
        misses = cache.get("misses")
        detail = f" ({misses} cache misses)" if misses is not None else ""
        fetch = stages.get("fetch")
        speed = f"; downloads ran at {fetch.bytes / elapsed / 1e6:,.1f} MB/s" if fetch is not None and elapsed > 0 else ""
        return "fetch", (
            f"downloads / cache misses: {wait}, and the readers spent {fetch_wait:.2f} s waiting for shards "
            f"not yet in the cache{detail}{speed}"
        ), None

    first = context.first_batch_s
    if first is not None and first >= 0.5 * consumer.wait_ns / 1e9:  # the wait is start-up, not a stage's work
        starting = "worker processes starting, " if context.workers_kind == "processes" else ""
        return None, (
            f"start-up: the loop waited {wait_fraction:.0%} of its time, {first:.2f} s of it for the first batch "
            f"({starting}shards opening); measure a longer window for the steady state"
        ), None

    loop = {n: s.busy_s for n, s in stages.items() if where.get(n) == "loop"}
    if loop and sum(loop.values()) >= LOOP_SHARE * consumer.wait_ns / 1e9:
        name = max(loop, key=loop.__getitem__)
        per_batch_ms = 1e3 * loop[name] / max(1, consumer.batches)
        return name, (
            f"stage {name!r} runs in the training loop's thread and takes {per_batch_ms:.2f} ms per batch: {wait}, "
            f"{sum(loop.values()) / max(consumer.wait_ns / 1e9, 1e-9):.0%} of it in the loop's own stages, not waiting "
            "for the workers; where='workers' runs a function of a batch on the workers, in parallel"
        ), None

    for name, row in sorted(((n, s) for n, s in stages.items() if where.get(n) == "thread"), key=lambda p: -p[1].utilisation):
        if row.utilisation >= SATURATED and row.utilisation >= pool_util:
            if name == "device":
                return "device", (
                    f"the host-to-device copy: {wait}; the copy thread was busy {row.utilisation:.0%} of its time "
                    f"({row.bytes / max(row.busy_s, 1e-9) / 1e6:,.0f} MB/s while copying)"
                ), None
            per_batch_ms = 1e3 * row.busy_s / max(1, consumer.batches)
            return name, (
                f"stage {name!r} on its own thread takes {per_batch_ms:.2f} ms per batch: {wait}; its thread was busy "
                f"{row.utilisation:.0%} of its time (one batch at a time: where='workers' runs it in parallel)"
            ), None

    candidates = {n: stages[n].busy_s for n in pool_names}
    if not candidates or max(candidates.values()) <= 0:
        return None, f"{wait}, but no stage recorded work: {UNKNOWN_STAGE}", None
    name = max(candidates, key=candidates.__getitem__)
    per_batch_ms = 1e3 * candidates[name] / max(1, consumer.batches)
    if name == "read":
        what = f"gathering rows from the shards takes {per_batch_ms:.2f} ms per batch"
    elif name == "pack":
        what = f"packing token sequences from the shards takes {per_batch_ms:.2f} ms per batch"
    elif name == "order":
        what = f"computing batch indices takes {per_batch_ms:.2f} ms per batch"
    elif name == "transform":
        parts = stages[name].parts
        part = max(parts, key=parts.__getitem__) if parts and max(parts.values()) > 0 else "per_sample"
        label = _PART_NAMES.get(part, part)
        per_sample_us = 1e6 * parts.get(part, 0.0) / max(1, consumer.samples)
        what = f"{label} takes {per_sample_us:,.0f} us per sample ({per_batch_ms:.2f} ms per batch in all)"
    else:
        what = f"stage {name!r} takes {per_batch_ms:.2f} ms per batch"
    if context.settings.get("inline"):  # no worker to blame: the loop waits for the batches it builds itself
        return name, f"{what}; {wait} building the batches itself (inline: cheaper than a hand-off to a worker thread)", None
    budget = context.cpu_budget
    noun = "worker process" if context.workers_kind == "processes" else "worker thread"
    kind = noun if threads == 1 else noun + ("es" if noun.endswith("s") else "s")
    were = "was" if threads == 1 else "were"
    if pool_util >= SATURATED:
        how = f"{wait} while the {threads} {kind} {were} busy {pool_util:.0%} of the time"
        # busy threads but about one core in use: Python code holding the GIL (far less than one core: waiting, e.g. IO)
        gil = context.workers_kind == "threads" and threads >= 2 and cores is not None and 0.7 <= cores < 1.3
        if gil:
            how += (
                f"; the process used only {cores:.1f} cores, so the work holds the GIL: "
                "workers='processes' would run it in parallel"
            )
        elif cores is not None and cores >= budget - CPU_SLACK:
            how += f"; the CPU budget is used ({cores:.1f} of {budget} cores)"
        elif cores is not None:
            how += f"; the process used {cores:.2f} of {budget} cores"
        if context.threads_changed is not None:
            a, b = context.threads_changed
            how += f" (the autotuner went from {a} to {b} threads during this window)"
        return name, f"{what}; {how}", _what_if(context, "threads", threads)
    how = (
        f"{wait} while the {kind} {were} idle {1 - pool_util:.0%} of the time: batches are not started early "
        f"enough (prefetch {context.settings.get('prefetch')}) or a stage outside the pool is slow"
    )
    return name, f"{what}; {how}", _what_if(context, "prefetch", threads)


def _what_if(context: Context, kind: str, threads: int) -> str | None:
    """What the autotuner's last measured ``kind`` step did (and what would let it measure the next), or None.

    Only measurements: the same change made while the loop waited, its
    samples/s and wait before and after (``Step``). Without one, nothing is
    projected; with the thread count set by hand, the line says how to have
    the next thread measured.
    """
    steps = [s for s in context.steps if s.kind == kind]
    settings = context.settings
    if not steps:
        if kind == "threads" and context.workers_kind == "threads" and "threads" not in settings.get("tuned", ["threads"]):
            return (
                f"not measured: the thread count is set by hand ({threads}); leave chute.Workers(count=) unset "
                f"and the autotuner measures what thread {threads + 1} does"
            )
        return None
    step = steps[-1]
    text = f"measured: {step.describe()}"
    cap = settings.get("max_threads")
    if kind == "threads" and step.kept and cap is not None and threads >= cap:
        text += f"; chute.Workers(max_count={cap + 1}) lets the autotuner measure thread {cap + 1}"
    return text
