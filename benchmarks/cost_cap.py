"""What ``max_cost`` costs the client: the same map with and without a cap, side by side.

    python benchmarks/cost_cap.py [--items 3000] [--rounds 5] [--backend local]

Runs ``fnmap.map(abs, range(items), chunksize=1)`` in fresh processes, alternately without a cap
and with one far above what it costs (so the map runs to its end: the cap's own work is measured,
its estimate before the start, its admission and pricing of each attempt, and its first wave of
four calls until one is priced).  Prints the median wall seconds of each and their ratio, paired
round by round.  The target: a capped map within 10% of an uncapped one (ratio <= 1.10).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

_RUN = """
import sys, fnmap
cap = float(sys.argv[1]) if sys.argv[1] != "none" else None
out = fnmap.map(abs, range({items}), backend="{backend}", chunksize=1, max_cost=cap, storage=sys.argv[2])
assert out == list(range({items}))
"""


def _time(code: str, cap: str, storage: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, cap, storage], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="local")
    args = parser.parse_args()
    code = _RUN.format(items=args.items, backend=args.backend)
    with tempfile.TemporaryDirectory() as folder:
        storage = f"file://{folder}"
        _time(code, "none", storage)  # warm the file cache and the storage's folders
        plain, capped = [], []
        for _ in range(args.rounds):
            plain.append(_time(code, "none", storage))
            capped.append(_time(code, "100", storage))
    ratios = [c / p for c, p in zip(capped, plain, strict=True)]
    print(f"{args.items} calls on {args.backend}, {args.rounds} rounds: no cap {statistics.median(plain):.3f} s, "
          f"max_cost=100 {statistics.median(capped):.3f} s, capped/uncapped {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}); target <= 1.10")


if __name__ == "__main__":
    main()
