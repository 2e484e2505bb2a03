"""Conversion speed of the HDF5, Zarr, LMDB and TFRecord sources against their own library reading the same data whole.

For each source the same data is made once in --data, then, alternating in this
process, --repeats times:

  library     the source's own library reads every value into memory in this process:
              h5py ``f[name][()]`` / zarr ``array[:]`` for every column; an LMDB cursor
              over every key, unpickling each value; every TFRecord record framed,
              CRC-checked (google-crc32c) and parsed as a ``tf.train.Example`` by
              protobuf, each feature's values as a numpy array (what a TF pipeline's
              parse gives). Nothing is written.
  workers=N   ``chute.sources.convert(src, dst, workers=N)`` end to end: scan, read,
              decode, write the dataset (one record batch per shard, fsync, checksums),
              open it (N reader processes; 0 reads in this process)

Ratios are of medians of the same run (rows/s of chute / rows/s of the library).
The table goes through benchmarks/_results.py (convert_sources.json, table "rates").

    python benchmarks/convert_sources.py                       # every source, workers 0 and 2
    python benchmarks/convert_sources.py --only hdf5-gzip --repeats 5
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import cpu_seconds, save  # noqa: E402

WIDTH = 64  # float32 values per row of the main column


def _values(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((rows, WIDTH)).astype(np.float32), "label": rng.integers(0, 1000, rows),
            "weight": rng.standard_normal(rows)}


def make_hdf5(path: str, rows: int, gzip: bool) -> None:
    import h5py

    options = {"chunks": (4096,), "compression": "gzip"} if gzip else {}
    with h5py.File(path + ".tmp", "w") as f:
        for name, value in _values(rows).items():
            chunked = {**options, "chunks": (4096, *value.shape[1:])} if gzip else {}
            f.create_dataset(name, data=value, **chunked)
    os.replace(path + ".tmp", path)


def read_hdf5(path: str) -> int:
    import h5py

    with h5py.File(path, "r") as f:
        return len([f[name][()] for name in f][0])


def make_zarr(path: str, rows: int) -> None:
    import zarr

    group = zarr.open_group(path + ".tmp", mode="w")
    for name, value in _values(rows).items():
        group.create_array(name, shape=value.shape, chunks=(8192, *value.shape[1:]), dtype=value.dtype)[:] = value
    os.replace(path + ".tmp", path)


def read_zarr(path: str) -> int:
    import zarr

    group = zarr.open_group(path, mode="r")
    return len([group[name][:] for name in ("x", "label", "weight")][0])


def make_lmdb(path: str, rows: int) -> None:
    import lmdb

    values = _values(rows)
    env = lmdb.open(path + ".tmp", map_size=1 << 34)
    with env.begin(write=True) as txn:
        for i in range(rows):
            sample = {"x": values["x"][i], "label": int(values["label"][i]), "weight": float(values["weight"][i])}
            txn.put(f"{i:09d}".encode(), pickle.dumps(sample, protocol=4))
    env.close()
    os.replace(path + ".tmp", path)


def read_lmdb(path: str) -> int:
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False)
    count = 0
    with env.begin(buffers=False) as txn:
        for _, value in txn.cursor():
            pickle.loads(value)
            count += 1
    env.close()
    return count


def make_tfrecord(path: str, rows: int) -> None:
    from chute.sources._example_pb import Example
    from chute.sources.tfrecord import frame

    values = _values(rows)
    with open(path + ".tmp", "wb") as f:
        for i in range(rows):
            ex = Example()
            feature = ex.features.feature
            feature["x"].float_list.value.extend(values["x"][i].tolist())
            feature["label"].int64_list.value.append(int(values["label"][i]))
            feature["weight"].float_list.value.append(float(values["weight"][i]))
            f.write(frame(ex.SerializeToString()))
    os.replace(path + ".tmp", path)


def read_tfrecord(path: str) -> int:
    from chute.sources._example_pb import Example
    from chute.sources.tfrecord import masked_crc

    count = 0
    with open(path, "rb") as f:
        while header := f.read(12):
            length, length_crc = struct.unpack("<QI", header)
            assert masked_crc(header[:8]) == length_crc
            data = f.read(length)
            assert masked_crc(data) == struct.unpack("<I", f.read(4))[0]
            features = Example.FromString(data).features.feature
            {name: np.asarray(getattr(feat, feat.WhichOneof("kind")).value) for name, feat in features.items()}
            count += 1
    return count


SOURCES: dict[str, tuple[str, Callable[[str, int], None], Callable[[str], int]]] = {
    "hdf5": ("sim.h5", lambda p, n: make_hdf5(p, n, False), read_hdf5),
    "hdf5-gzip": ("sim-gzip.h5", lambda p, n: make_hdf5(p, n, True), read_hdf5),
    "zarr": ("sim.zarr", make_zarr, read_zarr),
    "lmdb": ("samples.lmdb", make_lmdb, read_lmdb),
    "tfrecord": ("samples.tfrecord", make_tfrecord, read_tfrecord),
}
LIBRARY = {
    "hdf5": "h5py reads every dataset whole",
    "hdf5-gzip": "h5py reads every dataset whole",
    "zarr": "zarr reads every array whole",
    "lmdb": "lmdb cursor over every key + pickle.loads",
    "tfrecord": "framing + CRCs + protobuf Example parse, values as arrays",
}


def _per_cpu(rows: int, seconds: float) -> float | None:
    """Rows per CPU second, or None under 0.05 s (the clock ticks every 10 ms: a figure it cannot resolve)."""
    return rows / seconds if seconds >= 0.05 else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default=",".join(SOURCES))
    parser.add_argument("--data", default="bench-data")
    args = parser.parse_args()

    from chute.sources import convert

    os.makedirs(args.data, exist_ok=True)
    workers = [int(w) for w in args.workers.split(",")]
    print(f"{args.rows:,} rows of float32[{WIDTH}] + int64 + float64 per source; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    rows_out = []
    out = tempfile.mkdtemp(prefix="chute-convert-bench-")
    try:
        for name in args.only.split(","):
            file, make, read = SOURCES[name]
            src = os.path.join(args.data, f"{args.rows}-{file}")
            if not os.path.exists(src):
                make(src, args.rows)
            read(src)  # warm the page cache: every run reads from memory
            rates: dict[str, list[float]] = {"library": [], **{f"workers={w}": [] for w in workers}}
            per_cpu: dict[str, list[float]] = {key: [] for key in rates}  # rows per CPU second: what load changes least
            for _ in range(args.repeats):
                start, cpu = time.perf_counter(), cpu_seconds()
                assert read(src) == args.rows
                rates["library"].append(args.rows / (time.perf_counter() - start))
                per_cpu["library"].append(_per_cpu(args.rows, cpu_seconds() - cpu))
                for w in workers:
                    start, cpu = time.perf_counter(), cpu_seconds()
                    ds = convert(src, os.path.join(out, "ds"), workers=w, overwrite=True, progress=False,
                                 **({"allow_pickle": True} if name == "lmdb" else {}))
                    rates[f"workers={w}"].append(args.rows / (time.perf_counter() - start))
                    per_cpu[f"workers={w}"].append(_per_cpu(args.rows, cpu_seconds() - cpu))
                    assert len(ds) == args.rows
                    ds.close()
                print(f"  {name}: " + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in rates.items())
                      + f" (load average {os.getloadavg()[0]:.1f})", flush=True)
            base = statistics.median(rates["library"])
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs) if os.path.isdir(src) \
                else os.path.getsize(src)
            for key, values in rates.items():
                median = statistics.median(values)
                label = f"{name}: {LIBRARY[name]}" if key == "library" else f"{name}: `chute convert --{key.replace('=', ' ')}`"
                rows_out.append({"label": label, "rows_s": median, "mb_s": median * size / args.rows / 1e6,
                                 "ratio": median / base, "rows_cpu_s": _median(per_cpu[key]),
                                 "runs": ", ".join(f"{v:,.0f}" for v in values)})
                print(f"  {label:70s} {median:12,.0f} rows/s  {median / base:5.2f}x", flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    save("convert_sources", {"rates": {
        "title": f"{args.rows:,} rows (float32[{WIDTH}], int64, float64)",
        "columns": [["rows_s", "rows/s", ",.0f"], ["mb_s", "source MB/s", ",.0f"], ["ratio", "/ library", ".2f"],
                    ["rows_cpu_s", "rows per CPU second", ",.0f"], ["runs", "runs (rows/s)", ""]],
        "rows": rows_out,
        "notes": (f"medians of {args.repeats} runs, the library and chute alternated in one process, the source in the page "
                  "cache; chute end to end: scan, read, decode, write (fsync, checksums), open. `/ library`: chute's rows/s "
                  "over the library's in the same run; CPU seconds (not shown under 0.05 s a run): this process and its reader processes, user + system. The machine "
                  "was shared with other jobs (its load average below): the reader processes had little CPU to themselves."),
    }}, command="python benchmarks/" + os.path.basename(__file__) + " " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
