"""How long a fresh process waits for its first call: ``python benchmarks/first_call.py [--runs N]``.

Each run is a fresh interpreter that imports the system, then times one map of one call from
the map's start to the moment the call runs (the function returns ``time.time()``), and the
whole map.  Systems, alternating run by run:

* ``fnmap-shared``: the default, attaching to the emulator the user's processes share (started
  once before the runs);
* ``fnmap-first``: the same with no emulator up (each run stops the shared one first, so it
  starts it: what the first script of the day, or the first after ``emulator_idle``, pays);
* ``fnmap-own``: ``FNMAP_EMULATOR_IDLE=0``, an emulator per process (the earlier default);
* ``pool``: ``multiprocessing.Pool(2)`` created inside the timed part, as a script would.

Bytecode: an installed package has its ``.pyc`` files written at install time; an editable
checkout writes them on first import unless ``PYTHONDONTWRITEBYTECODE`` is set, in which case every
fresh interpreter compiles fnmap from source (0.2 s here).  The runs drop that variable so fnmap is
measured as installed, like its peers from wheels; ``--keep-env`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
system = sys.argv[1]
if system == "pool":
    t0 = time.time()
    import multiprocessing
    with multiprocessing.Pool(2) as pool:
        ran = pool.apply(time.time)
else:
    import fnmap
    t0 = time.time()
    ran = fnmap.map(lambda _: time.time(), [0], chunksize=1, progress=False)[0]
print(json.dumps({"first_call": ran - t0, "total": time.time() - t0}))
"""


def run_child(system: str, env: dict) -> dict:
    if system == "fnmap-first":
        subprocess.run([sys.executable, "-m", "fnmap", "emulator", "stop"], env=env, capture_output=True, check=True)
    child_env = dict(env, FNMAP_EMULATOR_IDLE="0") if system == "fnmap-own" else env
    out = subprocess.run([sys.executable, "-c", CHILD, system.split("-")[0]], env=child_env, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{system} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7, help="runs per system (default 7)")
    p.add_argument("--keep-env", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = p.parse_args(argv)
    env = dict(os.environ)
    if not args.keep_env:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("FNMAP_EMULATOR_IDLE", None)
    systems = ["fnmap-shared", "fnmap-first", "fnmap-own", "pool"]
    run_child("fnmap-shared", env)  # writes the .pyc files and starts the shared emulator
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for i in range(args.runs):
        for system in systems[i % len(systems):] + systems[:i % len(systems)]:
            results[system].append(run_child(system, env))
    print(f"median of {args.runs} fresh processes; load average {os.getloadavg()[0]:.2f}")
    print(f"{'system':14} {'first call s':>12} {'whole map s':>12}")
    for system in systems:
        first = statistics.median(r["first_call"] for r in results[system])
        total = statistics.median(r["total"] for r in results[system])
        print(f"{system:14} {first:12.3f} {total:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
