"""What a day's work leaves running: ``python benchmarks/shared_day.py [--tree DIR ...]``.

A user's day, played in fresh processes with the default settings (the emulator shared by the
user's processes): scripts run from five project folders, one with a setting of its own, one with
a client-only fnmap setting (``FNMAP_OUTPUT``), one with a typo (``FNMAP_RETRYS``), one with
``MPLBACKEND``, one as a notebook kernel would run it (``JPY_PARENT_PID``), each run twice; then a
job whose calls keep 100 MB each.  After the last client exits (and 5 s more), it counts the shared
emulators left up, their processes and the resident memory of their process trees.

``--tree DIR`` runs the day with the fnmap found in ``DIR`` (a checkout: put first on
``PYTHONPATH``), several trees one after another in one run, for before-and-after figures; each
gets a runtime folder of its own, and its emulators are stopped after.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare import _process_table  # noqa: E402  (the same process table compare.py samples)

SCRIPT = """
import fnmap
print(sum(fnmap.map(abs, range(-20, 0), chunksize=1)))
"""

HOLDER = """
import fnmap

KEPT = []

def hold(x):
    KEPT.append(bytearray(100 << 20))
    return len(KEPT)

print(fnmap.map(hold, range(4), chunksize=1))
"""

FOLDERS = [{"MY_SETTING": "a"}, {"FNMAP_OUTPUT": "after"}, {"FNMAP_RETRYS": "1"}, {"MPLBACKEND": "agg"},
           {"JPY_PARENT_PID": "1"}]


def _tree(pid: int, table: dict) -> list[int]:
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(child for child, (parent, _) in table.items() if parent == current)
    return out


def day(tree: str | None, work: str) -> dict:
    runtime = os.path.join(work, "runtime")
    os.makedirs(runtime, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env.update(XDG_RUNTIME_DIR=runtime, FNMAP_STORAGE="file://" + os.path.join(work, "storage"))
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    for _ in range(2):
        for n, extra in enumerate(FOLDERS):
            folder = os.path.join(work, f"project{n}")
            os.makedirs(folder, exist_ok=True)
            subprocess.run([sys.executable, "-c", SCRIPT], cwd=folder, env=dict(env, **extra), check=True,
                           capture_output=True, timeout=300)
    subprocess.run([sys.executable, "-c", HOLDER], cwd=work, env=env, check=True, capture_output=True, timeout=300)
    seconds = time.monotonic() - started
    time.sleep(5)
    states = []
    for root, _dirs, files in os.walk(runtime):
        if "emulator.json" in files:
            with open(os.path.join(root, "emulator.json")) as f:
                states.append(json.load(f))
    table = _process_table()
    pids = [p for s in states if s["pid"] in table for p in _tree(s["pid"], table)]
    memory = sum(table[p][1] for p in pids)
    for state in states:
        try:
            os.kill(state["pid"], signal.SIGTERM)
        except OSError:
            pass
    return {"emulators": len(states), "processes": len(pids), "memory_mb": round(memory / 2**20),
            "day_seconds": round(seconds, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="DIR",
                   help="a checkout whose fnmap to run (repeatable; default: the installed one)")
    args = p.parse_args(argv)
    print(f"{'tree':40} {'emulators':>9} {'processes':>9} {'memory MB':>9} {'day s':>7}")
    for tree in args.tree or [None]:
        with tempfile.TemporaryDirectory(prefix="fnmap-day-") as work:
            result = day(tree, work)
        print(f"{tree or 'installed':40} {result['emulators']:9} {result['processes']:9} "
              f"{result['memory_mb']:9} {result['day_seconds']:7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
