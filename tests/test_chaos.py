"""Chaos, short: named maps in real client processes on the emulator shared by a user's processes,
while clients (in their start and later), the emulator and its workers are SIGKILLed; every run
that did not complete is run again with the same ``job_name``, function and items, as a user would.
Every job must end right (every item's value once, in input order, and a ``succeeded`` record whose
stored results are the same), none hung or stuck, and the emulator must count no call in flight
once its clients are gone.  The harness is benchmarks/chaos.py, whose long run
(``python benchmarks/chaos.py --minutes 10``) reports the same figures over minutes."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))

import chaos  # noqa: E402  (benchmarks/chaos.py)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL, flock and /proc")

#: Faults of each kind: the first client runs are killed in their start and later, while the
#: emulator and its workers are killed at random moments of the runs after.
FAULTS = {"client@start": 2, "client@run": 2, "emulator": 1, "worker": 2}


def test_every_named_map_killed_at_random_finishes_right_when_run_again(tmp_path):
    said: list[str] = []
    run = chaos.Chaos(str(tmp_path), seed=39, faults=FAULTS, max_runs=6, max_jobs=12, run_deadline=60,
                      log=said.append)
    # One job of each kind (the priced one stops at its cost cap, then finishes with a larger one);
    # more jobs of the others while faults are still to come.
    for kind in ("small", "large", "sleep", "priced"):
        run.add_job(kind)
    figures = run.run(kinds=("small", "large", "sleep"))
    report = chaos.report(figures) + "\nwhat happened:\n" + "\n".join(said)
    assert figures["faults"] == dict(dict.fromkeys(chaos.FAULTS, 0), **FAULTS), report  # every one planned was injected
    assert figures["right"] == figures["jobs"], report
    assert figures["hung"] == figures["stuck"] == figures["wrong"] == 0, report
    assert figures["in_flight_left"] == 0, report
