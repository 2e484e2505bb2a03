"""Text to tokens: chute.tokens.convert throughput (tokens/s) against the tokenizer alone.

Corpus: --mb MB of synthetic JSON lines (Zipf-distributed pseudo-words, documents of
50-2,000 words), made once in --data. Tokenizer: a byte-level BPE of --vocab ids
trained here on the first 2 MB of the corpus (no download).

  tokenizer   encode_batch_fast over the corpus's texts in this process, nothing else
              (texts already in memory, already parsed: the limit for one process)
  workers=N   chute.tokens.convert(corpus.jsonl, ..., workers=N) end to end: read,
              parse JSON, tokenize (N worker processes; 1 = in this process), write
              the token dataset (fsync, checksums)

Each figure is the median of --repeats runs; ratios are of medians of this run. The
table is saved through benchmarks/_results.py (tokens.json, table "convert").
The `tokenizers` package may use several threads in one process
(TOKENIZERS_PARALLELISM); the run prints the setting. Tokens per CPU second (this
process and its worker processes, user + system) show the cost of the pipeline
apart from how busy the machine is.

    python benchmarks/tokens_convert.py                         # 50 MB, workers 1 and 2
    python benchmarks/tokens_convert.py --mb 50 --workers 1,2 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import save  # noqa: E402


def corpus(path: str, megabytes: int, seed: int = 0) -> str:
    """``megabytes`` MB of JSON lines {"text": ...} of pseudo-words (made once)."""
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 10))) for _ in range(20_000)]
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    size = 0
    with open(path + ".tmp", "w") as f:
        while size < megabytes * 1_000_000:
            n = int(rng.integers(50, 2000))
            text = " ".join(words[i] for i in rng.choice(len(words), n, p=weights))
            line = json.dumps({"text": text}) + "\n"
            f.write(line)
            size += len(line)
    os.replace(path + ".tmp", path)
    return path


def train(path: str, corpus_path: str, vocab: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if os.path.exists(path):
        return path
    texts = []
    with open(corpus_path) as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if sum(map(len, texts)) > 2_000_000:
                break
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(path)
    return path


def cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the worker processes), user + system."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default="bench-data")
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from chute.tokens.text import convert_counted

    os.makedirs(args.data, exist_ok=True)
    src = corpus(os.path.join(args.data, f"text-{args.mb}mb.jsonl"), args.mb)
    tok_path = train(os.path.join(args.data, f"bpe-{args.vocab}.json"), src, args.vocab)
    print(f"corpus {src}: {os.path.getsize(src) / 1e6:.1f} MB; tokenizer {tok_path}; "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset: true)')}; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)

    with open(src) as f:
        texts = [json.loads(line)["text"] for line in f]
    tokenizer = Tokenizer.from_file(tok_path)
    rates: dict[str, list[float]] = {"tokenizer": []}
    efficiency: dict[str, list[float]] = {"tokenizer": []}  # tokens per CPU second: what a loaded machine does not change much
    tokens = 0
    for _ in range(args.repeats):
        start, cpu = time.perf_counter(), cpu_seconds()
        tokens = sum(len(e.ids) for i in range(0, len(texts), 1000) for e in tokenizer.encode_batch_fast(texts[i : i + 1000]))
        rates["tokenizer"].append(tokens / (time.perf_counter() - start))
        efficiency["tokenizer"].append(tokens / (cpu_seconds() - cpu))
        print(f"  tokenizer alone: {rates['tokenizer'][-1] / 1e6:.3f} M tokens/s", flush=True)
    del texts

    out = tempfile.mkdtemp(prefix="chute-tokens-bench-")
    try:
        for workers in (int(w) for w in args.workers.split(",")):
            name = f"workers={workers}"
            rates[name], efficiency[name] = [], []
            for _ in range(args.repeats):
                start, cpu = time.perf_counter(), cpu_seconds()
                ds, counts = convert_counted(src, os.path.join(out, "ds"), tokenizer=tok_path, eos=True, workers=workers,
                                             overwrite=True, progress=False)
                rates[name].append(counts.tokens / (time.perf_counter() - start))
                efficiency[name].append(counts.tokens / (cpu_seconds() - cpu))
                print(f"  {name}: {rates[name][-1] / 1e6:.3f} M tokens/s (load average {os.getloadavg()[0]:.1f})", flush=True)
                ds.close()
    finally:
        shutil.rmtree(out, ignore_errors=True)

    base = statistics.median(rates["tokenizer"])
    print(f"{tokens:,} tokens per pass; median of {args.repeats} runs")
    labels = {"tokenizer": "the tokenizer alone (`encode_batch_fast`, texts in memory)"}
    rows = []
    for name, values in rates.items():
        median = statistics.median(values)
        per_cpu = statistics.median(efficiency[name])
        print(f"  {name:12s} {median / 1e6:7.3f} M tokens/s  ({median / base:4.2f}x the tokenizer alone; "
              f"runs {', '.join(f'{v / 1e6:.3f}' for v in values)}); {per_cpu / 1e6:.3f} M tokens per CPU second")
        label = labels.get(name, f"`chute.tokens.convert(..., {name})`, end to end"
                           + (" (in this process)" if name == "workers=1" else ""))
        rows.append({"label": label, "mtok_s": median / 1e6, "ratio": median / base, "mtok_cpu_s": per_cpu / 1e6,
                     "runs": ", ".join(f"{v / 1e6:.3f}" for v in values)})
    save("tokens", {"convert": {
        "title": f"{args.mb} MB of JSON lines, {tokens / 1e6:.2f} M tokens",
        "columns": [["mtok_s", "M tokens/s", ".3f"], ["ratio", "/ tokenizer alone", ".2f"],
                    ["mtok_cpu_s", "M tokens per CPU second", ".3f"], ["runs", "runs (M tokens/s)", ""]],
        "rows": rows,
        "notes": (f"medians of {args.repeats} runs; a byte-level BPE of {args.vocab:,} ids trained in the run; `eos=True`; "
                  f"end to end includes reading, JSON parsing and writing the dataset (fsync, checksums); "
                  f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}; CPU seconds: this process "
                  "and its worker processes, user + system"),
    }})


if __name__ == "__main__":
    main()
