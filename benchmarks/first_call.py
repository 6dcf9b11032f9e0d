"""How long a fresh process waits for its first call: ``python benchmarks/first_call.py [--runs N]
[--whole-runs N] [--before CHECKOUT]``.

**Whole process** (first): what a script that maps once costs, measured from outside as the wall
time of a fresh interpreter from its start to its exit, over ``python -c pass`` measured alike:

* ``pass``: ``python -c pass``, the floor every script pays;
* ``pool``: ``import multiprocessing`` and ``multiprocessing.Pool(2).map(abs, [-1])``;
* ``fnmap``: ``import fnmap`` and ``fnmap.map(abs, [-1])`` on the shared emulator (up already),
  with this checkout's fnmap (its folder first on ``PYTHONPATH``);
* ``fnmap@NAME``: the same with another checkout's fnmap (``--before /path/to/NAME``, repeatable),
  so that a change is measured against its base in one run, on the same loaded machine.

Each system's figure is the median over ``--whole-runs`` processes (order rotated run by run);
its cost is that minus ``pass``'s, and the ratio is that cost over ``pool``'s.

**First call** (then): each run is a fresh interpreter that imports the system, then times one map of one call from
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
import tempfile
import time

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


WHOLE = {
    "pass": "pass",
    "pool": "import multiprocessing\nwith multiprocessing.Pool(2) as pool:\n    pool.map(abs, [-1])",
    "fnmap": "import fnmap\nfnmap.map(abs, [-1])",
}


def whole_process(env: dict, runs: int, before: list[str]) -> None:
    """Print the whole-process table (see the module's docstring)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    systems = {"pass": (WHOLE["pass"], env), "pool": (WHOLE["pool"], env),
               "fnmap": (WHOLE["fnmap"], dict(env, PYTHONPATH=here))}
    for checkout in before:
        checkout = os.path.abspath(checkout)
        systems[f"fnmap@{os.path.basename(checkout)}"] = (WHOLE["fnmap"], dict(env, PYTHONPATH=checkout))
    names = list(systems)
    for name in names:  # bytecode written, each checkout's shared emulator started
        _wall(*systems[name])
    walls: dict[str, list[float]] = {name: [] for name in names}
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            walls[name].append(_wall(*systems[name]))
    median = {name: statistics.median(walls[name]) for name in names}
    cost = {name: median[name] - median["pass"] for name in names}
    print(f"whole process, median of {runs} fresh processes each; load average {os.getloadavg()[0]:.2f}")
    width = max(14, *map(len, names))
    print(f"{'system':{width}} {'wall s':>8} {'over pass s':>12} {'x pool':>8}")
    for name in names:
        ratio = f"{cost[name] / cost['pool']:8.2f}" if name != "pass" else f"{'':8}"
        print(f"{name:{width}} {median[name]:8.3f} {cost[name]:12.3f} {ratio}")


def _wall(code: str, env: dict) -> float:
    started = time.perf_counter()
    # From a folder of no checkout: ``python -c`` puts its working folder first on the path.
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{code!r} failed:\n{done.stderr}")
    return wall


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
    p.add_argument("--runs", type=int, default=7, help="first-call runs per system (default 7; 0: none)")
    p.add_argument("--whole-runs", type=int, default=21, help="whole-process runs per system (default 21; 0: none)")
    p.add_argument("--before", metavar="CHECKOUT", action="append", default=[],
                   help="a checkout of fnmap to measure too, as fnmap@NAME (repeatable)")
    p.add_argument("--keep-env", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    args = p.parse_args(argv)
    env = dict(os.environ)
    if not args.keep_env:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("FNMAP_EMULATOR_IDLE", None)
    if args.whole_runs:
        whole_process(env, args.whole_runs, args.before)
    if not args.runs:
        return 0
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
