"""How long a starting worker pool makes its first call wait: ``python benchmarks/first_worker.py [--runs N]``.

A shared emulator starts a pool of workers for each client that attaches (4 on 2 cores), and the
client's first call takes the first idle worker it is handed, waiting for that worker to start.
Each run starts a pool of ``--workers`` from the warm fork server, as a session does, and times
from the start until the worker the first call gets is ready.  Run it with another checkout
first on ``PYTHONPATH`` to compare (``PYTHONPATH=/path/to/checkout python benchmarks/first_worker.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=21, help="pools started (default 21)")
    p.add_argument("--workers", type=int, default=4, help="workers per pool (default 4, a session's on 2 cores)")
    args = p.parse_args(argv)
    import fnmap
    from fnmap.emulator.pool import WorkerPool, start_fork_server

    start_fork_server()
    waits = []
    for _ in range(args.runs):
        pool = WorkerPool(args.workers, start=False)
        started = time.perf_counter()
        pool.start()
        worker = pool._idle.get()  # what the first call gets
        worker.wait_ready()
        waits.append(time.perf_counter() - started)
        pool._idle.put(worker)
        pool.close()
    print(f"fnmap from {os.path.dirname(os.path.dirname(fnmap.__file__))}; load average {os.getloadavg()[0]:.2f}")
    print(f"first call's worker ready after the pool's start: median {statistics.median(waits) * 1e3:.1f} ms, "
          f"min {min(waits) * 1e3:.1f} ms, max {max(waits) * 1e3:.1f} ms ({args.runs} pools of {args.workers})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
