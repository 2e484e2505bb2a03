"""Conversion on Ray: chute.ray.write on a local Ray vs chute.write in one process; image folders too.

  W2      200,000 x uint8[3,32,32] + int64 label, from the .npy the other benchmarks use:
          chute.write(rows of the memmap) in this process, vs chute.ray.write of a Ray
          dataset whose blocks are slices of the same memmap (the rows leave Ray as Arrow
          blocks and go through chute's writer in each write task).
  images  an image folder (--images PNG files of 32x32 in 10 classes): chute convert
          (reader processes, --workers), vs chute convert --ray (tasks read and write).

Ray runs locally with --cpus CPUs (default 2). Each figure is the median of
--repeats runs; ratios are of medians measured in this run. Where the time goes
is measured in-process on one block of W2 rows (Arrow -> samples, chute's column
builders, the shard file: write + fsync + checksum) and printed per 10,000 rows.

    python benchmarks/ray_convert.py                     # data in ./bench-data
    python benchmarks/ray_convert.py --repeats 5 --images 20000 --cpus 2

Results go to benchmarks/results/ray_convert.json through benchmarks/_results.py: tables "jobs" (one process
against Ray) and "task" (where a write task's time goes); docs/benchmarks.md draws them with benchmarks/tables.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _data import array_dataset  # noqa: E402
from _results import save  # noqa: E402


def image_folder(root: str, count: int) -> str:
    """``count`` random 32x32 PNGs in 10 class directories (made once)."""
    from PIL import Image

    path = os.path.join(root, f"images-{count}")
    if os.path.isdir(path):
        return path
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = os.path.join(tmp, f"class{i % 10}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(os.path.join(folder, f"{i:06d}.png"))
    os.replace(tmp, path)
    return path


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def w2_rows(batch, raw: str):
    """A Ray map_batches function: rows ``id`` of the W2 memmap (a plain function, so the map and
    the write run fused in the same tasks)."""
    data = np.load(raw, mmap_mode="r")
    ids = batch["id"]
    return {"x": np.asarray(data[ids[0] : ids[-1] + 1]), "label": ids}


def where_the_time_goes(raw: str, rows: int = 10_000) -> dict[str, float]:
    """Seconds per ``rows`` W2 rows for each step of a write task, in this process."""
    import pyarrow as pa
    from ray.data.block import BlockAccessor

    from chute.format.writer import ShardWriter
    from chute.ray.columns import block_samples, chute_schema, plan_block_columns

    data = np.load(raw, mmap_mode="r")
    table = BlockAccessor.batch_to_block({"x": np.asarray(data[:rows]), "label": np.arange(rows)})
    assert isinstance(table, pa.Table)
    columns = plan_block_columns(table.schema, None, "bench")
    t0 = time.perf_counter()
    samples = list(block_samples(table, columns, "bench"))
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        part = ShardWriter(tmp, chute_schema(columns), token="0", shard_size=1 << 40)
        for i, s in enumerate(samples):
            part.append(s, i)
        t2 = time.perf_counter()
        part.flush()
        t3 = time.perf_counter()
    return {"Arrow block -> samples": t1 - t0, "chute column builders (append)": t2 - t1, "shard file (write, fsync, checksum)": t3 - t2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="bench-data")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="reader processes of the plain image conversion")
    args = parser.parse_args()
    import ray

    import chute.ray
    from chute.sources import convert

    os.makedirs(args.data_dir, exist_ok=True)
    _, raw = array_dataset("w2", args.data_dir)
    images = image_folder(args.data_dir, args.images)
    rows = len(np.load(raw, mmap_mode="r"))
    started = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray_start = time.perf_counter() - started
    out = tempfile.mkdtemp(prefix="chute-bench-", dir=args.data_dir)
    print(f"python {sys.version.split()[0]}, ray {ray.__version__}, {os.cpu_count()} CPUs, local Ray with {args.cpus} CPUs "
          f"(started in {ray_start:.1f} s, not counted), median of {args.repeats}")

    def plain_w2():
        data = np.load(raw, mmap_mode="r")
        chute.write(({"x": data[i], "label": i} for i in range(rows)), os.path.join(out, "w2-plain"), overwrite=True).close()

    def ray_w2():
        source = ray.data.range(rows, override_num_blocks=8 * args.cpus).map_batches(w2_rows, fn_kwargs={"raw": raw}, batch_size=None)
        chute.ray.write(source, os.path.join(out, "w2-ray"), overwrite=True).close()

    def ray_small():  # the fixed cost of a write job: planning, the schema probe, scheduling, the commit
        source = ray.data.range(1000, override_num_blocks=2).map_batches(w2_rows, fn_kwargs={"raw": raw}, batch_size=None)
        chute.ray.write(source, os.path.join(out, "small-ray"), overwrite=True).close()

    def plain_images():
        convert(images, os.path.join(out, "img-plain"), kind="images", workers=args.workers, overwrite=True, progress=False).close()

    def ray_images():
        convert(images, os.path.join(out, "img-ray"), kind="images", ray="local", overwrite=True).close()

    try:
        results = []
        for label, plain, on_ray, n in (("W2", plain_w2, ray_w2, rows), (f"images ({args.images:,} PNG)", plain_images, ray_images, args.images)):
            t_plain, t_ray = timed(plain, args.repeats), timed(on_ray, args.repeats)
            results.append((label, n, t_plain, t_ray))
        print(f"  {'':28s} {'one process s':>14s} {'rows/s':>10s} {'Ray s':>8s} {'rows/s':>10s} {'Ray / one':>10s}")
        for label, n, t_plain, t_ray in results:
            print(f"  {label:28s} {t_plain:14.2f} {n / t_plain:10,.0f} {t_ray:8.2f} {n / t_ray:10,.0f} {t_plain / t_ray:10.2f}x")
        print("  (plain image conversion: %d reader processes + the writing process)" % args.workers)
        small = timed(ray_small, args.repeats)
        print(f"  a chute.ray.write job of 1,000 W2 rows (the fixed cost of a job): {small:.2f} s")
        steps = where_the_time_goes(raw)
        total = sum(steps.values())
        print("  where a write task's time goes, per 10,000 W2 rows, in-process:")
        for name, seconds in steps.items():
            print(f"    {name:40s} {seconds:7.3f} s  {seconds / total:5.0%}")
        jobs = [{"label": f"{label} ({n:,} rows)" if label == "W2" else label, "rows": n, "plain_s": t_plain,
                 "plain_per_s": n / t_plain, "ray_s": t_ray, "ray_per_s": n / t_ray, "ratio": t_plain / t_ray}
                for label, n, t_plain, t_ray in results]
        jobs.append({"label": "a `chute.ray.write` job of 1,000 W2 rows (the fixed cost of a job)", "rows": 1000, "ray_s": small})
        save("ray_convert", {
            "jobs": {
                "title": "conversion",
                "columns": [["plain_s", "one process s", ".2f"], ["plain_per_s", "rows/s", ",.0f"], ["ray_s", "Ray s", ".2f"],
                            ["ray_per_s", "rows/s", ",.0f"], ["ratio", "Ray speed / one process", ".2f"]],
                "rows": jobs,
                "notes": (f"medians of {args.repeats} runs; local Ray with {args.cpus} CPUs, started once ({ray_start:.1f} s, "
                          f"not counted); the plain image conversion uses {args.workers} reader processes and the writing process"),
            },
            "task": {
                "title": "a write task, per 10,000 W2 rows",
                "columns": [["seconds", "s", ".3f"], ["share", "% of the task", ".0f"]],
                "rows": [{"label": name, "seconds": seconds, "share": 100 * seconds / total} for name, seconds in steps.items()],
                "notes": "measured in one process on one block of W2 rows, the steps a chute.ray.write task runs",
            },
        })
    finally:
        ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
