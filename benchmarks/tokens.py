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
  ``cu_seqlens``).

tokens/s counts ``batch x seq_len`` positions per batch (padding included for
documents; its share of real tokens is printed too). The first pass of each
Loader is a warm-up; the rate is that of the next ones.

**Start-up** (``--part startup``): a corpus of ``--documents`` documents (1 to
15 tokens each, written once with ``TokenWriter.extend``), opened by
``--processes`` processes started at the same moment (a barrier), each rank
``r`` of ``world_size=processes``: ``sequences`` of seq_len 2048 (concat and
documents), a shuffled Loader, its first batch. Before the barrier each process
reads one batch of a tiny corpus, so chute's modules are loaded (imports are not
opening). Prints each process's time from the barrier to its first batch and
its RSS (total and anonymous) after it.

    python benchmarks/tokens.py --part throughput --repeats 5
    python benchmarks/tokens.py --part startup --documents 100000000 --processes 8
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


def limit_rate(raw: str, seed: int, batches: int) -> float:
    """Tokens/s of numpy slicing the memmapped stream into preallocated int64 batches (shuffled windows)."""
    stream = np.load(raw, mmap_mode="r")
    windows = (len(stream) - 1) // SEQ_LEN
    order = np.random.default_rng(seed).permutation(windows)[: batches * BATCH]
    inputs = np.empty((BATCH, SEQ_LEN), np.int64)
    labels = np.empty((BATCH, SEQ_LEN), np.int64)
    start = time.perf_counter()
    for b in range(batches):
        for j, w in enumerate(order[b * BATCH : (b + 1) * BATCH].tolist()):
            s = w * SEQ_LEN
            inputs[j] = stream[s : s + SEQ_LEN]
            labels[j] = stream[s + 1 : s + SEQ_LEN + 1]
    return batches * BATCH * SEQ_LEN / (time.perf_counter() - start)


def loader_rate(view, seed: int, passes: int = 2) -> tuple[float, float]:
    """(positions/s, share of real tokens) of a default shuffled Loader, after a warm-up pass."""
    loader = chute.Loader(view, BATCH, shuffle=True, seed=seed)
    for _ in loader:  # warm-up: threads start, shards map, the autotuner settles
        pass
    start, positions, real = time.perf_counter(), 0, 0
    for _ in range(passes):
        for batch in loader:
            positions += batch["input_ids"].numel()
            if "position_ids" in batch:
                real += int((batch["labels"] != -100).sum()) + (len(batch["cu_seqlens"]) - 1)
    rate = positions / (time.perf_counter() - start)
    loader.close()
    return rate, (real / positions if real else 1.0)


def throughput(args: argparse.Namespace) -> None:
    ds, raw = corpus(args.data_dir, args.tokens)
    concat = chute.tokens.sequences(ds, SEQ_LEN)
    packed = chute.tokens.sequences(ds, SEQ_LEN, pack="documents")
    print(f"corpus: {ds.metadata['tokens']['tokens']:,} tokens, {len(ds):,} documents, {len(ds.shards)} shards; "
          f"{len(concat):,} concat windows, {len(packed):,} packed sequences")
    rows = []
    for r in range(args.repeats):
        limit = limit_rate(raw, r, len(concat) // BATCH)
        c, _ = loader_rate(concat, r)
        d, share = loader_rate(packed, r)
        rows.append((limit, c, d, share))
        print(f"run {r}: limit {limit / 1e6:.1f} M tok/s, concat {c / 1e6:.1f} ({c / limit:.2f}x), "
              f"documents {d / 1e6:.1f} ({d / limit:.2f}x, {share:.1%} of positions are tokens)", flush=True)
    med = lambda k: statistics.median(row[k] for row in rows)  # noqa: E731
    print(f"median of {args.repeats}: limit {med(0) / 1e6:.1f} M tok/s, concat {med(1) / 1e6:.1f} M tok/s "
          f"({statistics.median(r[1] / r[0] for r in rows):.2f}x), documents {med(2) / 1e6:.1f} M tok/s "
          f"({statistics.median(r[2] / r[0] for r in rows):.2f}x)")


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


def rss() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process in bytes."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["RssAnon"]


def _rank(path: str, warmup: str, pack: str, rank: int, world: int, barrier, results) -> None:
    import chute as c

    # Before the barrier, so the clock starts when every process is ready: chute's modules (they load on
    # first use: torch, pyarrow, the pipeline) through one first batch of a tiny corpus.
    next(iter(c.Loader(c.tokens.sequences(warmup, 16, pack=pack), 1, workers=1)))
    before = rss()
    barrier.wait()
    start = time.perf_counter()
    view = c.tokens.sequences(path, SEQ_LEN, pack=pack)
    loader = c.Loader(view, BATCH, shuffle=True, seed=0, rank=rank, world_size=world, workers=1)
    batch = next(iter(loader))
    took = time.perf_counter() - start
    after = rss()
    results.put((rank, took, after[0], after[1], after[1] - before[1], int(batch["input_ids"].numel())))
    loader.close()


def startup(args: argparse.Namespace) -> None:
    path = startup_corpus(args.data_dir, args.documents)
    warmup = os.path.join(args.data_dir, "startup-warmup")
    chute.tokens.write([np.arange(100)], warmup, overwrite=True)
    ds = chute.open(path)
    print(f"corpus: {len(ds):,} documents, {ds.metadata['tokens']['tokens']:,} tokens, {len(ds.shards)} shards, "
          f"{ds.nbytes / 2**30:.1f} GiB")
    ctx = mp.get_context("spawn")
    for pack in ("concat", "documents"):
        for r in range(args.repeats):
            barrier, results = ctx.Barrier(args.processes), ctx.Queue()
            procs = [ctx.Process(target=_rank, args=(path, warmup, pack, k, args.processes, barrier, results)) for k in range(args.processes)]
            for p in procs:
                p.start()
            got = sorted(results.get() for _ in procs)
            for p in procs:
                p.join()
            times = [g[1] for g in got]
            print(f"{pack} run {r}: time to first batch median {statistics.median(times):.3f} s, max {max(times):.3f} s; "
                  f"RSS per process median {statistics.median(g[2] for g in got) / 2**20:.0f} MiB "
                  f"(anonymous {statistics.median(g[3] for g in got) / 2**20:.0f} MiB, "
                  f"of which opening + first batch {statistics.median(g[4] for g in got) / 2**20:.1f} MiB)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["throughput", "startup"], required=True)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100_000_000, help="throughput corpus size in tokens")
    parser.add_argument("--documents", type=int, default=100_000_000, help="start-up corpus size in documents")
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    throughput(args) if args.part == "throughput" else startup(args)


if __name__ == "__main__":
    main()
