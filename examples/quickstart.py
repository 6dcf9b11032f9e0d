"""Quickstart: fnmap.map over 1,000 items on the embedded emulator (no cloud account needed).

    python examples/quickstart.py
"""

import math
import time

import fnmap


def collatz_steps(n: int) -> int:
    """Steps for n to reach 1 under the Collatz map: a small, pure-Python unit of work."""
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def main() -> None:
    items = range(1, 1001)
    start = time.perf_counter()
    job = fnmap.map(collatz_steps, items, chunksize=10, return_job=True)
    results = job.results()
    elapsed = time.perf_counter() - start
    assert results == [collatz_steps(n) for n in items], "results differ from a local run"
    longest = max(range(len(results)), key=results.__getitem__)
    summary = job.summary()
    print(f"fnmap quickstart: {len(results)} items in {summary['calls']} calls on the "
          f"{summary['backend']} backend, {elapsed:.2f} s")
    print(f"  longest Collatz chain below 1000 starts at {longest + 1} ({results[longest]} steps)")
    print(f"  mean steps {sum(results) / len(results):.1f}, "
          f"geometric mean {math.exp(sum(math.log(r + 1) for r in results) / len(results)) - 1:.1f}")
    print(f"  retries {summary['retries']}, failed items {summary['failed_items']}, job {summary['job_id']}")


if __name__ == "__main__":
    main()
