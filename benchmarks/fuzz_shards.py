"""Fuzz shard reading with single-byte corruptions: more cases than the test suite runs.

    python benchmarks/fuzz_shards.py [--cases 2000] [--seed 0]

Writes a small dataset with a column of every kind (tests/format/corruption.py),
flips one byte of one shard per case, and reads every row in a child process,
with the default ``verify=True`` (checksum and structure) and with
``verify=False`` (structure only). Prints the count of each outcome: ``exact``,
``shard_error`` (detected), ``wrong`` (a silently different value), ``error:<type>``
(an exception that is not a ShardError), ``crash``, ``hang``. Exit status 1 if
the verified reads gave anything but exact data or a ShardError.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.format import corruption  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    root = os.path.join(tempfile.mkdtemp(prefix="chute-fuzz-shards-"), "ds")
    corruption.write_reference(root)
    cases = corruption.make_cases(root, args.cases, seed=args.seed)
    failed = False
    for verify in (True, False):
        start = time.perf_counter()
        result = corruption.fuzz(root, cases, verify=verify)
        label = "verify=True (checksum + structure)" if verify else "verify=False (structure only)"
        print(f"{label}: {len(cases)} single-byte corruptions in {time.perf_counter() - start:.1f} s (seed {args.seed})")
        for name, count in sorted(result["counts"].items(), key=lambda kv: -kv[1]):
            print(f"  {count:6d}  {name}")
        if verify and result["bad"]:
            failed = True
            for case, outcome in list(result["bad"].values())[:10]:
                print(f"  BAD {case}: {outcome}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
