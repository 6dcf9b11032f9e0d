"""Jobs found again by id: ``fnmap.job(id)`` from another process, ``fnmap cancel``, ``--watch``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import CancelledError

import pytest
from conftest import until

import fnmap
from fnmap.errors import CallLost, RedriveError
from fnmap.runtime import keys
from fnmap.storage import open_store

SCRIPT = textwrap.dedent('''
    import sys, fnmap

    def slow(x):
        import time
        time.sleep({sleep})
        return x * 2

    job = fnmap.map(slow, range({n}), return_job=True, chunksize=1, workers=2)
    print(job.id, flush=True)
    try:
        print("RESULTS", job.results(), flush=True)
    except BaseException as e:
        print("RAISED", type(e).__name__, e, flush=True)
        sys.exit(3)
''')


@pytest.fixture
def running_job(tmp_path):
    """Start a map in a separate process; yields (process, job id); the process is stopped after."""
    procs = []

    def start(n: int, sleep: float):
        script = tmp_path / f"job{len(procs)}.py"
        script.write_text(SCRIPT.format(n=n, sleep=sleep))
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, (job_id, proc.stderr.read() if proc.poll() is not None else "")
        return proc, job_id

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def fnmap_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnmap", *args], capture_output=True, text=True, timeout=timeout)


def test_a_running_job_of_another_process_is_followed_and_its_results_read(running_job):
    proc, job_id = running_job(n=8, sleep=0.4)
    handle = fnmap.job(job_id[:10])
    assert handle.id == job_id
    assert handle.status == "running" and not handle.done
    assert "slow" in repr(handle)
    assert handle.wait(60)
    assert handle.status == "succeeded"
    assert handle.results() == [x * 2 for x in range(8)]
    out, _ = proc.communicate(timeout=30)
    assert "RESULTS [0, 2, 4" in out


def fails_on_three(x):
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


def test_a_past_jobs_results_raise_as_the_map_did():
    job = fnmap.map(fails_on_three, range(6), return_exceptions=True, return_job=True, chunksize=2)
    job.results(return_exceptions=True)
    handle = fnmap.job(job.id)
    with pytest.raises(ValueError, match="bad item 3") as info:
        handle.results()
    assert any("item 3" in note for note in info.value.__notes__)
    out = handle.results(return_exceptions=True)
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5] and isinstance(out[3], ValueError)
    with pytest.raises(LookupError, match="no job id starts with"):
        fnmap.job("abcdef0123")


def test_fnmap_cancel_stops_a_job_running_in_another_process(running_job):
    proc, job_id = running_job(n=20, sleep=1.0)
    done = fnmap_cli("cancel", job_id[:8], "--wait")
    assert done.returncode == 0, done.stderr
    assert f"asked the client running job {job_id} to cancel it" in done.stdout
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, (out, err)
    assert "RAISED CancelledError" in out and "cancelled from outside by `fnmap cancel`" in out
    handle = fnmap.job(job_id)
    assert handle.status == "cancelled"
    ran = [c for c in handle.record()["calls"] if c["status"] == "ok"]
    assert len(ran) < 20
    # Counts per state: never "20/20" or "done 20" for a job whose calls were mostly cancelled.
    states = handle.summary()["states"]
    assert states["succeeded"] == len(ran) and states["cancelled"] == 20 - len(ran) > 0, states
    assert states["failed"] == states["abandoned"] == states["running"] == 0
    row = next(line for line in fnmap_cli("jobs").stdout.splitlines() if line.startswith(job_id[:12]))
    assert f"{len(ran)} succeeded, {20 - len(ran)} cancelled" in row and "20/20" not in row, row
    shown = fnmap_cli("job", job_id).stdout
    assert f"succeeded {len(ran)}" in shown and f"cancelled {20 - len(ran)}" in shown and "done 20" not in shown
    with pytest.raises(CancelledError):
        handle.results()
    again = fnmap_cli("cancel", job_id)
    assert again.returncode == 0 and "has ended already (cancelled)" in again.stdout


CANCELLED_THEN_EXIT = textwrap.dedent('''
    import os, time, fnmap

    SEEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen")

    def slow(x):
        import os, time
        while x == 0 and not os.path.exists(SEEN):  # running until this process has seen the cancel
            time.sleep(0.01)
        time.sleep(1 if x == 0 else 0)
        return x

    # The local backend cannot stop a running call: call 0 is still in flight when this exits.
    job = fnmap.map(slow, range(2), return_job=True, chunksize=1, workers=1, backend="local")
    print(job.id, flush=True)
    while not job.run.cancel_reason:
        time.sleep(0.05)
    print("SEEN", job.done, flush=True)
    open(SEEN, "w").close()
''')


def test_a_client_exiting_right_after_fnmap_cancel_leaves_the_job_cancelled_not_abandoned(tmp_path):
    """A script that ends as its map raises CancelledError (the usual case) exits while the calls
    in flight are still being stopped: its exit waits for them (briefly), so the record says
    ``cancelled`` as the user asked, not ``abandoned``."""
    script = tmp_path / "cancelled.py"
    script.write_text(CANCELLED_THEN_EXIT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, (job_id, proc.stderr.read() if proc.poll() is not None else "")
        assert fnmap_cli("cancel", job_id).returncode == 0
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0 and "SEEN False" in out, (out, err)  # it exited with call 0 in flight
    handle = fnmap.job(job_id)
    assert handle.status == "cancelled", handle.record()["summary"]
    assert [c["status"] for c in handle.record()["calls"]] == ["ok", "cancelled"]


def test_watch_follows_a_job_until_it_ends(running_job):
    proc, job_id = running_job(n=6, sleep=0.5)
    watched = fnmap_cli("job", job_id, "--watch")
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    assert any("running" in line and "/6 calls done" in line for line in lines), lines
    assert any(line.startswith("job ") and "succeeded" in line for line in lines)
    proc.communicate(timeout=30)


KILLED = textwrap.dedent('''
    import fnmap

    def slow(x):
        import time
        time.sleep({sleep})
        return x * 2

    job = fnmap.map(slow, range({n}), return_job=True, workers=2{options})
    print(job.id, flush=True)
    job.results()
''')


def reported(store, job_id: str) -> list[dict]:
    return [json.loads(store.get(key)) for key in store.list(keys.status_prefix(job_id))]


@pytest.mark.parametrize("n, sleep, options, calls_of", [
    (3000, 0.02, "", lambda sizes: len(sizes) >= 3 and max(sizes) > 1),  # automatic: calls grow
    (300, 0.3, ", chunksize=3", lambda sizes: len(sizes) >= 3),
], ids=["growing-chunks", "chunksize-3"])
def test_a_client_killed_mid_job_leaves_results_in_place(tmp_path, n, sleep, options, calls_of):
    """SIGKILL the client of a job mid-way: re-attached, every item stands at its index, a result
    or a CallLost where its call never ran or never reported, never a shorter list.  With automatic
    chunking the client is killed once calls of several sizes have reported (each placed by the
    first item its status record names)."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(n=n, sleep=sleep, options=options))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, proc.stderr.read() if proc.poll() is not None else job_id
        store = open_store(os.environ["FNMAP_STORAGE"])
        until(lambda: calls_of([s["items"] for s in reported(store, job_id)]))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    handle = fnmap.job(job_id)
    assert handle.status == "abandoned"
    out = handle.results(return_exceptions=True)
    assert len(out) == n
    values = [i for i, v in enumerate(out) if v == 2 * i]
    lost = [i for i, v in enumerate(out) if isinstance(v, CallLost)]
    assert len(values) >= 3 and lost and sorted(values + lost) == list(range(n)), (values, lost)
    assert f"item {lost[-1]} of job {job_id} has no result" in str(out[lost[-1]])
    with pytest.raises(CallLost, match=f"item {lost[0]} of"):  # the first item without a result, raised
        handle.results()
    summary = handle.summary()
    assert summary["states"]["abandoned"] >= 1 and summary["states"]["succeeded"] >= 1
    assert summary["items_unreported"] == len(lost)
    shown = fnmap_cli("job", job_id).stdout
    assert f"abandoned {summary['states']['abandoned']}" in shown and f"no result {len(lost)} items" in shown


#: What every job object answers (:class:`fnmap.jobs.JobHandle`): properties, then methods.
JOB_PROPERTIES = ("id", "status", "done", "cost")
JOB_METHODS = ("wait", "results", "cancel", "redrive", "record", "summary", "plot", "logs")


def _held_from_two(release: str):
    """Items 0 and 1 return at once, the others once the file ``release`` exists; each returns 2x."""

    def held(x):
        import time

        deadline = time.time() + 300
        while x >= 2 and not os.path.exists(release) and time.time() < deadline:
            time.sleep(0.05)
        return x * 2

    return held


def test_the_job_of_a_map_and_the_job_read_back_by_id_answer_the_same(tmp_path):
    """``fnmap.map(..., return_job=True)`` and ``fnmap.job(ID)`` answer the same names with the same
    meaning on real emulator jobs: one job cancelled through the first, one through the second, each
    stops (its held calls stopped on the platform, not waited for), reads the same through both,
    and is finished by ``redrive()`` of the object it was cancelled through."""
    release = str(tmp_path / "release")
    jobs = {}
    for how in ("map", "by id"):
        job = fnmap.map(_held_from_two(release), range(4), chunksize=1, workers=4, return_job=True, output="none")
        until(lambda job=job: job.run.done_count == 2)  # items 0 and 1 returned; 2 and 3 are held
        (job if how == "map" else fnmap.job(job.id)).cancel()
        assert job.wait(60), f"the job cancelled through {how} went on running its held calls"
        jobs[how] = job
    for how, job in jobs.items():
        live, attached = job, fnmap.job(job.id[:12])
        for handle in (live, attached):
            assert all(not callable(getattr(handle, name)) for name in JOB_PROPERTIES), type(handle)
            assert all(callable(getattr(handle, name)) for name in JOB_METHODS), type(handle)
            assert handle.id == job.id and handle.status == "cancelled" and handle.done and handle.wait(0)
            results = handle.results(return_exceptions=True)
            assert results[:2] == [0, 2] and all(isinstance(r, CancelledError) for r in results[2:]), results
            awaited = asyncio.run(handle.results.aio(return_exceptions=True))  # the awaitable forms too
            assert asyncio.run(handle.wait.aio(0)) and [type(r) for r in awaited] == [type(r) for r in results]
            assert handle.logs() == live.logs()
            assert os.path.getsize(handle.plot(str(tmp_path / f"{how}-{type(handle).__name__}.png")))
        shared = ("job_id", "status", "calls", "calls_done", "items", "states", "failed_items", "retries")
        assert {k: live.summary()[k] for k in shared} == {k: attached.summary()[k] for k in shared}
        assert set(attached.summary()) <= set(live.summary())
        assert live.cost.keys() == attached.cost.keys()
        assert live.cost["usd"] == pytest.approx(attached.cost["usd"], rel=0.05)
    open(release, "w").close()
    for redriven in (jobs["map"].redrive(), fnmap.job(jobs["by id"].id).redrive()):
        assert redriven.results() == [0, 2, 4, 6]
        assert fnmap.job(redriven.id).status == redriven.status == "succeeded"
    with fnmap.Executor() as executor:  # a job of a kind that stores no calls says so, as fnmap redrive does
        assert executor.submit(abs, -1).result() == 1
        with pytest.raises(RedriveError, match="is an 'executor' job, whose calls are not stored"):
            executor.job.redrive()
