"""Fuzz manifest parsing: many more cases than the test suite runs.

    python benchmarks/fuzz_manifest.py --cases 20000 [--seed 0]

Each case changes fields of a valid manifest (or replaces its text), opens the
dataset and reads it (length, verify(), first and last rows) with the strategies
of tests/format/manifest_fuzz.py. Prints the count of each outcome; any
exception that is not a chute error is a failure, printed with its manifest, and
makes the exit status 1.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import chute  # noqa: E402
from tests.format import manifest_fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from hypothesis import HealthCheck, given, seed, settings

    root = os.path.join(tempfile.mkdtemp(prefix="chute-fuzz-manifest-"), "ds")
    base = manifest_fuzz.write_base(root)
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[tuple[str, str]] = []

    @seed(args.seed)
    @settings(max_examples=args.cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(manifest_fuzz.changes(base))
    def case(text: str) -> None:
        try:
            manifest_fuzz.open_and_read(root, text)
            outcomes["opened and read"] += 1
        except chute.ChuteError as exc:
            outcomes[type(exc).__name__] += 1
        except Exception as exc:  # noqa: BLE001 - the finding
            outcomes[f"NOT A CHUTE ERROR: {type(exc).__name__}"] += 1
            failures.append((text[:2000], traceback.format_exc(limit=6)))

    start = time.perf_counter()
    case()
    seconds = time.perf_counter() - start
    print(f"{sum(outcomes.values())} fuzzed manifests in {seconds:.1f} s (seed {args.seed})")
    for name, count in outcomes.most_common():
        print(f"  {count:7d}  {name}")
    for text, trace in failures[:10]:
        print("-" * 70)
        print(text)
        print(trace)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
