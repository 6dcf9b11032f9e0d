"""Lambda's scaling rate on the emulator's Lambda API (``fnmap emulator --scaling-rate``, issue 16).

A function gains at most N new execution environments per 10 s: a burst beyond them is answered
429 ``TooManyRequestsException`` (synchronous calls) or waits in the event queue (``Event``), and
the ``aws`` backend still gathers every result exactly once.  Storage is a local folder.
"""

from __future__ import annotations

import time

import pytest
from conftest import lambda_stats

import fnmap
from fnmap.runtime import keys
from fnmap.storage import open_store

pytestmark = pytest.mark.timeout(120)


def nap_square(x):
    time.sleep(0.2)
    return x * x


@pytest.fixture
def scaled(emulator_process, aws_backend_on):
    """An emulator whose Lambda API scales by 2 environments per 10 s; the aws backend pointed at it."""
    return aws_backend_on(emulator_process("--lambda-runtime", "pool", "--scaling-rate", "2", workers=4))


def _committed(job) -> list[str]:
    return open_store(job.store.url).list(keys.results_prefix(job.id))


def test_calls_beyond_the_scaling_rate_are_throttled_and_the_job_completes(scaled):
    items = range(8)
    job = fnmap.map(nap_square, items, workers=8, chunksize=1, lambda_invocation="RequestResponse",
                    speculation=False, return_job=True)
    assert job.results() == [x * x for x in items]
    stats = lambda_stats(scaled)
    assert stats["throttled"] >= 1 and stats["scaling_throttled"] >= 1, stats
    assert stats["scaled_to"]["fnmap"] < len(items), stats  # the burst reused the environments it had
    summary = job.summary()
    assert summary["attempts"]["throttled"] >= 1, summary
    assert summary["attempts"]["ok"] == len(items) and summary["duplicates_discarded"] == 0, summary
    assert len(_committed(job)) == len(items)  # one result object per call


def test_events_beyond_the_scaling_rate_wait_in_the_queue(scaled):
    items = range(6)
    job = fnmap.map(nap_square, items, workers=6, chunksize=1, lambda_invocation="Event", speculation=False,
                    return_job=True)
    assert job.results() == [x * x for x in items]
    stats = lambda_stats(scaled)
    assert stats["Event"] == len(items) and stats["scaling_waits"] >= 1, stats
    assert stats.get("throttled", 0) == 0 and stats["scaled_to"]["fnmap"] < len(items), stats
    assert len(_committed(job)) == len(items)


def test_scaling_rate_must_be_positive(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "--scaling-rate", "0"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "--scaling-rate=0 must be at least 1" in p.stderr
