"""Job records that tell the truth: a map whose exception reached its caller is ``failed`` (never
``abandoned``, however its script ends), a client killed on this host is known gone at once (by
``fnmap redrive`` and ``fnmap cancel`` alike), and what ``--watch``, the progress bar and the plot
show of a job adds up.  Real scripts in real subprocesses, on the emulator and the local backend."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import until

import fnmap
from fnmap import lease
from fnmap.emulator.launcher import EmulatorLauncher
from fnmap.observe import history
from fnmap.runtime import keys
from fnmap.storage import open_store

SECRET = "records-truth-secret-0123456789abcdef"


def fnmap_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnmap", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _script_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.getcwd(), **extra}


# -- a map that raised, then its script ended ------------------------------------------------------

RAISES_THEN_EXITS = textwrap.dedent('''
    import sys, time, fnmap

    def work(x):
        if x == 1:
            raise ValueError(f"item {x} is bad")
        time.sleep(0.2)
        return x

    job = fnmap.map(work, range(24), return_job=True, chunksize=1, workers=4, backend=sys.argv[1])
    print(job.id, flush=True)
    job.results()  # raises ValueError: the script ends with it, its other calls being stopped
''')

RUNS = 15


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_a_map_whose_exception_reached_its_caller_is_failed_in_every_run(tmp_path, backend):
    """The script's last line raises the map's ValueError while the other calls are being stopped:
    in every run the job reads ``failed`` (its exit waited for them to settle, and the record
    written as it raised says so), never ``abandoned`` with a redrive offered."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES_THEN_EXITS)
    seen = []
    for _ in range(RUNS):
        done = subprocess.run([sys.executable, str(script), backend], capture_output=True, text=True,
                              env=_script_env(), timeout=120)
        job_id = done.stdout.strip()
        assert done.returncode == 1 and "ValueError: item 1 is bad" in done.stderr, done.stderr[-2000:]
        record = fnmap.job(job_id).record()
        summary = record["summary"]
        seen.append(summary["status"])
        # its exit waited for the calls still out: the record is the settled one, not the one written as it raised
        assert not any("stopped unfinished" in (c["error"] or "") for c in record["calls"]), record["calls"]
        assert summary["raised"]["error"] == "ValueError: item 1 is bad", summary
        assert summary["states"]["abandoned"] == summary["states"]["running"] == 0, summary["states"]
        assert summary["states"]["failed"] == 1, summary["states"]
    assert seen == ["failed"] * RUNS, seen
    shown = fnmap_cli("job", job_id).stdout
    assert f"{job_id}  map on {backend}  failed" in shown, shown
    assert "raised   ValueError: item 1 is bad" in shown and "is gone before it finished" not in shown, shown
    redrives = [line for line in shown.splitlines() if "fnmap redrive" in line]  # its one advice: run the rest
    assert redrives == [f"note     `fnmap redrive {job_id[:12]}` runs the {summary['states']['cancelled']} item(s) "
                        "left (with --failed, and the 1 failed item(s) again)"], shown


KILLED_AFTER_RAISING = textwrap.dedent('''
    import os, signal, sys, time, fnmap

    GATE = sys.argv[1]

    def work(x):
        if x == 0:
            raise ValueError("item 0 is bad")
        while not os.path.exists(GATE):  # call 1 is still running when its caller gets item 0's error
            time.sleep(0.05)
        return x

    job = fnmap.map(work, range(2), return_job=True, chunksize=1, workers=2, backend="local")
    print(job.id, flush=True)
    try:
        job.results()
    except ValueError:
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies before call 1 settles
        raise  # the script ends with it: its exit waits a few seconds for call 1, in vain
''')


@pytest.mark.parametrize("end", ["kill", "exit"])
def test_a_job_whose_caller_got_its_exception_stays_failed_when_its_process_ends_before_it_settles(tmp_path, end):
    """The local backend cannot stop call 1, and the process is SIGKILLed right after the map
    raised, or exits with the exception: the record written when it raised stands (``failed``),
    never a rebuilt or lease-judged ``abandoned``."""
    script, gate = tmp_path / "killed_after_raising.py", tmp_path / "gate"
    script.write_text(KILLED_AFTER_RAISING)
    # no pipes: the local backend's worker running call 1 outlives its client until the gate opens
    proc = subprocess.Popen([sys.executable, str(script), str(gate), end], stdout=open(tmp_path / "out", "w"),
                            stderr=subprocess.DEVNULL, env=_script_env())
    try:
        assert proc.wait(120) == (-signal.SIGKILL if end == "kill" else 1)
        job = fnmap.job((tmp_path / "out").read_text().strip())
        summary = job.summary()
        assert summary["status"] == "failed" and summary["raised"]["error"] == "ValueError: item 0 is bad", summary
        calls = job.record()["calls"]
        assert [c["status"] for c in calls] == ["error", "cancelled"], calls
        assert "stopped unfinished" in calls[1]["error"]
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# -- SIGKILL, then redrive and cancel at once ------------------------------------------------------

GATED = textwrap.dedent('''
    import os, sys, time, fnmap

    GATE, RUNS = sys.argv[1], sys.argv[2]

    def work(x):
        while x >= 2 and not os.path.exists(GATE):
            time.sleep(0.05)
        fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one line per run that finished
        os.write(fd, f"{x}\\n".encode())
        os.close(fd)
        return x * 10

    job = fnmap.map(work, range(8), return_job=True, chunksize=1, workers=2)
    print(job.id, flush=True)
    job.results()
''')


def _runs(path) -> list[int]:
    return sorted(int(line) for line in path.read_text().split()) if path.exists() else []


@pytest.fixture
def emulators():
    """``start()``: an emulator subprocess signing with ``SECRET``; each is stopped after the test."""
    import tempfile

    started = []

    def start() -> EmulatorLauncher:
        emu = EmulatorLauncher(2, secret=SECRET, stderr=tempfile.TemporaryFile())
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop(timeout=20)


def test_redrive_and_cancel_right_after_a_kill_agree_that_the_client_is_gone(tmp_path, emulators):
    """A client SIGKILLed on this host, holding a lease good for ten more minutes: ``fnmap cancel``
    says at once that it is abandoned (no client to ask) and ``fnmap redrive`` at once runs the
    rest; every item runs to its end exactly once."""
    gate, runs, script = tmp_path / "gate", tmp_path / "runs.txt", tmp_path / "gated.py"
    script.write_text(GATED)
    first = emulators()
    env = _script_env(FNMAP_EMULATOR_URL=first.url, FNMAP_SECRET=SECRET, FNMAP_LEASE="600")
    proc = subprocess.Popen([sys.executable, str(script), str(gate), str(runs)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, proc.stderr.read() if proc.poll() is not None else job_id
        until(lambda: _runs(runs) == [0, 1])
        store = open_store(os.environ["FNMAP_STORAGE"])
        until(lambda: lease.read(store, job_id))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    held = lease.read(store, job_id)
    assert held["expires"] > time.time() + 300 and not held.get("abandoned"), held  # a lease not expired
    first.stop(timeout=20)  # its workers, with calls 2 and 3 waiting in them, are gone
    second = emulators()
    env = _script_env(FNMAP_EMULATOR_URL=second.url, FNMAP_SECRET=SECRET)

    cancel = fnmap_cli("cancel", job_id[:10], env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert f"job {job_id} has ended already (abandoned): nothing to cancel" in cancel.stdout, cancel.stdout
    assert f"`fnmap redrive {job_id[:12]}` runs the 6 item(s) left" in cancel.stdout, cancel.stdout
    assert not store.exists(keys.cancel_key(job_id))  # nobody was asked
    shown = fnmap_cli("job", job_id, env=env).stdout
    assert "is gone from this host (killed or crashed)" in shown and "runs the 6 item(s) left" in shown, shown

    gate.touch()
    redrive = fnmap_cli("redrive", job_id[:10], env=env, timeout=300)
    assert redrive.returncode == 0, redrive.stdout + redrive.stderr
    assert "succeeded" in redrive.stdout
    assert _runs(runs) == list(range(8))  # each item ran to its end exactly once
    assert fnmap.job(job_id, secret=SECRET).results() == [x * 10 for x in range(8)]
    after = fnmap_cli("cancel", job_id, env=env).stdout
    assert "has ended already (succeeded)" in after and "redrive" not in after, after


def test_a_live_client_on_this_host_is_still_running_for_redrive_and_cancel_alike(tmp_path):
    """The other side of the same judge: while the client lives, redrive refuses and cancel asks."""
    gate, runs, script = tmp_path / "gate", tmp_path / "runs.txt", tmp_path / "gated.py"
    script.write_text(GATED)
    proc = subprocess.Popen([sys.executable, str(script), str(gate), str(runs)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_script_env())
    try:
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, proc.stderr.read() if proc.poll() is not None else job_id
        until(lambda: _runs(runs) == [0, 1])
        redrive = fnmap_cli("redrive", job_id)
        assert redrive.returncode != 0
        assert f"job {job_id} is still running in " in redrive.stderr and f"pid {proc.pid}" in redrive.stderr
        cancel = fnmap_cli("cancel", job_id)
        assert f"asked the client running job {job_id} to cancel it" in cancel.stdout, cancel.stdout
        out, err = proc.communicate(timeout=60)
    finally:
        gate.touch()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert "CancelledError" in err, err[-2000:]
    assert fnmap.job(job_id).status == "cancelled"


# -- what --watch, the bar and the plot show --------------------------------------------------------

AUTO_CHUNKED = textwrap.dedent('''
    import os, sys, time, fnmap

    GATE = sys.argv[1]

    def work(x):
        time.sleep(0.05 if x < 30 else 0)  # calls of about one item each (the local backend's target)
        while x >= 30 and not os.path.exists(GATE):  # then both slots wait, the feed makes no more calls
            time.sleep(0.02)
        return x

    job = fnmap.map(work, range(400), return_job=True, workers=2, backend="local")
    print(job.id, flush=True)
    print(len(job.results()), flush=True)
''')


def _counts(line: str) -> tuple[int, int, dict[str, int]]:
    found = re.search(r"(\d+)/(\d+) calls done  \(([^)]*)\)", line)
    assert found, line
    states = {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", found.group(3))}
    return int(found.group(1)), int(found.group(2)), states


def test_watch_counts_of_a_running_automatically_chunked_job_add_up(tmp_path):
    """Its start entry counts the first calls only, and the calls made since report as they end,
    while items in no call yet wait: the watched line never says all calls are done with one
    running, nor more calls done than calls, and its states add up to the calls."""
    gate, script = tmp_path / "gate", tmp_path / "auto.py"
    script.write_text(AUTO_CHUNKED)
    proc = subprocess.Popen([sys.executable, str(script), str(gate)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_script_env())
    watcher = None
    try:
        job_id = proc.stdout.readline().strip()
        assert len(job_id) == 32, proc.stderr.read() if proc.poll() is not None else job_id
        store = open_store(os.environ["FNMAP_STORAGE"])
        started = until(lambda: history.started_entry(store, job_id))["calls"]
        # more calls have reported than the start entry counts; those holding items 30.. wait for the gate
        until(lambda: len(_reported(store, job_id)) > started and sum(s["items"] for s in _reported(store, job_id))
              >= 20)
        summary = fnmap.job(job_id).summary()
        assert summary["status"] == "running"
        assert summary["calls_done"] < summary["calls"], summary
        assert sum(summary["states"].values()) == summary["calls"], summary["states"]
        assert summary["states"]["running"] >= 1 and summary["items_unreported"] >= 10, summary
        listed = next(j for j in history.list_jobs(store) if j["job_id"] == job_id)  # what `fnmap jobs` shows
        assert listed["status"] == "running" and listed["calls"] >= listed["calls_done"] > started, listed
        watcher = subprocess.Popen([sys.executable, "-m", "fnmap", "job", job_id, "--watch"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        line = watcher.stdout.readline()
        done, calls, states = _counts(line)
        assert done < calls and sum(states.values()) == calls and states.get("running", 0) >= 1, line
        assert states["succeeded"] == done, line
    finally:
        if watcher is not None:
            watcher.kill()
            watcher.communicate(timeout=30)
        gate.touch()
        out, err = proc.communicate(timeout=120)
    assert out.split()[-1] == "400", err


def _reported(store, job_id: str) -> list[dict]:
    import json

    return [json.loads(store.get(key)) for key in store.list(keys.status_prefix(job_id))]


def _slow(x):
    time.sleep(2)
    return x


def test_a_closed_imap_closes_its_bar_and_does_not_count_its_stopped_calls_as_failed(module_emulator, capsys):
    """``imap`` closed after its first result: the bar ends then (nothing of it is drawn after, as
    in a notebook's next cell), and the calls stopped with the job are not failures."""
    results = fnmap.imap(_slow, range(6), chunksize=1, progress=True, workers=3)
    assert next(results) == 0
    results.close()
    store = open_store(os.environ["FNMAP_STORAGE"])
    job_id = history.list_jobs(store, 1)[0]["job_id"]
    at_close = capsys.readouterr().err
    assert "fnmap _slow" in at_close and "failed" not in at_close, at_close
    until(lambda: fnmap.job(job_id).status == "cancelled")  # the stopped calls have settled
    time.sleep(0.5)
    after = capsys.readouterr().err
    assert after == "", after  # the bar was not drawn again
    states = fnmap.job(job_id).summary()["states"]
    assert states["failed"] == 0 and states["cancelled"] >= 1, states


def test_calls_stopped_by_a_cancel_from_outside_are_not_counted_failed_by_the_bar(module_emulator, capsys):
    job = fnmap.map(_slow, range(4), chunksize=1, progress=True, workers=4, return_job=True)
    until(lambda: sum(s.in_flight for s in job.run.calls) == 4)
    fnmap.job(job.id).cancel()
    assert job.wait(60)
    bar = job.run.progress
    assert bar.calls_done == 4 and bar.failed == 0, (bar.calls_done, bar.failed)
    assert "failed" not in capsys.readouterr().err
    assert fnmap.job(job.id).status == "cancelled"


def _gated(x, gate=None):
    while x >= 2 and not os.path.exists(gate):
        time.sleep(0.02)
    return x


def test_the_plot_of_a_running_job_says_it_is_running(tmp_path):
    pytest.importorskip("matplotlib")
    import functools

    import matplotlib

    gate = tmp_path / "gate"
    job = fnmap.map(functools.partial(_gated, gate=str(gate)), range(4), chunksize=1, workers=4,
                    backend="local", return_job=True)
    try:
        until(lambda: job.run.done_count == 2)
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to read the title back
            with pytest.warns(RuntimeWarning, match=r"is running: 2 of 4 calls done: the plot shows only"):
                path = job.plot(str(tmp_path / "running.svg"))
            svg = open(path).read()
            assert "RUNNING: 2 OF 4 CALLS DONE (a snapshot)" in svg
            assert "in flight" in svg  # the legend of the bars of calls 2 and 3, still out
        gate.touch()
        assert job.results() == [0, 1, 2, 3]
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("error")
                path = job.plot(str(tmp_path / "done.svg"))
            assert "snapshot" not in open(path).read()
    finally:
        gate.touch()


# -- the notes that go with each state ----------------------------------------------------------------


def test_an_abandoned_job_with_nothing_left_is_not_offered_a_redrive():
    """The advice follows the calls: a job whose every call has its result has nothing to redrive."""
    from fnmap.cli.jobs import format_summary
    from fnmap.observe import records

    job = fnmap.map(str, range(3), chunksize=1, return_job=True, backend="local")
    job.results()
    record = records.load(job.store, job.id)
    record["summary"].update(status="abandoned", abandoned="its client process exited before the job finished")
    text = format_summary(record)
    assert "nothing is left to redrive" in text and "fnmap redrive" not in text, text
    record["calls"][2]["status"] = "cancelled"
    assert f"`fnmap redrive {job.id[:12]}` runs the 1 item(s) left" in format_summary(record)


def test_a_job_held_by_a_dead_pid_of_this_host_is_judged_gone_at_once(tmp_path):
    """The judge reads the holder's host and pid: a process of this host that has exited holds no
    lease, however long the lease had left; a live one does."""
    dead = subprocess.run([sys.executable, "-c", "from fnmap import lease; import json; print(json.dumps("
                           "lease.holder()))"], capture_output=True, text=True, check=True, env=_script_env())
    import json

    holder = json.loads(dead.stdout)
    now = time.time()
    assert not lease.live({"holder": holder, "renewed": now, "expires": now + 600})
    assert "is gone from this host" in lease.gone({"holder": holder, "renewed": now, "expires": now + 600})
    assert lease.live({"holder": lease.holder(), "renewed": now, "expires": now + 600})
    elsewhere = dict(holder, host="a-laptop-far-away")
    assert lease.live({"holder": elsewhere, "renewed": now, "expires": now + 600})  # nothing to check it against
    assert not lease.live({"holder": elsewhere, "renewed": now - 700, "expires": now - 100})
