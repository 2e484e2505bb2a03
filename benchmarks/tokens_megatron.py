"""chute against megatron-core's GPTDataset on the same Megatron .bin/.idx tokens, seq_len 2048.

megatron-core is not a dependency of chute; install it beside torch to run this
(``pip install megatron-core==0.16.1``; its index builder ships compiled in the
wheel as ``megatron.core.datasets.helpers_cpp``).

**Corpora** (written once under ``--data-dir``, in Megatron's MMIDIDX layout,
uint16 ids below 50,256, NullTokenizer(50,256) on Megatron's side):

* ``tiny-N``: ``N`` documents (``--documents``, several allowed) of 1 to 15
  tokens, the lengths of ``benchmarks/tokens.py --part startup``;
* ``long-T``: ~``T`` tokens (``--tokens``) in documents of lognormal lengths
  (median ~600 tokens), those of ``benchmarks/tokens.py --part throughput``.

**Start-up** (``--part startup``), each in a fresh process that first imports
its library and reads one sample of a tiny corpus (imports are not opening):

* megatron-core: ``BlendedMegatronDatasetBuilder(GPTDataset, [None] * 3, ...,
  GPTDatasetConfig(split="100,0,0", sequence_length=2048, path_to_cache=...,
  create_attention_mask=False)).build()`` (the index (.idx) read, the
  document, sample and shuffle indices built and saved) and then sample 0,
  with the cache directory empty; then again with the indices cached (what
  every rank but the first and every later job does);
* chute: ``chute.Loader(chute.tokens.sequences(chute.tokens.megatron(prefix),
  2048), 8, shuffle=True)`` and its first batch (``pack="concat"``, Megatron's
  semantics). chute has no index to build or cache.

Each prints the seconds from its start to the dataset/Loader and to the first
sample/batch, the process's peak RSS (``VmHWM``) and what it added over
the RSS after the warm-up, the anonymous memory (``RssAnon``) it holds after
the first sample over that after the warm-up, and for megatron-core the size of its cached index
files. The corpus files are read once before (in the page cache for both).

**Throughput** (``--part throughput``): tokens/s over ``--samples`` shuffled
samples, batch 8, medians of ``--repeats`` runs, one process: GPTDataset[i]
for consecutive ``i`` (its shuffle index makes them shuffled samples), each 8
stacked into a batch (``tokens``, ``labels``, ``loss_mask``, ``position_ids``,
as torch's default collate would); chute's default shuffled Loader (its
``input_ids``, ``labels``). 16 samples (2 batches) are read before the clock.

**Check** (``--part check``, also run by the others): on a small corpus of
each kind, both have the same number of samples, and for every sample ``k``
of Megatron's unshuffled order (``GPTDataset[j]`` with ``shuffle_index[j] ==
k``) its ``tokens``/``labels`` equal chute's concat window ``k`` of the same
documents written in Megatron's (shuffled) document order, read by chute's
unshuffled Loader. Megatron shuffles documents and then samples; chute's
concat windows follow the files' document order and shuffles windows: the
samples agree once the document order is the same.

Tables go to ``benchmarks/results/tokens.json`` (``megatron``: start-up,
``megatron-throughput``), drawn into docs/benchmarks.md by
``benchmarks/tables.py``.

    python benchmarks/tokens_megatron.py --documents 1000000 10000000 100000000
    python benchmarks/tokens_megatron.py --part throughput --documents 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import save  # noqa: E402

SEQ_LEN = 2048
BATCH = 8
VOCAB = 50_257  # ids 0..50,255 in the corpus; 50,256 is the NullTokenizer's eod
INSTALL = "pip install megatron-core==0.16.1  (beside torch; not a dependency of chute)"


def write_megatron(prefix: str, lengths: np.ndarray, tokens_of) -> None:
    """``prefix.bin`` + ``prefix.idx`` (MMIDIDX version 1, uint16): ``tokens_of(start, stop)`` gives those documents' tokens."""
    n = len(lengths)
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1)
    with open(prefix + ".idx.tmp", "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * n + 8 * n + 8 * (n + 1))
    index = np.memmap(prefix + ".idx.tmp", np.uint8, "r+", offset=len(header))
    sizes = index[: 4 * n].view(np.int32)
    pointers = index[4 * n : 12 * n].view(np.int64)
    sizes[:] = lengths
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    pointers[0] = 0
    index[12 * n :].view(np.int64)[:] = np.arange(n + 1, dtype=np.int64)
    index.flush()
    del index, sizes, pointers
    with open(prefix + ".bin.tmp", "wb") as f:
        chunk = 5_000_000
        for start in range(0, n, chunk):
            f.write(np.ascontiguousarray(tokens_of(start, min(n, start + chunk)), np.uint16).tobytes())
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")


def synthetic(root: str, kind: str, size: int) -> str:
    """The corpus ``kind-size`` (``tiny``: ``size`` documents of 1-15 tokens; ``long``: ~``size`` tokens), written once."""
    prefix = os.path.join(root, f"{kind}-{size}")
    if os.path.exists(prefix + ".idx"):
        return prefix
    rng = np.random.default_rng(1 if kind == "tiny" else 0)
    if kind == "tiny":
        lengths = rng.integers(1, 16, size, dtype=np.int64).astype(np.int32)
    else:
        lengths = np.maximum(1, rng.lognormal(6.4, 1.0, size // 300 + 1).astype(np.int64))
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), size)) + 1].astype(np.int32)
    ends = np.cumsum(lengths, dtype=np.int64)
    began = time.perf_counter()
    write_megatron(prefix, lengths, lambda a, b: rng.integers(0, VOCAB - 1, int(ends[b - 1] - (ends[a - 1] if a else 0)), dtype=np.uint16))
    print(f"wrote {prefix}: {len(lengths):,} documents, {int(ends[-1]):,} tokens in {time.perf_counter() - began:.0f} s", flush=True)
    return prefix


def page_in(prefix: str) -> None:
    for ext in (".bin", ".idx"):
        with open(prefix + ext, "rb") as f:
            while f.read(64 << 20):
                pass


def status(key: str) -> int:
    """``key`` (VmRSS, VmHWM, RssAnon) of /proc/self/status in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    return status("VmRSS")


def peak_rss() -> int:
    """This process's peak RSS: VmHWM (``ru_maxrss`` would carry the parent's peak over fork and exec)."""
    return status("VmHWM")


# ---------------------------------------------------------------- megatron-core


def gpt_dataset(prefix: str, cache: str):
    """megatron-core's training GPTDataset of ``prefix`` (all documents, one epoch), as its builder makes it."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    config = GPTDatasetConfig(
        random_seed=1234, sequence_length=SEQ_LEN, blend=([prefix], None), split="100,0,0", path_to_cache=cache,
        tokenizer=NullTokenizer(VOCAB - 1), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [None, None, None], lambda: True, config).build()
    return train


def megatron_batches(ds, start: int, batches: int):
    """Batches of 8 consecutive GPTDataset samples from ``start``, stacked as torch's default collate would."""
    import torch

    for b in range(batches):
        samples = [ds[start + b * BATCH + j] for j in range(BATCH)]
        yield {key: torch.stack([s[key] for s in samples]) for key in samples[0]}


def megatron_available() -> bool:
    try:
        import megatron.core.datasets.gpt_dataset  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- chute


def chute_view(prefix: str):
    """chute's concat samples of the Megatron files at ``prefix``, read in place."""
    import chute

    return chute.tokens.sequences(chute.tokens.megatron(prefix), SEQ_LEN)


def chute_loader(view, shuffle: bool = True, seed: int = 0):
    import chute

    return chute.Loader(view, BATCH, shuffle=shuffle, seed=seed)


# ---------------------------------------------------------------- a fresh process


def child(which: str, prefix: str, warmup: str, cache: str) -> None:
    """One fresh-process start-up measurement; prints one JSON line."""
    began = time.perf_counter()
    if which == "megatron":
        import warnings

        warnings.simplefilter("ignore")  # megatron-core's import warns that Transformer Engine and Apex are absent
        import torch  # noqa: F401

        ds = gpt_dataset(warmup, os.path.join(cache, "warmup"))
        ds[0]
    else:
        loader = chute_loader(chute_view(warmup))
        next(iter(loader))
        loader.close()
    imported, before, anon_before = time.perf_counter() - began, rss(), status("RssAnon")
    start = time.perf_counter()
    if which == "megatron":
        ds = gpt_dataset(prefix, cache)
        opened = time.perf_counter() - start
        sample = ds[0]
        first = time.perf_counter() - start
        assert sample["tokens"].shape == (SEQ_LEN,)
        samples = len(ds)
    else:
        view = chute_view(prefix)
        loader = chute_loader(view)
        opened = time.perf_counter() - start
        batch = next(iter(loader))
        first = time.perf_counter() - start
        assert tuple(batch["input_ids"].shape) == (BATCH, SEQ_LEN)
        samples = len(view)
        loader.close()
    print(json.dumps({"imported_s": imported, "opened_s": opened, "first_s": first, "peak_rss": peak_rss(),
                      "rss_before": before, "anon_added": status("RssAnon") - anon_before, "samples": samples}))


def fresh(which: str, prefix: str, warmup: str, cache: str) -> dict:
    out = subprocess.run([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--child", which, prefix, warmup, cache],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the {which} process failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def startup(args: argparse.Namespace, warmup: str) -> dict:
    rows = []
    for documents in args.documents:
        prefix = synthetic(args.data_dir, "tiny", documents)
        page_in(prefix)
        tokens = os.path.getsize(prefix + ".bin") // 2
        cache = os.path.join(args.data_dir, f"cache-{documents}")
        got: dict[str, list[dict]] = {"built": [], "cached": [], "chute": []}
        loads = []
        for r in range(args.startup_repeats):
            loads.append(os.getloadavg()[0])
            shutil.rmtree(cache, ignore_errors=True)
            got["built"].append(fresh("megatron", prefix, warmup, cache))
            index_bytes = dir_bytes(cache) - dir_bytes(os.path.join(cache, "warmup"))
            got["cached"].append(fresh("megatron", prefix, warmup, cache))
            got["chute"].append(fresh("chute", prefix, warmup, cache))
            print(f"{documents:,} documents run {r} (load {loads[-1]:.1f}): " + "; ".join(
                f"{k} open {v[-1]['opened_s']:.3f} s, first {v[-1]['first_s']:.3f} s, peak RSS {v[-1]['peak_rss'] / 2**20:.0f} MiB "
                f"(+{(v[-1]['peak_rss'] - v[-1]['rss_before']) / 2**20:.0f}, anonymous held +{v[-1]['anon_added'] / 2**20:.0f})" for k, v in got.items()), flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        labels = {
            "built": "megatron-core GPTDataset: builder.build() with the cache empty (indices built, saved), sample 0",
            "cached": "megatron-core GPTDataset: the same with its indices cached (second open), sample 0",
            "chute": '`chute.Loader(sequences(tokens.megatron(prefix), 2048), 8, shuffle=True)`, first batch',
        }
        for key, runs in got.items():
            med = lambda k: statistics.median(run[k] for run in runs)  # noqa: E731
            rows.append({
                "label": f"{documents:,} docs: {labels[key]}", "documents": documents, "tokens": tokens,
                "samples": runs[0]["samples"], "opened_s": med("opened_s"), "first_s": med("first_s"),
                "peak_rss_mib": med("peak_rss") / 2**20, "added_mib": statistics.median(r["peak_rss"] - r["rss_before"] for r in runs) / 2**20,
                "anon_mib": med("anon_added") / 2**20,
                "index_mib": index_bytes / 2**20 if key == "built" else None, "load": statistics.median(loads),
                "runs": runs,
            })
    return {
        "title": f"seq_len {SEQ_LEN}, one process, fresh each time",
        "columns": [["opened_s", "dataset / Loader s", ".3f"], ["first_s", "to sample 0 / batch 0 s", ".3f"],
                    ["peak_rss_mib", "peak RSS MiB", ".0f"], ["added_mib", "peak added MiB", ".0f"],
                    ["anon_mib", "anonymous held MiB", ".0f"],
                    ["index_mib", "index files MiB", ".0f"], ["load", "load avg (1 min)", ".1f"]],
        "rows": rows,
        "notes": (f"medians of {args.startup_repeats} run(s); documents of 1 to 15 tokens (uint16); times from after the "
                  f"imports and a warm-up read of a tiny corpus; peak added: peak RSS (VmHWM, file-backed pages included) over the RSS "
                  f"after the warm-up; anonymous held: RssAnon after sample 0 / batch 0 over that after the warm-up; "
                  f"index files: the document, sample and shuffle index megatron-core saved; {versions()}"),
    }


# ---------------------------------------------------------------- throughput


def throughput(args: argparse.Namespace, prefix: str, what: str, cache: str) -> list[dict]:
    ds = gpt_dataset(prefix, cache)
    page_in(prefix)
    batches = args.samples // BATCH
    if len(ds) < (batches + 2) * BATCH:
        raise SystemExit(f"{prefix} has {len(ds):,} samples of {SEQ_LEN}: fewer than --samples {args.samples} + 16")
    mega, chu = [], []
    for r in range(args.repeats):
        start = (r * (batches + 2) * BATCH) % (len(ds) - (batches + 2) * BATCH)
        for _ in megatron_batches(ds, start, 2):
            pass
        began = time.perf_counter()
        for batch in megatron_batches(ds, start + 2 * BATCH, batches):
            assert batch["tokens"].shape == (BATCH, SEQ_LEN)
        mega.append(batches * BATCH * SEQ_LEN / (time.perf_counter() - began))
        loader = chute_loader(chute_view(prefix), seed=r)
        it = iter(loader)
        for _ in range(2):
            next(it)
        began = time.perf_counter()
        for _ in range(batches):
            batch = next(it)
        chu.append(batches * BATCH * SEQ_LEN / (time.perf_counter() - began))
        loader.close()
        print(f"{what} run {r} (load {os.getloadavg()[0]:.1f}): megatron-core {mega[-1] / 1e6:.2f} M tok/s, "
              f"chute {chu[-1] / 1e6:.2f} M tok/s", flush=True)
    return [
        {"label": f"{what}: GPTDataset[i] for {args.samples:,} consecutive i, stacked by 8 (tokens, labels, loss_mask, position_ids)",
         "mtok_s": statistics.median(mega) / 1e6, "runs": mega},
        {"label": f"{what}: `chute.Loader(sequences(tokens.megatron(prefix), 2048), 8, shuffle=True)` default, {batches:,} batches",
         "mtok_s": statistics.median(chu) / 1e6, "ratio": statistics.median(c / m for c, m in zip(chu, mega)), "runs": chu},
    ]


# ---------------------------------------------------------------- check


def check(root: str, tiny: int = 200_000, long: int = 3_000_000) -> str:
    """Megatron's unshuffled samples equal chute's concat windows of the same document order (every sample).

    On a corpus of ``tiny`` documents of 1-15 tokens and one of ~``long`` tokens
    in lognormal documents; raises SystemExit at the first difference.
    """
    said = []
    for kind, size in (("tiny", tiny), ("long", long)):
        prefix = synthetic(root, kind, size)
        ds = gpt_dataset(prefix, os.path.join(root, f"cache-check-{kind}"))
        index = np.memmap(prefix + ".idx", np.uint8, "r", offset=34)
        n = int(struct.unpack("<Q", open(prefix + ".idx", "rb").read(34)[18:26])[0])
        lengths = index[: 4 * n].view(np.int32)
        tokens = np.memmap(prefix + ".bin", np.uint16, "r")
        starts = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)])
        order = np.asarray(ds.document_index, np.int64)
        assert len(order) == n and len(set(order.tolist())) == n, "Megatron's document index is not one epoch of every document"
        reordered = prefix + "-megatron-order"
        write_megatron(reordered, lengths[order], lambda a, b: np.concatenate(
            [tokens[starts[d] : starts[d] + lengths[d]] for d in order[a:b]]))
        view = chute_view(reordered)
        loader = chute_loader(view, shuffle=False)
        where = np.argsort(np.asarray(ds.shuffle_index, np.int64))  # where[k]: the j with shuffle_index[j] == k
        checked = 0
        for b, batch in enumerate(loader):
            for j in range(batch["input_ids"].shape[0]):
                k = b * BATCH + j
                sample = ds[int(where[k])]
                if not (np.array_equal(sample["tokens"].numpy(), batch["input_ids"][j].numpy())
                        and np.array_equal(sample["labels"].numpy(), batch["labels"][j].numpy())):
                    raise SystemExit(f"{kind}: Megatron's unshuffled sample {k} differs from chute's concat window {k}")
                checked += 1
        loader.close()
        if checked != len(ds) or len(view) != len(ds):
            raise SystemExit(f"{kind}: Megatron has {len(ds):,} samples, chute {checked:,} windows")
        print(f"check {kind}: {n:,} documents, all {checked:,} samples equal", flush=True)
        said.append(f"{n:,} documents of {'1-15' if kind == 'tiny' else 'lognormal (median ~600)'} tokens: {checked:,} of {checked:,}")
        for ext in (".bin", ".idx"):
            os.remove(reordered + ext)
        shutil.rmtree(os.path.join(root, f"cache-check-{kind}"), ignore_errors=True)
    return ("checked: both give the same number of samples, and every Megatron sample in its unshuffled order equals "
            "chute's concat window of the same index over the documents in Megatron's document order (" + "; ".join(said) + ")")


def versions() -> str:
    from importlib.metadata import version

    import chute

    where = os.path.dirname(os.path.dirname(os.path.abspath(chute.__file__)))
    sha = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return f"megatron-core {version('megatron-core')}; chute from {where} at {sha or '?'}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["all", "startup", "throughput", "check"], default="all")
    parser.add_argument("--data-dir", default="bench-data/megatron")
    parser.add_argument("--documents", type=int, nargs="+", default=[1_000_000, 10_000_000],
                        help="start-up corpora (documents of 1-15 tokens); throughput uses the largest")
    parser.add_argument("--tokens", type=int, default=100_000_000, help="the lognormal throughput corpus, in tokens")
    parser.add_argument("--startup-repeats", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="throughput runs")
    parser.add_argument("--samples", type=int, default=4096, help="samples per throughput run")
    args = parser.parse_args()
    if not megatron_available():
        print(f"megatron.core is not importable: {INSTALL}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(args.data_dir, exist_ok=True)
    warmup = synthetic(args.data_dir, "tiny", 5_000)
    checked = check(args.data_dir)
    tables = {}
    if args.part in ("all", "startup"):
        tables["megatron"] = startup(args, warmup)
        tables["megatron"]["notes"] += "; " + checked
    if args.part in ("all", "throughput"):
        rows = []
        largest = max(args.documents)
        for kind, size in (("tiny", largest), ("long", args.tokens)):
            prefix = synthetic(args.data_dir, kind, size)
            what = f"{size:,} documents of 1-15 tokens" if kind == "tiny" else f"{size:,} tokens, lognormal documents"
            rows += throughput(args, prefix, what, os.path.join(args.data_dir, f"cache-throughput-{kind}"))
            shutil.rmtree(os.path.join(args.data_dir, f"cache-throughput-{kind}"), ignore_errors=True)
        tables["megatron-throughput"] = {
            "title": f"seq_len {SEQ_LEN}, batch {BATCH}, shuffled",
            "columns": [["mtok_s", "M tokens/s", ".2f"], ["ratio", "chute / megatron-core", ".2f"]],
            "rows": rows,
            "notes": (f"median of {args.repeats} runs of {args.samples:,} samples (ratio: median of each run's ratio), "
                      f"one process, corpus in the page cache, Megatron's indices built before; tokens/s: batch x seq_len "
                      f"per batch; {versions()}; {checked}"),
        }
    if tables:
        save("tokens", tables)


if __name__ == "__main__":
    main()
