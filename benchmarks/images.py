"""W4 with chute.images: JPEGs decoded straight into the batch, against what users have; and the autotuner's choices.

W4: 20,000 JPEGs of 256x256 (benchmarks/_w4.py builds them), a random 224x224
crop, batch 64, data in the page cache, shuffled. Every configuration runs in a
fresh subprocess, --repeats times round-robin (load that drifts during the run
hits every configuration alike); the table shows medians and ratios between
medians of the same run. samples/s is the steady state of one epoch (from the
first batch to the last).

  limit-2proc    simplejpeg decode + crop (_w4.decode_crop_simplejpeg, chute's decoder) in a plain loop on 2
                 processes: the two-core limit
  pillow-loop-2proc  the same loop with Pillow (_w4.decode_crop), beside it
  torch-2        torch DataLoader(num_workers=2, batch 64) over a map Dataset, the same Pillow function
  chute-pillow   chute.Loader(transform=<the same Pillow function per sample>), autotuned: what users write today
  decodecrop     chute.Loader(transform=chute.images.DecodeCrop("jpeg", size=224, random=True)), autotuned
  decodecrop-tN  the same with chute.Workers(count=N): the hand-picked settings the autotuner is judged against
  decodecrop-fast  the same with fast=True (libjpeg-turbo's fast DCT and upsampling; pixels no longer Pillow's)
  decoded        a dataset of decoded pixels (what chute convert --decode stores: uint8[3,256,256], 196,608
                 bytes an image against ~25 KB of JPEG) with the same DecodeCrop: no decode left

  --only imagenet  full-size photos (benchmarks/_imagenet.py: 2,000 photo-like JPEGs of ImageNet's usual sizes,
                 ~500x375, varied aspect), RandomResizedCrop to 224 with scale (0.08, 1) + flip + normalize, batch 64:
    pillow-2proc        the same augmentation with Pillow + torch (ToTensor, Normalize) in a loop on 2 processes
    pillow-draft-2proc  the same with Pillow's draft() (the smallest JPEG scale that keeps the crop at 224 px)
    in-rrc              DecodeCrop("jpeg", 224, scale=(0.08, 1), flip=True, normalize=True), autotuned (default:
                        scaled DCT decode where the crop allows it)
    in-rrc-full         the same with scaled=False (every image decoded in full)
    in-rrc-t2           the same as in-rrc with chute.Workers(count=2)

  --only io      the autotuner on the I/O-bound case of issue 11: a per-sample transform that sleeps
                 0.5 ms (standing in for a read), a training step of 5 ms (a sleep), batch 64, 10,000 rows,
                 2 epochs measured over the second (the autotuner goes on where the first left it);
                 autotuned against count=2,4,6,8,12

  --passes       short passes, paired in one process: chute against its peer over the same images, pass after
                 pass, each about a second (W4: 3,000 of its JPEGs, DecodeCrop random 224 against the simplejpeg
                 loop on 2 processes; imagenet: the 2,000 photos, in-rrc against the Pillow loop on 2 processes).
                 The peers' processes and chute's Loader are started once, before the first pass (as a
                 DataLoader's persistent workers); a pass is timed from its start (iter(), pool.map) to its last
                 image. Per round: the ratio of images/s, and of CPU time per image (the peer's processes'
                 own, chute's process's); chute's first-batch time and its CPU share of the pass's 2 cores.

    python benchmarks/images.py --data-dir bench-data --repeats 5
    python benchmarks/images.py --data-dir bench-data --passes --repeats 7
    python benchmarks/images.py --data-dir bench-data --only io --repeats 5
    python benchmarks/images.py --data-dir bench-data --only imagenet --repeats 5
    python benchmarks/images.py --tolerance    # the scaled DCT decode's pixel difference from a full decode
    python benchmarks/images.py --from-json PATH   # no run: an earlier run's images-<workload>.json rows as a table

Results also go to benchmarks/results/images.json through benchmarks/_results.py: a table per workload ("w4",
"io", "imagenet"), a row per configuration with its medians and each run (docs/benchmarks.md draws them with
benchmarks/tables.py).

The autotuned configurations print the tuner's decisions of their last run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _results import earlier_rows, save  # noqa: E402

BATCH = 64
CONFIGS = {
    "w4": ["limit-2proc", "pillow-loop-2proc", "torch-2", "chute-pillow", "decodecrop", "decodecrop-t1", "decodecrop-t2", "decodecrop-t3",
           "decodecrop-fast", "decoded"],
    "io": ["io-auto", "io-t2", "io-t4", "io-t6", "io-t8", "io-t12"],
    "imagenet": ["pillow-2proc", "pillow-draft-2proc", "in-rrc", "in-rrc-full", "in-rrc-t2"],
}
LABELS = {
    "limit-2proc": "simplejpeg decode + crop loop, 2 processes (the limit: chute's decoder)",
    "pillow-loop-2proc": "Pillow decode + crop loop, 2 processes",
    "torch-2": "torch DataLoader, num_workers=2, Pillow",
    "chute-pillow": "chute Loader, Pillow per sample, autotuned",
    "decodecrop": "chute Loader, DecodeCrop, autotuned",
    "decodecrop-t1": "chute Loader, DecodeCrop, 1 thread",
    "decodecrop-t2": "chute Loader, DecodeCrop, 2 threads",
    "decodecrop-t3": "chute Loader, DecodeCrop, 3 threads",
    "decodecrop-fast": "chute Loader, DecodeCrop(fast=True), autotuned",
    "decoded": "chute Loader, --decode pixels, DecodeCrop, autotuned",
    "io-auto": "chute Loader, 0.5 ms sleep per sample, autotuned",
    **{f"io-t{n}": f"chute Loader, 0.5 ms sleep per sample, {n} threads" for n in (2, 4, 6, 8, 12)},
    "pillow-2proc": "Pillow loop, 2 processes, no draft (as users write it)",
    "pillow-draft-2proc": "Pillow loop, 2 processes, with draft()",
    "in-rrc": "chute Loader, DecodeCrop (scaled DCT decode, default), autotuned",
    "in-rrc-full": "chute Loader, DecodeCrop(scaled=False), autotuned",
    "in-rrc-t2": "chute Loader, DecodeCrop, 2 threads",
}
#: the imagenet workload's DecodeCrop: RandomResizedCrop to 224, scale (0.08, 1), flip, ImageNet's normalisation
IMAGENET_RRC = dict(size=224, scale=(0.08, 1.0), flip=True, normalize=True)
IO_ROWS = 10_000
IO_SLEEP_S = 0.0005
IO_STEP_S = 0.005  # the training step: the loop takes at most 12,800 samples/s; by hand, 64 x 0.5 / 5 = 6.4 -> 7 threads
IO_EPOCHS = 2  # measured over the second: the tuner goes on from where the first left it


# --------------------------------------------------------------------------- data


def decoded_dataset(root: str):
    """W4's images as stored pixels (``uint8[3, 256, 256]``), decoded as ``chute convert --decode`` decodes them."""
    import numpy as np
    from _data import warm
    from _w4 import jpeg_dataset

    import chute
    from chute.images.codec import Decoder  # what chute convert --decode decodes with

    path = os.path.join(root, "w4-decoded")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        ds, blob, offsets = jpeg_dataset(root)
        bounds = np.load(offsets)
        data = np.memmap(blob, dtype=np.uint8, mode="r")
        decoder = Decoder()

        def rows():
            for i in range(len(bounds) - 1):
                pixels = decoder.decode(data[bounds[i]:bounds[i + 1]].tobytes())
                yield {"jpeg": np.ascontiguousarray(pixels.transpose(2, 0, 1)), "label": i}

        chute.write(rows(), path, overwrite=True)
    ds = chute.open(path)
    warm(ds)
    return ds


def io_dataset(root: str):
    import numpy as np

    import chute

    path = os.path.join(root, f"io-{IO_ROWS}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        chute.write(({"x": np.full(16, i, np.float32), "label": i} for i in range(IO_ROWS)), path, overwrite=True)
    return chute.open(path)


def sleepy(sample: dict) -> dict:
    """The I/O-bound transform: 0.5 ms of waiting (a read), no CPU."""
    time.sleep(IO_SLEEP_S)
    return sample


# --------------------------------------------------------------------------- one configuration (in its own process)


def measure(config: str, data_dir: str) -> dict:
    import torch
    from _w4 import JpegBlobDataset, decode_sample, jpeg_dataset, limit_2proc

    import chute

    if config in ("pillow-2proc", "pillow-draft-2proc") or config.startswith("in-"):
        from _imagenet import dataset as imagenet_dataset

        ds, blob, offsets = imagenet_dataset(data_dir)
    elif config.startswith("io-"):
        ds = io_dataset(data_dir)
    elif config == "decoded":
        ds = decoded_dataset(data_dir)
    else:
        ds, blob, offsets = jpeg_dataset(data_dir)
    n = len(ds)
    cpu0 = os.times()
    out: dict = {}
    if config in ("limit-2proc", "pillow-loop-2proc"):
        samples, seconds = limit_2proc(blob, offsets, n, decoder="simplejpeg" if config == "limit-2proc" else "pillow")
    elif config in ("pillow-2proc", "pillow-draft-2proc"):
        from _imagenet import pillow_2proc

        samples, seconds = pillow_2proc(blob, offsets, n, draft=config == "pillow-draft-2proc")
    else:
        if config == "torch-2":
            loader = torch.utils.data.DataLoader(JpegBlobDataset(blob, offsets), batch_size=BATCH, shuffle=True, num_workers=2)
            count = lambda b: len(b[1])  # noqa: E731
        else:
            name, _, threads = config.partition("-t")
            workers = chute.Workers(count=int(threads)) if threads else None
            if name.startswith("io"):
                transform = sleepy
            elif name.startswith("in-rrc"):
                transform = chute.images.DecodeCrop("jpeg", **IMAGENET_RRC, scaled=not name.endswith("-full"))
            elif name == "chute-pillow":
                transform = decode_sample
            else:
                transform = chute.images.DecodeCrop("jpeg", size=224, random=True, fast=name.endswith("-fast"))
            loader = chute.Loader(ds, BATCH, shuffle=True, seed=0, transform=transform, workers=workers)
            count = lambda b: len(b["label"])  # noqa: E731
        epochs = IO_EPOCHS if config.startswith("io") else 1
        samples, start = 0, None
        for epoch in range(epochs):
            for batch in loader:
                if config.startswith("io"):
                    time.sleep(IO_STEP_S)
                if start is None and (epoch > 0 or epochs == 1):
                    start = time.perf_counter()  # the steady state: from the first batch on, or the epochs after the first
                elif start is not None:
                    samples += count(batch)
        seconds = time.perf_counter() - start
        if not config.startswith("torch"):
            report = loader.report()
            out["threads"], out["prefetch"] = report.settings["num_threads"], report.settings["prefetch"]
            out["decisions"] = [f"{d.time_s:6.2f} s  {d.change}: {d.reason}" for d in report.decisions]
            out["steps"] = [s.describe() for s in loader._meter.tuner.policy.steps] if loader._meter.tuner else []
            out["what_if"] = report.what_if
            out["cores"] = report.cpu_cores_used
            loader.close()
    cpu1 = os.times()
    out["samples_per_s"] = samples / seconds
    out["cpu_s_per_1000"] = 1000 * (sum(cpu1[:4]) - sum(cpu0[:4])) / max(1, samples)
    return out


# --------------------------------------------------------------------------- short passes, paired in one process

PASS_ROWS = {"w4": 3_000, "imagenet": 2_000}


def _peer_pass(args: tuple) -> tuple[int, float, float]:
    """One peer process's share of a pass: ``(images, seconds, CPU seconds of this process)``."""
    import _imagenet
    import _w4

    workload, rest = args[0], args[1:]
    cpu = time.process_time()
    images, seconds = (_w4._loop if workload == "w4" else _imagenet._loop)(rest)
    return images, seconds, time.process_time() - cpu


def _peer_ready(_: int) -> int:
    import PIL.Image
    import simplejpeg
    import torch

    torch.set_num_threads(1)  # as in a DataLoader worker
    return os.getpid() if PIL.Image and simplejpeg else 0


def short_passes(data_dir: str, repeats: int) -> None:
    """``--passes``: W4 and the imagenet photos, chute against its peer pass after pass in this process."""
    import multiprocessing

    from _imagenet import dataset as imagenet_dataset
    from _w4 import jpeg_dataset

    import chute

    tables = {}
    for workload in ("w4", "imagenet"):
        if workload == "w4":
            root = os.path.join(data_dir, f"w4-{PASS_ROWS['w4']}")
            os.makedirs(root, exist_ok=True)
            ds, blob, offsets = jpeg_dataset(root, rows=PASS_ROWS["w4"])
            transform = chute.images.DecodeCrop("jpeg", size=224, random=True)
        else:
            ds, blob, offsets = imagenet_dataset(data_dir)
            transform = chute.images.DecodeCrop("jpeg", **IMAGENET_RRC)
        n = len(ds)
        pool = multiprocessing.get_context("fork").Pool(2)  # before any chute thread exists
        try:
            pool.map(_peer_ready, range(2))
            loader = chute.Loader(ds, BATCH, shuffle=True, seed=0, transform=transform)
            for _ in loader:  # a warm-up pass: threads tuned, output blocks allocated
                pass
            rounds: list[dict] = []
            for r in range(repeats):
                tail = () if workload == "w4" else (False,)  # _imagenet._loop's draft flag
                start = time.perf_counter()
                parts = pool.map(_peer_pass, [(workload, blob, offsets, 0, n // 2, r, *tail),
                                              (workload, blob, offsets, n // 2, n, r, *tail)], chunksize=1)
                peer_s = time.perf_counter() - start
                peer_cpu = sum(p[2] for p in parts)
                cpu0, start, first, count = os.times(), time.perf_counter(), None, 0
                for batch in loader:
                    count += len(batch["label"])
                    if first is None:
                        first = time.perf_counter() - start
                chute_s, cpu1 = time.perf_counter() - start, os.times()
                chute_cpu = (cpu1[0] + cpu1[1]) - (cpu0[0] + cpu0[1])
                rounds.append({"peer": n / peer_s, "chute": count / chute_s, "peer_cpu_ms": 1e3 * peer_cpu / n,
                               "chute_cpu_ms": 1e3 * chute_cpu / count, "first_ms": 1e3 * first,
                               "busy": chute_cpu / (2 * chute_s), "pass_s": chute_s})
                x = rounds[-1]
                print(f"  {workload} round {r + 1}/{repeats}: peer {x['peer']:,.0f}/s chute {x['chute']:,.0f}/s "
                      f"({x['chute'] / x['peer']:.3f}x; CPU/image {x['peer_cpu_ms'] / x['chute_cpu_ms']:.3f}x), "
                      f"first batch {x['first_ms']:.0f} ms, 2 cores busy {x['busy']:.0%}", file=sys.stderr, flush=True)
            settings = loader.report().settings
            loader.close()
        finally:
            pool.close()
            pool.join()
        med = lambda key: statistics.median(x[key] for x in rounds)  # noqa: E731
        ratio = statistics.median(x["chute"] / x["peer"] for x in rounds)
        cpu_ratio = statistics.median(x["peer_cpu_ms"] / x["chute_cpu_ms"] for x in rounds)
        peer = "simplejpeg decode + crop loop, 2 processes (the limit)" if workload == "w4" else \
            "Pillow loop, 2 processes, no draft (as users write it)"
        mine = "chute Loader, DecodeCrop random 224, autotuned" if workload == "w4" else \
            "chute Loader, DecodeCrop (RandomResizedCrop 224, flip, normalize), autotuned"
        tables[f"passes-{workload}"] = {
            "title": f"{TITLES['w4' if workload == 'w4' else 'imagenet']}: {n:,}-image passes (about 1 s), batch {BATCH}",
            "columns": [["rate", "images/s", ",.0f"], ["ratio", "/ peer", ".2f"], ["cpu_ms", "CPU ms / image", ".3f"],
                        ["cpu_ratio", "/ peer, CPU per image", ".2f"], ["first_ms", "1st batch ms", ",.0f"],
                        ["busy", "2 cores busy", ".0%"]],
            "rows": [
                {"label": peer, "rate": med("peer"), "ratio": 1.0, "cpu_ms": med("peer_cpu_ms"), "cpu_ratio": 1.0,
                 "runs": [x["peer"] for x in rounds]},
                {"label": mine, "rate": med("chute"), "ratio": ratio, "cpu_ms": med("chute_cpu_ms"), "cpu_ratio": cpu_ratio,
                 "first_ms": med("first_ms"), "busy": med("busy"), "runs": [x["chute"] for x in rounds],
                 "ratio_runs": [x["chute"] / x["peer"] for x in rounds],
                 "settings": f"threads {settings['num_threads']}, prefetch {settings['prefetch']}"},
            ],
            "notes": (f"{repeats} rounds in one process, each a pass of the peer then one of chute over the same {n:,} images; "
                      "medians of the rounds, / peer the median of each round's ratio; the peer's CPU is its 2 processes' "
                      "own, chute's its whole process's; 2 cores busy: chute's CPU over twice its pass's wall time"),
        }
        print(f"{workload}: chute / peer {ratio:.3f} (images/s), {cpu_ratio:.3f} (CPU per image); "
              f"first batch {med('first_ms'):.0f} ms of a {med('pass_s') * 1e3:.0f} ms pass", flush=True)
    save("images", tables)


# --------------------------------------------------------------------------- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=sorted(CONFIGS), default="w4")
    parser.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    parser.add_argument("--passes", action="store_true", help="short passes, chute and its peer paired in one process (see above)")
    parser.add_argument("--tolerance", action="store_true", help="print the scaled decode's pixel difference (docs/images.md)")
    parser.add_argument("--from-json", metavar="PATH", help="no run: redraw the rows of an earlier run's list-form JSON as a table")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # one configuration, in a subprocess
    parser.add_argument("--build", default=None, help=argparse.SUPPRESS)  # the data, in a subprocess
    args = parser.parse_args()
    if args.from_json:
        rows, stamp = earlier_rows(args.from_json)
        save("images", tables(rows), run=stamp)
        return
    if args.tolerance:
        from _imagenet import scaled_decode_tolerance

        print(json.dumps(scaled_decode_tolerance(), indent=1))
        return
    if args.build:
        from _w4 import jpeg_dataset

        if args.build == "io":
            io_dataset(args.data_dir)
        elif args.build == "imagenet":
            from _imagenet import dataset as imagenet_dataset

            imagenet_dataset(args.data_dir)
        else:
            jpeg_dataset(args.data_dir)
            decoded_dataset(args.data_dir)
        return
    if args.run:
        print(json.dumps(measure(args.run, args.data_dir)))
        return
    if args.passes:
        return short_passes(args.data_dir, args.repeats)
    os.makedirs(args.data_dir, exist_ok=True)
    configs = args.configs.split(",") if args.configs else CONFIGS[args.only]
    # build the data once, before any clock
    subprocess.run([sys.executable, os.path.abspath(__file__), "--build", args.only, "--data-dir", args.data_dir], check=True)
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.repeats):
        for config in configs:
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--run", config, "--data-dir", args.data_dir],
                capture_output=True, text=True,
            )
            if done.returncode != 0:
                sys.exit(f"{config} failed:\n{done.stderr}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs[config].append(result)
            print(f"  run {r + 1}/{args.repeats} {config}: {result['samples_per_s']:,.0f} samples/s"
                  + (f" (threads {result['threads']}, prefetch {result['prefetch']})" if "threads" in result else ""),
                  file=sys.stderr, flush=True)
    print_table(args.only, runs, args.repeats)
    write_results(args.only, runs, args.repeats)


def write_results(workload: str, runs: dict[str, list[dict]], repeats: int) -> None:
    """The workload's table in benchmarks/results/images.json: a row per configuration (medians, ratios to the peers of the same run)."""
    median = {c: statistics.median(r["samples_per_s"] for r in rs) for c, rs in runs.items()}
    refs = [c for c in REFS if c in median]
    rows = []
    for c, rs in runs.items():
        row = {
            "label": f"{workload}: {LABELS.get(c, c)}", "workload": workload, "config": c, "batch_size": BATCH,
            "samples_per_s_median": median[c], "samples_per_s_runs": [r["samples_per_s"] for r in rs],
            "cpu_s_per_1000_median": statistics.median(r["cpu_s_per_1000"] for r in rs), "repeats": repeats,
            "load_average": os.getloadavg()[0], "cpus": os.cpu_count(),
        }
        row.update({f"ratio_to_{ref}": median[c] / median[ref] for ref in refs})
        if "threads" in rs[0]:
            row["settings_runs"] = [f"threads {r['threads']}, prefetch {r['prefetch']}" for r in rs]
        rows.append(row)
    save("images", tables(rows))


#: the peers a configuration is divided by, where the run has them
REFS = ("limit-2proc", "torch-2", "pillow-2proc", "pillow-draft-2proc")
REF_HEADERS = {"limit-2proc": "simplejpeg loop, 2 proc. (limit)", "torch-2": "torch DataLoader(2)",
               "pillow-2proc": "Pillow loop, 2 proc.", "pillow-draft-2proc": "Pillow draft() loop, 2 proc."}
TITLES = {"w4": "W4 with chute.images", "io": "I/O-bound transform (0.5 ms sleep per sample)",
          "imagenet": "ImageNet-like photos, RandomResizedCrop 224 + flip + normalize"}


def tables(rows: list[dict]) -> dict[str, dict]:
    """``rows`` (one per configuration, as write_results makes them) as benchmarks/_results.py tables, one per workload."""
    out: dict[str, dict] = {}
    for w in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == w]
        configs = {r["config"] for r in mine}
        refs = [c for c in REFS if c in configs]
        hand = [r["samples_per_s_median"] for r in mine if "-t" in r["config"]]
        columns = [["samples_per_s_median", "samples/s", ",.0f"], ["cpu_s_per_1000_median", "CPU s / 1k samples", ".3f"]]
        columns += [[f"ratio_to_{ref}", "/ " + REF_HEADERS[ref], ".2f"] for ref in refs]
        if hand:
            columns.append(["ratio_hand", "/ best hand-picked threads", ".2f"])
        columns.append(["settings_text", "settings reached (each run)", ""])
        shown = []
        for r in mine:
            row = {**r, "label": r["label"].removeprefix(f"{w}: ")}
            if hand:
                row["ratio_hand"] = r["samples_per_s_median"] / max(hand)
            if r.get("settings_runs"):
                row["settings_text"] = "; ".join(s.replace("threads ", "t").replace(", prefetch ", "/p") for s in r["settings_runs"])
            shown.append(row)
        steady = "steady state of one epoch" if w in ("w4", "imagenet") else f"epoch 2 of {IO_EPOCHS}, a 5 ms training step"
        out[w] = {
            "title": f"{TITLES.get(w, w)}, batch {mine[0]['batch_size']}",
            "columns": columns,
            "rows": shown,
            "notes": (f"medians of {mine[0]['repeats']} runs round-robin, each in a fresh process, {steady}; settings: "
                      "t = worker threads, p = prefetch, as the run ended"),
        }
    return out


def print_table(workload: str, runs: dict[str, list[dict]], repeats: int) -> None:
    median = {c: statistics.median(r["samples_per_s"] for r in rs) for c, rs in runs.items()}
    steady = "steady state of one epoch" if workload in ("w4", "imagenet") else f"epoch 2 of {IO_EPOCHS}, a 5 ms training step"
    title = TITLES[workload]
    print(f"\n{title}: "
          f"batch {BATCH}, medians of {repeats} runs round-robin, each in a fresh process, {steady}")
    refs = [c for c in REFS if c in median]
    hand = {c: v for c, v in median.items() if "-t" in c}
    header = f"  {'config':52s} {'samples/s':>10s}" + "".join(f" {'/' + c:>13s}" for c in refs)
    header += f" {'/best hand':>11s}" if hand else ""
    print(header + f" {'CPU s/1k':>9s}  settings (each run)")
    for c, rs in runs.items():
        line = f"  {LABELS.get(c, c):52s} {median[c]:10,.0f}" + "".join(f" {median[c] / median[ref]:13.2f}" for ref in refs)
        if hand:
            line += f" {median[c] / max(hand.values()):11.2f}"
        line += f" {statistics.median(r['cpu_s_per_1000'] for r in rs):9.3f}"
        if "threads" in rs[0]:
            line += "  " + ", ".join(f"t{r['threads']}/p{r['prefetch']}" for r in rs)
        print(line)
    for c, rs in runs.items():
        last = rs[-1]
        if last.get("decisions") and not any(f"-t{k}" in c for k in range(1, 17)):
            print(f"\n  {c}: the autotuner's decisions in its last run ({last['cores'] or 0:.2f} cores used):")
            for d in last["decisions"]:
                print(f"    {d}")
            if last.get("what_if"):
                print(f"    what if: {last['what_if']}")


if __name__ == "__main__":
    main()
