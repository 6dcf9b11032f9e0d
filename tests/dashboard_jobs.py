"""Real jobs and a real dashboard for the dashboard's tests (tests/test_dashboard*.py).

The jobs run on the emulator a test process starts by itself, into a storage folder of the test
module's own, so the dashboard lists exactly them.
"""

from __future__ import annotations

import contextlib
import os
import time

import fnmap
from fnmap.dashboard.server import Dashboard
from fnmap.runtime import keys
from fnmap.storage import open_store

#: The name and the error of the job whose strings are markup: they must show as text.
MARKUP_NAME = "<script>alert(1)</script>"
MARKUP_ERROR = '<img src=x onerror="alert(2)"><b>bold?</b>'


def failed_job(storage: str, marker_dir: str, items: int = 6) -> str:
    """A finished job of ``items`` calls: call 1's worker crashes once (retried), every call prints
    and takes a few tens of milliseconds, item 3 raises a ValueError whose message has markup.  Its id."""
    marker = os.path.join(marker_dir, "crashed-once")

    def work(x):
        if x == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
        print(f"item {x} says hello")
        time.sleep(0.02 * (x % 5))
        if x == 3:
            raise ValueError(f"item {x} is <b>not</b> welcome")
        return x * x

    job = fnmap.map(work, range(items), chunksize=1, return_job=True, storage=storage, output="none")
    job.results(return_exceptions=True)
    return job.id


def markup_job(storage: str) -> str:
    """A finished job whose function is named :data:`MARKUP_NAME` and whose item raises
    :data:`MARKUP_ERROR`.  Its id."""

    def named(x):
        raise RuntimeError(MARKUP_ERROR)

    named.__name__ = named.__qualname__ = MARKUP_NAME
    job = fnmap.map(named, range(1), return_job=True, storage=storage, output="none")
    job.results(return_exceptions=True)
    return job.id


def wait_for_file(path: str, timeout: float = 60.0):
    """A function for a job that stays running until ``path`` exists: item 0 returns at once, the
    others once ``path`` exists (each returns its item)."""

    def held(x):
        if x == 0:
            return x
        deadline = time.time() + timeout
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.05)
        return x

    return held


@contextlib.contextmanager
def running_map(storage: str, release: str, timeout: float = 60.0):
    """A map of 4 calls running in a thread, each waiting for the file ``release``: yields the list
    its results go to; at the end the file is made and the map joined."""
    import threading

    results: list = []
    mapping = threading.Thread(target=lambda: results.extend(
        fnmap.map(wait_for_file(release), range(4), chunksize=1, storage=storage, output="none")))
    mapping.start()
    try:
        yield results
    finally:
        open(release, "w").close()
        mapping.join(timeout)


def fail_then_wait(release: str, timeout: float = 60.0):
    """A function for a job that stays running after one of its calls failed: item 1 raises a
    KeyError at once (printing nothing), item 2 returns once the file ``release`` exists, the others
    return their item at once."""

    def work(x):
        if x == 1:
            raise KeyError(f"no such thing as {x}")
        deadline = time.time() + timeout
        while x == 2 and not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.05)
        return x

    return work


@contextlib.contextmanager
def running_with_a_failure(storage: str, release: str, timeout: float = 60.0):
    """A job of 3 calls (:func:`fail_then_wait`) still running once call 1 has failed and reported:
    yields the job; at the end the file ``release`` is made and the job waited for."""
    job = fnmap.map(fail_then_wait(release, timeout), range(3), chunksize=1, return_job=True,
                    storage=storage, output="none")
    store = open_store(storage, "the test's storage", create=False)
    try:
        deadline = time.time() + timeout
        while len({keys.call_attempt_of(k)[0] for k in store.list(keys.status_prefix(job.id))}) < 2:
            assert time.time() < deadline, "calls 0 and 1 never reported"
            time.sleep(0.1)
        yield job
    finally:
        open(release, "w").close()
        job.wait(timeout)


@contextlib.contextmanager
def serving(storage: str, token: str = "a-test-token-of-enough-length"):
    """A dashboard over ``storage`` on a free loopback port, from a thread of this process."""
    store = open_store(storage, "the test's storage", create=False)
    dashboard = Dashboard(store, token, port=0).start()
    try:
        yield dashboard
    finally:
        dashboard.close()
