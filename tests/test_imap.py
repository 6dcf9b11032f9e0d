"""fnmap.imap and imap_unordered: results as they come, with map's errors, and cancel on early exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from naps import fails_on_two, nap, nap_then_mark

import fnmap
from fnmap.observe import history
from fnmap.storage import open_store


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_imap_yields_in_input_order_and_unordered_as_they_finish(backend):
    delays = [1.5, 0.0, 0.5, 0.0]
    assert list(fnmap.imap(nap, delays, backend=backend, workers=4)) == delays
    first = next(iter(fnmap.imap_unordered(nap, delays, backend=backend, workers=4)))
    assert first == 0.0  # the slow first item does not hold the others back
    assert sorted(fnmap.imap_unordered(nap, delays, backend=backend, workers=4)) == sorted(delays)


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_imap_streams_before_the_job_is_done(tmp_path, backend):
    slow_done = tmp_path / "slow-call-ended"
    stream = fnmap.imap(nap_then_mark, [(0.0, str(tmp_path / "quick")), (5.0, str(slow_done))],
                        workers=2, backend=backend)
    assert next(stream) == 0.0
    assert not slow_done.exists()  # the first result came while the slow call still ran
    assert next(stream) == 5.0


@pytest.mark.parametrize("stream", [fnmap.imap, fnmap.imap_unordered])
def test_errors_raise_at_their_item_or_take_its_place(stream):
    got = []
    with pytest.raises(ValueError, match="two") as info:
        for value in stream(fails_on_two, range(5), workers=1, chunksize=1):
            got.append(value)
    assert any("item 2" in note for note in info.value.__notes__)
    if stream is fnmap.imap:
        assert got == [0, 1]
    out = list(stream(fails_on_two, range(5), return_exceptions=True))
    assert len(out) == 5 and sum(isinstance(v, ValueError) for v in out) == 1


def slow_marker(path):
    time.sleep(0.3)
    with open(path, "w"):
        pass
    return path


def test_closing_the_iterator_early_cancels_what_has_not_run(tmp_path):
    paths = [str(tmp_path / f"ran-{i}") for i in range(40)]
    stream = fnmap.imap(slow_marker, paths, workers=2, backend="local")
    assert next(stream) == paths[0]
    stream.close()
    time.sleep(1.5)  # what was running finishes; nothing new starts
    ran = sum(os.path.exists(p) for p in paths)
    assert ran < 10, ran


def test_bad_items_fail_at_the_call_not_at_the_first_next():
    with pytest.raises(TypeError, match="is a str"):
        fnmap.imap(abs, "abc")


#: A script reading ``imap``'s results, the second of which takes two minutes: interrupted while it
#: waits for that one (Ctrl-C), it ends as a map would.
INTERRUPTED = """
import signal, time
import fnmap

signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # Ctrl-C as an interactive Python has it
signal.signal(signal.SIGINT, signal.default_int_handler)

def slow(x):
    time.sleep(120 if x else 0)
    return x

for result in fnmap.imap(slow, range(4), workers=4, chunksize=1):
    print(result, flush=True)
"""


def test_ctrl_c_while_imap_waits_cancels_its_job_as_it_does_a_maps(tmp_path):
    script = tmp_path / "reader.py"
    script.write_text(INTERRUPTED)
    storage = (tmp_path / "storage").as_uri()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "FNMAP_STORAGE": storage, "PYTHONPATH": os.getcwd()})
    try:
        assert proc.stdout.readline() == "0\n", proc.stderr.read()
        # Its loop prints, then asks for the second result: a Ctrl-C between the two is one in the
        # script's own code, not in imap's wait, which is what this test means.
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in err, err
    [entry] = history.list_jobs(open_store(storage))
    summary = fnmap.job(entry["job_id"], storage=storage).summary()
    assert summary["status"] == "cancelled", summary  # its caller stopped it, not a client that went away
    assert summary["raised"]["error"].startswith("KeyboardInterrupt"), summary
