"""Micro-benchmark of chute._native against the best plain numpy / pyarrow way to do the same job.

Single-threaded, data in RAM. Each case runs its candidates interleaved, --repeats
times; it prints the median rows/s and MB/s of each, and the median over repeats of
the ratio to the case's reference (both measured in the same repeat).

  W2 gather     200,000 rows of 3072 bytes (uint8[3,32,32]) in 5 shards, batch 256,
                vs numpy fancy indexing x[idx] of one array holding the same rows;
                also the int64 labels (8-byte rows) alone and in the same call
  W3 gather     1 MiB rows (--w3-rows of them) in 5 shards, batch 8, vs copying the
                same number of bytes from one contiguous place (np.copyto, a memcpy)
  W1 dicts      maps of 10 random 5-digit str keys -> 5-digit str values, batch 64:
                take_dicts vs pyarrow take().to_pylist(maps_as_pydicts="strict") vs
                dict(pairs) over to_pylist()'s pair lists vs dict(zip(keys, values))
                over ready Python lists (the floor of building dicts in Python)
  strings       a large_string column of 5-digit strings, batch 256: take_objects vs
                pyarrow take().to_pylist()
  feistel       chute.order.permutation (native) vs the numpy implementation
  planes        a 224 x 224 crop of an RGB image laid out as planes (chute.images' last step per image):
                _native.planes vs numpy's copy of the transposed view, plain and mirrored, and a memcpy
                of the same bytes

    python benchmarks/native.py                   # everything, 7 repeats
    python benchmarks/native.py --only w1 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from _results import save

from chute import _native
from chute.order import _permutation_numpy, permutation


def offsets_of(rows: list[int]) -> np.ndarray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=offsets[1:])
    return offsets


def split_rows(x: np.ndarray, shards: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``x`` cut into ``shards`` C-contiguous row blocks (views, no copy) and their offsets."""
    cuts = np.linspace(0, len(x), shards + 1).astype(np.int64)
    return [x[cuts[i] : cuts[i + 1]] for i in range(shards)], cuts


TABLES: dict[str, dict] = {}


def run_case(title: str, candidates: dict[str, Callable[[int], None]], batches: int, rows_per_batch: int,
             bytes_per_row: float, repeats: int, key: str | None = None) -> None:
    """Times each candidate over ``batches`` calls per repeat (interleaved), prints medians and ratios.

    The first candidate is the reference the ratios are taken against.
    """
    for fn in candidates.values():  # warm-up: page faults, caches, lazy imports
        fn(0)
    seconds: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            start = time.perf_counter()
            for b in range(batches):
                fn(b)
            seconds[name].append(time.perf_counter() - start)
    reference = next(iter(candidates))
    labels = {name: f"{name} (reference)" if name == reference else name for name in candidates}
    width = max(len(label) for label in labels.values())
    print(f"\n{title}")
    print(f"  {'':{width}} {'rows/s':>12} {'MB/s':>9} {'x reference':>12}")
    rows = []
    for name, times in seconds.items():
        rate = batches * rows_per_batch / statistics.median(times)
        ratio = statistics.median(r / t for r, t in zip(seconds[reference], times))
        print(f"  {labels[name]:{width}} {rate:12,.0f} {rate * bytes_per_row / 1e6:9,.0f} {ratio:12.2f}")
        rows.append({"label": labels[name], "rows_per_s": rate, "mb_per_s": rate * bytes_per_row / 1e6, "ratio": ratio})
    if key:
        TABLES[key] = {
            "title": title,
            "columns": [["rows_per_s", "rows/s", ",.0f"], ["mb_per_s", "MB/s", ",.0f"], ["ratio", "x reference", ".2f"]],
            "rows": rows,
            "notes": f"one thread, data in RAM; median of {repeats} interleaved repeats, ratios per repeat",
        }


def w2(repeats: int, rng: np.random.Generator) -> None:
    rows, batch, n_batches = 200_000, 256, 200
    images = rng.integers(0, 256, (rows, 3 * 32 * 32), dtype=np.uint8)
    labels = rng.integers(0, 1000, rows, dtype=np.int64)
    image_shards, offsets = split_rows(images, 5)
    label_shards, _ = split_rows(labels, 5)
    batches = [rng.integers(0, rows, batch) for _ in range(n_batches)]
    out_images = np.empty((batch, images.shape[1]), np.uint8)
    out_labels = np.empty(batch, np.int64)
    settings = f"{rows:,} rows in 5 shards, batch {batch}, random indices, 1 thread"
    run_case(
        f"W2 images: 3072-byte rows; {settings}",
        {
            "numpy np.take(x, idx, out=, mode='clip'), one in-RAM array, reused output": lambda b: np.take(
                images, batches[b], axis=0, out=out_images, mode="clip"
            ),
            "numpy x[idx], one in-RAM array, fresh output": lambda b: images[batches[b]],
            "_native.gather, reused output": lambda b: _native.gather(batches[b], offsets, [(image_shards, out_images, 3072)]),
        },
        n_batches, batch, 3072, repeats, key="w2-images",
    )
    run_case(
        f"W2 labels: 8-byte rows; {settings}",
        {
            "numpy np.take(labels, idx, out=, mode='clip'), reused output": lambda b: np.take(labels, batches[b % n_batches], out=out_labels, mode="clip"),
            "numpy labels[idx], fresh output": lambda b: labels[batches[b % n_batches]],
            "_native.gather, reused output": lambda b: _native.gather(
                batches[b % n_batches], offsets, [(label_shards, out_labels, 8)]
            ),
        },
        n_batches * 10, batch, 8, repeats, key="w2-labels",
    )
    run_case(
        f"W2 images + labels; {settings}",
        {
            "numpy np.take(..., out=, mode='clip') of both, reused outputs": lambda b: (
                np.take(images, batches[b], axis=0, out=out_images, mode="clip"), np.take(labels, batches[b], out=out_labels, mode="clip")
            ),
            "numpy x[idx] and labels[idx], fresh outputs": lambda b: (images[batches[b]], labels[batches[b]]),
            "_native.gather, both columns in one call, reused outputs": lambda b: _native.gather(
                batches[b], offsets, [(image_shards, out_images, 3072), (label_shards, out_labels, 8)]
            ),
        },
        n_batches, batch, 3080, repeats, key="w2-both",
    )


def w3(repeats: int, rng: np.random.Generator, rows: int) -> None:
    row_bytes, batch, n_batches = 1 << 20, 8, 40
    data = np.ones((rows, row_bytes), np.uint8)  # ones, not zeros: every page really allocated
    shards, offsets = split_rows(data, 5)
    batches = [rng.integers(0, rows, batch) for _ in range(n_batches)]
    starts = [int(s) for s in rng.integers(0, rows - batch, n_batches)]
    out = np.empty((batch, row_bytes), np.uint8)
    run_case(
        f"W3: 1 MiB rows; {rows:,} rows ({rows / 1024:.1f} GiB) in 5 shards, batch {batch}, random indices, 1 thread",
        {
            "memcpy of 8 MiB from one contiguous place (np.copyto)": lambda b: np.copyto(
                out, data[starts[b] : starts[b] + batch]
            ),
            "numpy np.take(x, idx, out=, mode='clip'), reused output": lambda b: np.take(data, batches[b], axis=0, out=out, mode="clip"),
            "_native.gather": lambda b: _native.gather(batches[b], offsets, [(shards, out, row_bytes)]),
        },
        n_batches, batch, row_bytes, repeats, key="w3",
    )


def map_source(array: pa.MapArray) -> tuple:
    b = array.buffers()
    return b[1], b[4], b[5], b[7], b[8]


def w1(repeats: int, rng: np.random.Generator) -> None:
    rows, batch, n_batches = 50_000, 64, 200

    def five_digits(n):
        return [str(v) for v in rng.integers(10_000, 100_000, n)]

    samples = [dict(zip(five_digits(10), five_digits(10))) for _ in range(rows)]
    map_type = pa.map_(pa.large_string(), pa.large_string())
    cuts = np.linspace(0, rows, 6).astype(np.int64)
    shards = [pa.array([list(s.items()) for s in samples[cuts[i] : cuts[i + 1]]], map_type) for i in range(5)]
    column = pa.concat_arrays(shards)
    sources = [map_source(a) for a in shards]
    batches = [rng.integers(0, rows, batch) for _ in range(n_batches)]
    key_lists = [list(s) for s in samples]
    value_lists = [list(s.values()) for s in samples]
    assert _native.take_dicts(batches[0], cuts, sources, "str") == [samples[i] for i in batches[0]]
    run_case(
        f"W1 dicts: 10 random 5-digit str keys -> 5-digit str values; {rows:,} rows in 5 shards, batch {batch}, 1 thread",
        {
            "pyarrow take().to_pylist(maps_as_pydicts='strict')": lambda b: column.take(batches[b]).to_pylist(
                maps_as_pydicts="strict"
            ),
            "pyarrow take().to_pylist() pairs, dict(pairs)": lambda b: [
                dict(p) for p in column.take(batches[b]).to_pylist()
            ],
            "dict(zip(keys, values)) over ready Python lists": lambda b: [
                dict(zip(key_lists[i], value_lists[i])) for i in batches[b].tolist()
            ],
            "_native.take_dicts": lambda b: _native.take_dicts(batches[b], cuts, sources, "str"),
        },
        n_batches, batch, 100, repeats, key="w1-dicts",
    )

    strings = [pa.array(five_digits(int(cuts[i + 1] - cuts[i])), pa.large_string()) for i in range(5)]
    string_column = pa.concat_arrays(strings)
    string_sources = [(a.buffers()[1], a.buffers()[2]) for a in strings]
    string_batches = [rng.integers(0, rows, 256) for _ in range(n_batches)]
    run_case(
        f"strings: 5-character str; {rows:,} rows in 5 shards, batch 256, 1 thread",
        {
            "pyarrow take().to_pylist()": lambda b: string_column.take(string_batches[b]).to_pylist(),
            "_native.take_objects": lambda b: _native.take_objects(string_batches[b], cuts, string_sources, "str"),
        },
        n_batches, 256, 5, repeats, key="strings",
    )


def feistel(repeats: int) -> None:
    for n in (200_000, 2_000_000):
        run_case(
            f"feistel: the order's permutation of range({n:,}), 1 thread",
            {
                "numpy (chute.order._permutation_numpy)": lambda b: _permutation_numpy(n, b),
                "_native.feistel (chute.order.permutation)": lambda b: permutation(n, b),
            },
            3, n, 8, repeats, key=f"feistel-{n}",
        )


def planes(repeats: int, rng: np.random.Generator) -> None:
    # an image as a decoder gives it (uint8 [256, 256, 3]) and a 224 x 224 crop laid out as planes (uint8 [3, 224, 224])
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(8)]
    out = np.empty((3, 224, 224), np.uint8)
    flat = np.empty(out.size, np.uint8)
    x0, y0 = 17, 9
    crops = [image[y0:y0 + 224, x0:x0 + 224].transpose(2, 0, 1) for image in images]
    run_case(
        "planes: a 224 x 224 crop of an RGB image (HWC) laid out as planes (CHW), 1 thread",
        {
            "numpy np.copyto(out, crop.transpose(2, 0, 1))": lambda b: np.copyto(out, crops[b % 8]),
            "numpy, mirrored (crop[:, :, ::-1])": lambda b: np.copyto(out, crops[b % 8][:, :, ::-1]),
            "_native.planes": lambda b: _native.planes(images[b % 8], 256, 256, x0, y0, out, 224, 224, False),
            "_native.planes, mirrored": lambda b: _native.planes(images[b % 8], 256, 256, x0, y0, out, 224, 224, True),
            "memcpy of the same bytes (np.copyto, contiguous: the limit)": lambda b: np.copyto(out.reshape(-1), flat),
        },
        2000, 1, out.nbytes, repeats, key="planes",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["w2", "w3", "w1", "feistel", "planes"], action="append")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per case (median reported)")
    parser.add_argument("--w3-rows", type=int, default=512, help="1 MiB rows held in RAM for W3")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5 (medians of at least 5 runs)")
    rng = np.random.default_rng(0)
    only = set(args.only or ["w2", "w3", "w1", "feistel", "planes"])
    print(f"chute._native micro-benchmark: medians of {args.repeats} repeats")
    if "w2" in only:
        w2(args.repeats, rng)
    if "w3" in only:
        w3(args.repeats, rng, args.w3_rows)
    if "w1" in only:
        w1(args.repeats, rng)
    if "feistel" in only:
        feistel(args.repeats)
    if "planes" in only:
        planes(args.repeats, rng)
    save("native", TABLES)


if __name__ == "__main__":
    main()
