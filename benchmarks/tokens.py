"""Token datasets: sequence throughput against the numpy limit, and start-up of many ranks at once.

**Throughput** (``--part throughput``): a synthetic corpus (uint16 ids, vocabulary
50,257, document lengths drawn from a lognormal with a median of ~600 tokens),
seq_len 2048, batch 8, shuffled. Each repeat measures, in the same run:

* the limit: numpy slicing of the memory-mapped token array (a ``.npy`` copy of
  the stream) into preallocated int64 ``input_ids`` and ``labels`` batches, the
  windows in a shuffled order, one thread;
* ``pack="concat"``: ``chute.Loader(sequences(ds, 2048), 8, shuffle=True)``,
  default settings (autotuned threads);
* ``pack="documents"``: the same with document packing (plus ``position_ids``,
  ``cu_seqlens``);
* each kernel alone: ``view.read`` of the same shuffled batches into reused
  outputs, one thread (what the Loader's worker calls per batch).

tokens/s counts ``batch x seq_len`` positions per batch (padding included for
documents; its share of real tokens, from the token count, is printed too). The
first pass of each Loader is a warm-up; the rate is that of the next ones, whose
loop does nothing but count. Each row also has the CPU time per batch
(``getrusage``, all the process's threads): on a busy machine the steadier figure.

**Start-up** (``--part startup``): a corpus of ``--documents`` documents (1 to
15 tokens each, written once with ``TokenWriter.extend``), opened by
``--processes`` processes started at the same moment (a barrier), each rank
``r`` of ``world_size=processes``: ``sequences`` of seq_len 2048 (concat and
documents), a shuffled Loader, its first batch. Before the barrier each process
reads one batch of a tiny corpus, so chute's modules are loaded (imports are not
opening). Prints each process's time from the barrier to its Loader (opening:
manifest, view, Loader) and to its first batch, and its RSS (total and
anonymous) after it, and the CPU seconds it spent from the barrier to its first
batch (``getrusage``, all its threads: the figure that a busy machine does not
inflate); with the checksum check of ``chute.open`` on (the default: each shard
hashed once per machine; the machine's checksum markers of the corpus are removed
before each such run, so it is a first open) and off (``verify=False``).

**Short passes** (``--part passes``): the throughput corpus sized so that one
``pack="concat"`` pass takes about a second (``--tokens``; default 200M tokens,
400 MB), as a validation pass does. The limit and one shuffled default Loader
(created once, a warm-up pass before the clock) run pass after pass in this
process, each chute pass from a fresh ``iter(loader)``, over ``--repeats``
rounds: tokens/s, the first batch of each chute pass, and the CPU time per
batch (the limit's thread, chute's whole process); ratios are the median of
each round's ratio to the limit in the same round.

Each part saves its table through ``benchmarks/_results.py`` (``tokens.json``;
``--label`` names the start-up table ``startup-<label>``, e.g. to keep a run of
another checkout's code beside this one's), drawn into docs/benchmarks.md by
``benchmarks/tables.py``.

    python benchmarks/tokens.py --part throughput --repeats 5
    python benchmarks/tokens.py --part startup --documents 100000000 --processes 8
    python benchmarks/tokens.py --part passes --repeats 7
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import save  # noqa: E402

import chute  # noqa: E402
from chute.tokens.writer import TokenWriter  # noqa: E402

SEQ_LEN = 2048
BATCH = 8
VOCAB = 50_257


def corpus(root: str, tokens: int) -> tuple[chute.Dataset, str]:
    """The throughput corpus (``tokens`` tokens) and a ``.npy`` of its stream (written once)."""
    path = os.path.join(root, f"tokens-{tokens}")
    raw = path + ".npy"
    if not os.path.exists(os.path.join(path, "manifest.json")):
        rng = np.random.default_rng(0)
        with TokenWriter(path, vocab_size=VOCAB, eos_id=VOCAB - 1, overwrite=True) as w:
            written = 0
            while written < tokens:
                lengths = np.maximum(1, rng.lognormal(6.4, 1.0, 20_000).astype(np.int64))
                flat = rng.integers(0, VOCAB - 1, int(lengths.sum()), dtype=np.int64).astype(np.uint16)
                w.extend(flat, lengths)
                written += int(lengths.sum())
    ds = chute.open(path)
    if not os.path.exists(raw):
        stream = np.lib.format.open_memmap(raw + ".tmp.npy", mode="w+", dtype=np.uint16, shape=(int(ds.metadata["tokens"]["tokens"]),))
        at = 0
        for i in range(len(ds.shards)):
            tokens_i, base, _ = chute.tokens.source.DatasetTokens(ds).map(i)
            n = int(ds.metadata["tokens"]["shard_tokens"][i])
            stream[at : at + n] = tokens_i[base : base + n]
            at += n
        stream.flush()
        del stream
        os.replace(raw + ".tmp.npy", raw)
    for i in range(len(ds.shards)):  # into the page cache
        with open(ds.shard_path(i), "rb") as f:
            while f.read(64 << 20):
                pass
    with open(raw, "rb") as f:
        while f.read(64 << 20):
            pass
    return ds, raw


def limit_rate(raw: str, seed: int, batches: int) -> tuple[float, float]:
    """(tokens/s, CPU us per batch) of numpy slicing the memmapped stream into preallocated int64 batches
    (shuffled windows)."""
    stream = np.load(raw, mmap_mode="r")
    windows = (len(stream) - 1) // SEQ_LEN
    order = np.random.default_rng(seed).permutation(windows)[: batches * BATCH]
    inputs = np.empty((BATCH, SEQ_LEN), np.int64)
    labels = np.empty((BATCH, SEQ_LEN), np.int64)
    start, cpu0 = time.perf_counter(), cpu()
    for b in range(batches):
        for j, w in enumerate(order[b * BATCH : (b + 1) * BATCH].tolist()):
            s = w * SEQ_LEN
            inputs[j] = stream[s : s + SEQ_LEN]
            labels[j] = stream[s + 1 : s + SEQ_LEN + 1]
    return batches * BATCH * SEQ_LEN / (time.perf_counter() - start), (cpu() - cpu0) / batches * 1e6


def loader_rate(view, seed: int, passes: int = 2) -> tuple[float, float, int]:
    """(positions/s, CPU us per batch, threads) of a default shuffled Loader, after a warm-up pass.

    The timed loop only counts positions: anything else the loop did per batch (a tensor reduction
    costs tens of microseconds, more under load when torch wakes its intra-op threads) would be
    charged to the Loader."""
    loader = chute.Loader(view, BATCH, shuffle=True, seed=seed)
    for _ in loader:  # warm-up: threads start, shards map, the autotuner settles
        pass
    start, cpu0, positions, batches = time.perf_counter(), cpu(), 0, 0
    for _ in range(passes):
        for batch in loader:
            positions += batch["input_ids"].numel()
            batches += 1
    rate, spent = positions / (time.perf_counter() - start), cpu() - cpu0
    threads = loader.report().settings["num_threads"]
    loader.close()
    return rate, spent / batches * 1e6, threads


def kernel_rate(view, seed: int, batches: int) -> tuple[float, float]:
    """(positions/s, CPU us per batch) of ``view.read`` alone: shuffled batches into reused outputs, one
    thread, shards mapped first."""
    order = np.random.default_rng(seed).permutation(len(view))[: batches * BATCH].astype(np.int64)
    outs = [np.empty((BATCH, *shape), dtype) for _, shape, dtype, _ in view.fixed_columns]
    for i in range(len(view.shards)):  # map every shard (and plan it) before the clock
        if view.shards[i].rows:
            view.read(np.asarray([view.offsets[i]], np.int64), [o[:1] for o in outs])
    start, cpu0 = time.perf_counter(), cpu()
    for b in range(batches):
        view.read(order[b * BATCH : (b + 1) * BATCH], outs)
    return batches * BATCH * SEQ_LEN / (time.perf_counter() - start), (cpu() - cpu0) / batches * 1e6


def limit_pass(stream: np.ndarray, order: np.ndarray, inputs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(seconds, thread CPU seconds) of one limit pass: the windows of ``order`` sliced into ``inputs``/``labels``."""
    start, cpu0 = time.perf_counter(), time.thread_time()
    for b in range(len(order) // BATCH):
        for j, w in enumerate(order[b * BATCH : (b + 1) * BATCH].tolist()):
            s = w * SEQ_LEN
            inputs[j] = stream[s : s + SEQ_LEN]
            labels[j] = stream[s + 1 : s + SEQ_LEN + 1]
    return time.perf_counter() - start, time.thread_time() - cpu0


def short_passes(args: argparse.Namespace) -> None:
    """``--part passes``: the limit and a concat Loader pass after pass in this process (see the docstring)."""
    ds, raw = corpus(args.data_dir, args.tokens)
    view = chute.tokens.sequences(ds, SEQ_LEN)
    stream = np.load(raw, mmap_mode="r")
    batches = len(view) // BATCH
    inputs = np.empty((BATCH, SEQ_LEN), np.int64)
    labels = np.empty((BATCH, SEQ_LEN), np.int64)
    loader = chute.Loader(view, BATCH, shuffle=True, seed=0)
    for _ in loader:  # warm-up: threads start, shards map, the autotuner settles
        pass
    limit_pass(stream, np.random.default_rng(0).permutation(len(view)), inputs, labels)  # its pages mapped
    rounds: list[dict] = []
    for r in range(args.repeats):
        load = os.getloadavg()[0]
        order = np.random.default_rng(r).permutation(len(view))
        limit_s, limit_cpu = limit_pass(stream, order, inputs, labels)
        cpu0, start, first, count = cpu(), time.perf_counter(), None, 0
        for batch in loader:
            count += len(batch["input_ids"])
            if first is None:
                first = time.perf_counter() - start
        chute_s, chute_cpu = time.perf_counter() - start, cpu() - cpu0
        assert first is not None and count == len(view)
        x = {"limit": batches * BATCH * SEQ_LEN / limit_s, "chute": count * SEQ_LEN / chute_s,
             "limit_cpu_us": limit_cpu / batches * 1e6, "chute_cpu_us": chute_cpu / count * BATCH * 1e6,
             "first_ms": first * 1e3, "pass_s": chute_s, "load": load}
        rounds.append(x)
        print(f"round {r + 1}/{args.repeats} (load {load:.1f}): limit {x['limit'] / 1e6:.0f} M tok/s ({limit_s:.2f} s), "
              f"chute {x['chute'] / 1e6:.0f} M tok/s ({chute_s:.2f} s): {x['chute'] / x['limit']:.3f}x; CPU us per batch "
              f"limit {x['limit_cpu_us']:.0f}, chute {x['chute_cpu_us']:.0f}; first batch {x['first_ms']:.1f} ms", flush=True)
    settings = loader.report().settings
    loader.close()
    med = lambda key: statistics.median(x[key] for x in rounds)  # noqa: E731
    ratio = statistics.median(x["chute"] / x["limit"] for x in rounds)
    cpu_ratio = statistics.median(x["limit_cpu_us"] / x["chute_cpu_us"] for x in rounds)
    print(f"median of {args.repeats}: chute / limit {ratio:.3f} (tokens/s), {cpu_ratio:.3f} (CPU per batch)")
    table = {
        "title": f'`pack="concat"` passes of {batches:,} batches (about 1 s), seq_len {SEQ_LEN}, batch {BATCH}',
        "columns": [["mtok_s", "M tokens/s", ".0f"], ["ratio", "/ limit", ".2f"], ["cpu_us", "CPU us per batch", ".0f"],
                    ["cpu_ratio", "/ limit, CPU per batch", ".2f"], ["first_ms", "1st batch ms", ".1f"]],
        "rows": [
            {"label": "numpy limit (memmapped stream sliced into int64 batches, one thread)", "mtok_s": med("limit") / 1e6,
             "ratio": 1.0, "cpu_us": med("limit_cpu_us"), "cpu_ratio": 1.0, "runs": [x["limit"] for x in rounds]},
            {"label": "`chute.Loader(sequences(ds, 2048), 8, shuffle=True)` default, each pass a fresh `iter()`",
             "mtok_s": med("chute") / 1e6, "ratio": ratio, "cpu_us": med("chute_cpu_us"), "cpu_ratio": cpu_ratio,
             "first_ms": med("first_ms"), "runs": [x["chute"] for x in rounds],
             "ratio_runs": [x["chute"] / x["limit"] for x in rounds],
             "settings": f"threads {settings['num_threads']}, prefetch {settings['prefetch']}"
                         + (", built in the loop (inline)" if settings.get("inline") else "")},
        ],
        "notes": (f"{args.repeats} rounds in one process, each a pass of the limit then one of chute over the same "
                  f"{len(view):,} windows (shuffled); medians of the rounds, / limit the median of each round's ratio; "
                  f"CPU: the limit's thread, chute's whole process (all its threads); the Loader made once, a warm-up "
                  f"pass before the first round; load average (1 min) {med('load'):.1f} (median at the rounds' starts); "
                  f"{code()}"),
    }
    save("tokens", {"passes": table})


def code() -> str:
    """Which chute ran: its checkout and commit (the run's stamp names the benchmark script's)."""
    where = os.path.dirname(os.path.dirname(os.path.abspath(chute.__file__)))
    try:
        sha = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        sha = "?"
    return f"chute from {where} at {sha or '?'}"


def throughput(args: argparse.Namespace) -> None:
    ds, raw = corpus(args.data_dir, args.tokens)
    concat = chute.tokens.sequences(ds, SEQ_LEN)
    packed = chute.tokens.sequences(ds, SEQ_LEN, pack="documents")
    print(f"corpus: {ds.metadata['tokens']['tokens']:,} tokens, {len(ds):,} documents, {len(ds.shards)} shards; "
          f"{len(concat):,} concat windows, {len(packed):,} packed sequences")
    share = packed.num_tokens / (len(packed) * SEQ_LEN)  # every token is in exactly one packed sequence
    rows, loads = [], []
    for r in range(args.repeats):
        loads.append(os.getloadavg()[0])
        (limit, limit_cpu), (kc, kc_cpu), (kd, kd_cpu) = (limit_rate(raw, r, len(concat) // BATCH),
                                                          kernel_rate(concat, r, len(concat) // BATCH),
                                                          kernel_rate(packed, r, len(packed) // BATCH))
        (c, c_cpu, c_threads), (d, d_cpu, d_threads) = loader_rate(concat, r), loader_rate(packed, r)
        rows.append(((limit, kc, kd, c, d), (limit_cpu, kc_cpu, kd_cpu, c_cpu, d_cpu)))
        print(f"run {r} (load {loads[-1]:.1f}): limit {limit / 1e6:.1f} M tok/s, kernels {kc / 1e6:.1f} / {kd / 1e6:.1f}, "
              f"concat {c / 1e6:.1f} ({c / limit:.2f}x, {c_threads} threads), documents {d / 1e6:.1f} ({d / limit:.2f}x, "
              f"{d_threads} threads); CPU us per batch: limit {limit_cpu:.0f}, kernels {kc_cpu:.0f} / {kd_cpu:.0f}, "
              f"Loader concat {c_cpu:.0f}, documents {d_cpu:.0f}", flush=True)
    med = lambda k: statistics.median(row[0][k] for row in rows)  # noqa: E731
    ratio = lambda k: statistics.median(row[0][k] / row[0][0] for row in rows)  # noqa: E731
    med_cpu = lambda k: statistics.median(row[1][k] for row in rows)  # noqa: E731
    print(f"median of {args.repeats}: limit {med(0) / 1e6:.1f} M tok/s, concat {med(3) / 1e6:.1f} M tok/s "
          f"({ratio(3):.2f}x), documents {med(4) / 1e6:.1f} M tok/s ({ratio(4):.2f}x); {share:.1%} of packed positions are tokens")
    labels = [
        "numpy limit (memmapped stream sliced into int64 batches, one thread)",
        'kernel alone, `pack="concat"` (`view.read` into reused outputs, one thread)',
        'kernel alone, `pack="documents"` (+ position_ids, cu_seqlens)',
        '`chute.Loader(sequences(ds, 2048), 8, shuffle=True)` default',
        f'the same, `pack="documents"` ({share:.0%} of positions are tokens)',
    ]
    table = {
        "title": f"seq_len {SEQ_LEN}, batch {BATCH}",
        "columns": [["mtok_s", "M tokens/s", ".1f"], ["ratio", "vs the limit", ".2f"],
                    ["cpu_us", "CPU us per batch", ".0f"]],
        "rows": [{"label": label, "mtok_s": med(k) / 1e6, "ratio": ratio(k), "cpu_us": med_cpu(k)}
                 for k, label in enumerate(labels)],
        "notes": (f"median of {args.repeats} runs (ratios: median of each run's ratio to its own limit; CPU us: "
                  f"getrusage of the process, all its threads, per batch of {BATCH} x {SEQ_LEN}); "
                  f"{int(ds.metadata['tokens']['tokens']):,} tokens, {len(ds.shards)} shards, in the page cache; "
                  f"load average (1 min) {statistics.median(loads):.1f} (median at the runs' starts); {code()}"),
    }
    save("tokens", {"throughput": table})


def startup_corpus(root: str, documents: int) -> str:
    path = os.path.join(root, f"startup-{documents}")
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    rng = np.random.default_rng(1)
    began = time.perf_counter()
    with TokenWriter(path, vocab_size=VOCAB, shard_size="256MB", overwrite=True, durable=False) as w:
        left, chunk = documents, 5_000_000
        while left:
            n = min(chunk, left)
            lengths = rng.integers(1, 16, n, dtype=np.int64)
            w.extend(rng.integers(0, VOCAB, int(lengths.sum()), dtype=np.int64).astype(np.uint16), lengths)
            left -= n
    print(f"wrote {documents:,} documents in {time.perf_counter() - began:.0f} s", flush=True)
    return path


def rss() -> tuple[int, int, int]:
    """(VmRSS, RssAnon, RssFile) of this process in bytes."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["RssAnon"], values["RssFile"]


def cpu() -> float:
    """CPU seconds of this process, all its threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rank(path: str, warmup: str, pack: str, verify: bool, rank: int, world: int, barrier, results) -> None:
    import chute as c

    # Before the barrier, so the clock starts when every process is ready: chute's modules (they load on
    # first use: torch, pyarrow, the pipeline) through one first batch of a tiny corpus.
    next(iter(c.Loader(c.tokens.sequences(warmup, 16, pack=pack), 1, workers=1)))
    before = rss()
    barrier.wait()
    start, cpu0 = time.perf_counter(), cpu()
    view = c.tokens.sequences(c.open(path, verify=verify), SEQ_LEN, pack=pack)
    loader = c.Loader(view, BATCH, shuffle=True, seed=0, rank=rank, world_size=world, workers=1)
    opened = time.perf_counter() - start
    batch = next(iter(loader))
    assert tuple(batch["input_ids"].shape) == (BATCH, SEQ_LEN)
    took, spent = time.perf_counter() - start, cpu() - cpu0
    after = rss()
    results.put((rank, took, after[0], after[1], after[1] - before[1], opened, spent, after[2] - before[2]))
    loader.close()


def forget_checksums(ds: chute.Dataset) -> None:
    """Remove this machine's checksum markers of ``ds``'s shards (``<chute cache dir>/verified/<bucket>``)."""
    import shutil

    from chute.format import validate

    marker = validate._marker_path(ds.shard_path(0))
    if marker is not None:
        shutil.rmtree(os.path.dirname(marker), ignore_errors=True)


def startup(args: argparse.Namespace) -> None:
    path = startup_corpus(args.data_dir, args.documents)
    warmup = os.path.join(args.data_dir, "startup-warmup")
    chute.tokens.write([np.arange(100)], warmup, overwrite=True)
    ds = chute.open(path)
    print(f"corpus: {len(ds):,} documents, {ds.metadata['tokens']['tokens']:,} tokens, {len(ds.shards)} shards, "
          f"{ds.nbytes / 2**30:.1f} GiB")
    ctx = mp.get_context("spawn")
    rows = []
    for pack, verify in (("concat", True), ("documents", True), ("concat", False), ("documents", False)):
        got_all, loads = [], []
        for r in range(args.repeats):
            if verify:  # a first open on this machine: no shard's checksum known yet
                forget_checksums(ds)
            loads.append(os.getloadavg()[0])
            barrier, results = ctx.Barrier(args.processes), ctx.Queue()
            procs = [ctx.Process(target=_rank, args=(path, warmup, pack, verify, k, args.processes, barrier, results)) for k in range(args.processes)]
            for p in procs:
                p.start()
            got = sorted(results.get() for _ in procs)
            for p in procs:
                p.join()
            got_all += got
            times = [g[1] for g in got]
            print(f"{pack} verify={verify} run {r} (load {loads[-1]:.1f}): opening (manifest, view, Loader) median "
                  f"{statistics.median(g[5] for g in got):.3f} s; time to first batch median {statistics.median(times):.3f} s, "
                  f"max {max(times):.3f} s; CPU per process median {statistics.median(g[6] for g in got):.3f} s; "
                  f"RSS per process median {statistics.median(g[2] for g in got) / 2**20:.0f} MiB "
                  f"(anonymous {statistics.median(g[3] for g in got) / 2**20:.0f} MiB, "
                  f"of which opening + first batch {statistics.median(g[4] for g in got) / 2**20:.1f} MiB; "
                  f"file-backed pages added {statistics.median(g[7] for g in got) / 2**20:.0f} MiB)", flush=True)
        med = lambda k: statistics.median(g[k] for g in got_all)  # noqa: E731
        rows.append({
            "label": f"{pack}, " + ("checksums on (default)" if verify else "`verify=False`"),
            "opening_s": med(5), "first_s": med(1), "first_max_s": max(g[1] for g in got_all), "cpu_s": med(6),
            "rss_mib": med(2) / 2**20, "anon_added_mib": med(4) / 2**20, "file_added_mib": med(7) / 2**20,
            "load": statistics.median(loads),
        })
    table = {
        "title": f"{len(ds):,} documents, {len(ds.shards)} shards, {args.processes} processes",
        "columns": [["opening_s", "opening s", ".3f"], ["first_s", "first batch s (median)", ".3f"],
                    ["first_max_s", "(max)", ".3f"], ["cpu_s", "CPU s per rank", ".3f"], ["rss_mib", "RSS MiB", ".0f"],
                    ["anon_added_mib", "anonymous added MiB", ".1f"], ["file_added_mib", "file pages added MiB", ".0f"],
                    ["load", "load avg (1 min) before", ".1f"]],
        "rows": rows,
        "notes": (f"medians over the {args.processes} ranks of {args.repeats} run(s); times from the barrier (modules "
                  f"imported before); CPU s: getrusage of the rank, all its threads; added: from the barrier to after the "
                  f"first batch; {code()}"),
    }
    save("tokens", {"startup" + (f"-{args.label}" if args.label else ""): table})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["throughput", "startup", "passes"], required=True)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=None,
                        help="throughput corpus size in tokens (default 100M; 200M for --part passes)")
    parser.add_argument("--documents", type=int, default=100_000_000, help="start-up corpus size in documents")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--label", default="", help="save the start-up table as startup-LABEL (default: startup)")
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.tokens is None:
        args.tokens = 200_000_000 if args.part == "passes" else 100_000_000
    {"throughput": throughput, "startup": startup, "passes": short_passes}[args.part](args)


if __name__ == "__main__":
    main()
