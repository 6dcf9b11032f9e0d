"""Make docs/timeline.png: the timeline of a 200-call job on the local emulator.

    python docs/make_timeline.py [PATH] [--workers N]

The job is made to show every phase: call durations vary (a log-normal sleep
plus a little CPU work), the first call on each worker process is a cold start
(unpickling the function imports NumPy, which it closes over), one call
crashes its worker once and is retried, and one call raises.  Its records go
to a temporary storage folder, which is printed, so ``fnmap job ID --storage
URL`` can be tried on it afterwards.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import fnmap


def make_work(marker: str):
    import numpy as np

    scale = np.float64(
        1.0
    )  # travels by reference: a cold worker imports NumPy to load the function

    def work(i: int) -> float:
        import math
        import random
        import time

        rng = random.Random(i)
        time.sleep(min(1.5, rng.lognormvariate(math.log(0.12), 0.5)))
        if i == 37 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # a crashed worker: the call is retried on another one
        if i == 150:
            raise ValueError("item 150 is malformed")
        return float(scale * sum(k * k for k in range(20_000 + i)))

    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "path",
        nargs="?",
        default=str(pathlib.Path(__file__).with_name("timeline.png")),
        help="where to write the PNG (default: docs/timeline.png)",
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="emulator worker processes (default 8)"
    )
    parser.add_argument("--calls", type=int, default=200, help="calls in the job (default 200)")
    args = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="fnmap-timeline-")
    storage = pathlib.Path(scratch, "storage").as_uri()
    job = fnmap.map(
        make_work(os.path.join(scratch, "crashed")),
        range(args.calls),
        workers=args.workers,
        storage=storage,
        return_job=True,
        progress=True,
    )
    results = job.results(return_exceptions=True)
    job.wait(60)
    failed = sum(isinstance(r, BaseException) for r in results)
    job.plot(args.path)
    s = job.record()["summary"]
    print(
        f"{args.path}: {s['calls']} calls, {failed} failed, {s['retries']} retried, "
        f"{s['cold_starts']} cold starts, wall {s['wall_seconds']:.1f} s, "
        f"p50 {s['duration_seconds']['p50']:.3f} s, p95 {s['duration_seconds']['p95']:.3f} s"
    )
    print(f"inspect it: fnmap job {job.id[:12]} --storage {storage}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
