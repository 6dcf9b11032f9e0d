"""What a user sees on their terminal: the progress bar, remote output and nothing of fnmap's own
innards (issue 14).  Each test runs a real script in a subprocess against a real embedded emulator."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time

import pytest

import fnmap

#: Seconds a script of these tests may take (an emulator's cold start on a loaded machine included).
SCRIPT_TIMEOUT = 180


def _run_script(tmp_path, source: str, name: str = "script.py") -> subprocess.CompletedProcess:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
                          cwd=tmp_path)


FAILING_JOB = """\
    import time

    import fnmap


    def work(x):
        if x == 1:
            raise ValueError("item one is bad")
        time.sleep(2)  # still running in the emulator's workers when the job fails and the script exits
        return x


    fnmap.map(work, range(20), workers=16)
"""


def test_a_failed_job_shows_the_users_traceback_and_nothing_of_fnmaps(tmp_path):
    """Busy workers' calls were abandoned as the script exited: the emulator closed their pipes under
    the threads reading them and printed a TypeError traceback per call (2 of 3 runs before the fix)."""
    for run in range(3):
        result = _run_script(tmp_path, FAILING_JOB)
        assert result.returncode == 1, result.stderr
        assert "ValueError: item one is bad" in result.stderr
        assert result.stderr.count("Traceback (most recent call last)") == 2, (run, result.stderr)  # remote + local
        assert "TypeError" not in result.stderr, (run, result.stderr)
        assert "Fatal Python error" not in result.stderr, (run, result.stderr)
        assert "fnmap/emulator" not in result.stderr, (run, result.stderr)


BAR_THEN_PRINT = """\
    import fnmap


    def work(x):
        if x % 100 == 7:
            print(f"remote says {x}")
        return x


    fnmap.map(work, range(300), progress=True, chunksize=1)
    print("USER-NEXT-LINE", flush=True)
"""


def _run_under_pty(script) -> str:
    """Everything ``script`` writes to its terminal (stdout and stderr alike), in order."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the script, its terminal the pty
        try:
            os.execv(sys.executable, [sys.executable, str(script)])
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty is 0 columns wide
    chunks = []
    try:
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # EIO: the child and its emulator closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_the_bar_is_finished_before_map_returns(tmp_path):
    """Under a real terminal the bar's last draw (300/300) comes before the user's next line, and
    nothing is drawn after it (the bar used to finish after map returned, over the user's line)."""
    script = tmp_path / "bar.py"
    script.write_text(textwrap.dedent(BAR_THEN_PRINT))
    for run in range(3):
        shown = _run_under_pty(script)
        assert "USER-NEXT-LINE" in shown, shown
        before, after = shown.split("USER-NEXT-LINE", 1)
        assert "300/300" in before, (run, shown)
        assert after.strip() == "", (run, shown)
        # The remote output comes after the bar's last draw, whole lines in call order (default "after").
        bar_end = before.rindex("300/300")
        said = [before.find(f"remote says {x}\r\n") for x in (7, 107, 207)]
        assert all(bar_end < at for at in said), (run, shown)
        assert said == sorted(said), (run, shown)


PRINTING_JOB = """\
    import sys

    import fnmap


    def work(x):
        print(f"remote stdout {x}")
        print(f"remote stderr {x}", file=sys.stderr)
        if x == 3:
            print("y" * 10000)  # more than comes back with the answer
        return x * 2


    print(fnmap.map(work, range(5), chunksize=1, **OPTIONS))
    print("USER-NEXT-LINE")
"""


def _printing_job(tmp_path, options: str) -> subprocess.CompletedProcess:
    result = _run_script(tmp_path, PRINTING_JOB.replace("**OPTIONS", options))
    assert result.returncode == 0, result.stderr
    return result


def test_remote_output_is_shown_after_the_job_per_call_in_order(tmp_path):
    result = _printing_job(tmp_path, "")
    assert "remote" not in result.stderr  # nothing live on the emulator's (the caller's) stderr
    out = result.stdout
    assert out.index("USER-NEXT-LINE") > out.index("[0, 2, 4, 6, 8]")
    headers = [out.index(f"--- fnmap: output of call {x} (item {x}) ---") for x in range(5)]
    assert headers == sorted(headers)
    for x in range(5):
        block = out[headers[x]:headers[x + 1] if x < 4 else out.index("[0, 2, 4, 6, 8]")]
        assert f"remote stdout {x}\nremote stderr {x}\n" in block, out
    assert "characters; all of it: fnmap logs " in out and "--call 3" in out  # call 3's long line was cut
    assert "y" * 10000 not in out


def test_live_output_goes_to_stderr_as_it_happens(tmp_path):
    result = _printing_job(tmp_path, "output='live'")
    for x in range(5):
        assert f"remote stdout {x}" in result.stderr
    assert "--- fnmap: output" not in result.stdout
    assert "remote" not in result.stdout


def test_no_output_shown_with_output_none(tmp_path):
    result = _printing_job(tmp_path, "output='none'")
    assert "remote" not in result.stdout + result.stderr
    assert "--- fnmap: output" not in result.stdout


def test_an_unknown_output_mode_is_refused_with_the_choices():
    from fnmap.errors import ConfigError

    with pytest.raises(ConfigError, match=r"output='loud'.*is not an output mode; use one of: after, live, none"):
        fnmap.map(abs, [1], output="loud")


INTERRUPTED_JOB = """\
    import pathlib
    import time

    import fnmap

    MARK = pathlib.Path(__file__).with_name("running")


    def work(x):
        MARK.touch()
        time.sleep(60)
        return x


    fnmap.map(work, range(20), workers=16)
"""


def test_ctrl_c_shows_the_interrupt_and_nothing_of_fnmaps_emulator(tmp_path):
    """A Ctrl-C abandons the calls running in the emulator; they end without a traceback of its own."""
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(INTERRUPTED_JOB))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + SCRIPT_TIMEOUT
        while not (tmp_path / "running").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert (tmp_path / "running").exists(), "no call started"
        time.sleep(1)  # let the other calls reach their workers too
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=SCRIPT_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "KeyboardInterrupt" in stderr
    assert stderr.count("Traceback (most recent call last)") == 1, stderr
    assert "TypeError" not in stderr and "fnmap/emulator" not in stderr, stderr
    assert "Fatal Python error" not in stderr, stderr


def _shout(x):
    print(f"shout {x}")
    return x


def test_a_cloud_worker_keeps_echoing_into_its_platform_log(emulator_process, capsys):
    """On the http backend (a deployed function; here an emulator serving as one) the worker's stderr
    is the platform's log (CloudWatch, Cloud Logging), not the caller's terminal: output="after" still
    writes each call's output there, and shows it here after the job."""
    emu = emulator_process()
    assert fnmap.map(_shout, range(3), chunksize=1, backend="http", http_url=emu.url, secret=emu.secret) == [0, 1, 2]
    shown = capsys.readouterr().out
    for x in range(3):
        assert f"shout {x}" in emu.output()
        assert f"--- fnmap: output of call {x} (item {x}) ---\nshout {x}\n" in shown


def test_an_executors_output_is_shown_at_shutdown(tmp_path):
    result = _run_script(tmp_path, """\
        import fnmap


        def work(x):
            print(f"remote {x}")
            return x


        with fnmap.Executor() as ex:
            futures = [ex.submit(work, x) for x in range(3)]
        print("USER-NEXT-LINE", [f.result() for f in futures])
    """)
    assert result.returncode == 0, result.stderr
    assert "remote" not in result.stderr
    out = result.stdout
    at = [out.index(f"--- fnmap: output of call {x} (item {x}) ---\nremote {x}\n") for x in range(3)]
    assert at == sorted(at) and at[-1] < out.index("USER-NEXT-LINE"), out
