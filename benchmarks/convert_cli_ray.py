"""`chute convert --ray local` against the plain `chute convert`, end to end as a user runs them.

Each run is a fresh `chute convert` process (so the Ray run pays for starting Ray,
as it does for a user), on image folders of --sizes PNG files (32x32, 10 classes).
Prints the median wall time of --repeats runs of each, and their ratio.

    python benchmarks/convert_cli_ray.py --sizes 2000 20000 --repeats 5

Results go to benchmarks/results/convert_cli_ray.json through benchmarks/_results.py: table "cli"
(docs/benchmarks.md draws it with benchmarks/tables.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import save  # noqa: E402
from ray_convert import image_folder  # noqa: E402


def run(src: str, dst: str, ray: bool) -> float:
    shutil.rmtree(dst, ignore_errors=True)
    argv = [sys.executable, "-m", "chute", "convert", src, dst, "--quiet"] + (["--ray", "local"] if ray else [])
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", default="bench-data")
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="chute-ray-cli-")
    rows = []
    try:
        for size in args.sizes:
            src = image_folder(args.data, size)
            plain = statistics.median(run(src, os.path.join(out, "plain"), False) for _ in range(args.repeats))
            on_ray = statistics.median(run(src, os.path.join(out, "ray"), True) for _ in range(args.repeats))
            print(f"{size:>7,} images: plain {plain:6.2f} s, --ray local {on_ray:6.2f} s ({on_ray / plain:.1f}x)", flush=True)
            rows.append({"label": f"{size:,} PNG images (32x32, 10 classes)", "images": size, "plain_s": plain,
                         "ray_s": on_ray, "ratio": on_ray / plain})
        save("convert_cli_ray", {"cli": {
            "title": "`chute convert`, end to end",
            "columns": [["plain_s", "plain s", ".2f"], ["ray_s", "`--ray local` s", ".2f"], ["ratio", "Ray time / plain", ".2f"]],
            "rows": rows,
            "notes": f"medians of {args.repeats} runs, each a fresh `chute convert` process (the Ray run pays for starting Ray)",
        }})
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
