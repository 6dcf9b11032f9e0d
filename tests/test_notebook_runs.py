"""A map in a real Jupyter kernel, driven as JupyterLab drives it (jupyter_client): ``output="live"``
lines in the running cell, and a job stopped by a restart of the kernel."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import until

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("ipykernel") is None, reason="ipykernel is not installed")]

#: The tree whose fnmap the kernel uses.
FNMAP_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Kernel:
    """A kernel started in ``folder`` with its stderr (fd 2, the Jupyter server's console) to a file."""

    def __init__(self, folder, **env: str):
        from jupyter_client import KernelManager

        self.stderr_path = folder / "kernel-stderr.txt"
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.km = KernelManager(kernel_name="python3")
        # Not PYTEST_CURRENT_TEST either: ipykernel would not take over its fd 2 as it does in JupyterLab.
        full = {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "PYTEST_"))}
        full.update(PYTHONPATH=FNMAP_ROOT, FNMAP_STORAGE=os.environ["FNMAP_STORAGE"], FNMAP_PROGRESS="false")
        full.update(env)
        self.km.start_kernel(env=full, cwd=str(folder), stderr=self._stderr)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout: float = 180) -> tuple[dict, str]:
        """Run a cell; its reply's content and what it wrote (streams, in order)."""
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.kc.execute_interactive(textwrap.dedent(code), timeout=timeout, output_hook=hook)
        return reply["content"], "".join(out)

    def stop(self) -> None:
        if self._stderr.closed:
            return
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._stderr.close()


@pytest.fixture
def kernel_in(tmp_path):
    started = []

    def start(**env: str) -> Kernel:
        kernel = Kernel(tmp_path, **env)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.stop()


LIVE_CELL = """
import sys, time, fnmap

def shout(x):
    for i in range(3):
        stream = sys.stderr if i == 1 else sys.stdout
        print(f"live line {x}-{i} " + "x" * 60, file=stream)
        time.sleep(0.002)
    return x

print("done", len(fnmap.map(shout, range(40), chunksize=1, output="live", workers=8)))
"""

LINE = re.compile(r"live line (\d+)-(\d) x{60}")


@pytest.mark.parametrize("idle", ["0", "120"])
def test_live_output_arrives_whole_in_the_cell_and_not_on_the_kernels_stderr(kernel_in, idle):
    """120 lines from 40 concurrent calls (print to stdout and to stderr), on an emulator of the
    kernel's own and on the one shared by the user's processes: each line whole in the cell's output,
    none on the kernel's real stderr (the Jupyter server's console)."""
    kernel = kernel_in(FNMAP_EMULATOR_IDLE=idle, PYTHONUNBUFFERED="1")  # print writes its text and its end apart
    for _cell in range(2):  # the second cell's lines in the second cell, not in the first
        reply, shown = kernel.run(LIVE_CELL)
        assert reply["status"] == "ok", reply
        assert "done 40" in shown, shown
        lines = [line for line in shown.splitlines() if "live line" in line]
        spliced = [line for line in lines if not LINE.fullmatch(line)]
        assert not spliced, f"{len(spliced)} of {len(lines)} lines spliced: {spliced[:5]}"
        assert sorted(LINE.fullmatch(line).groups() for line in lines) == sorted(
            (str(x), str(i)) for x in range(40) for i in range(3))
    kernel.stop()
    on_console = kernel.stderr_path.read_text()
    assert "live line" not in on_console, on_console[-2000:]



TAIL_CELL = """
import fnmap

def tail(x):
    print("a line without its end", end="")
    return x

print(fnmap.map(tail, [1], output="live"))
"""


def test_a_calls_last_line_without_its_end_is_in_its_cell(kernel_in):
    """The relay writes whole lines, but what a call left without its end of line is shown when its
    map ends, in its own cell."""
    kernel = kernel_in(FNMAP_EMULATOR_IDLE="0", PYTHONUNBUFFERED="1")
    for _cell in range(2):
        reply, shown = kernel.run(TAIL_CELL)
        assert reply["status"] == "ok", reply
        assert shown.count("a line without its end") == 1, shown


SLOW_CELL = """
import os, time, fnmap

def slow(x):
    if x >= 4:
        open(f"started-{x}", "w").close()
        time.sleep(120)
    return x

fnmap.map(slow, range(24), chunksize=1, workers=4)
"""


def fnmap_cli(storage: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    done = subprocess.run([sys.executable, "-m", "fnmap", *args, "--storage", storage], capture_output=True,
                          text=True, timeout=120, env=dict(env, PYTHONPATH=FNMAP_ROOT))
    assert done.returncode == 0, done.stderr
    return done.stdout


def _start_slow_map(kernel: Kernel, folder) -> str:
    """Run the slow cell without waiting for it; its message id, once its slow calls have started."""
    msg_id = kernel.kc.execute(textwrap.dedent(SLOW_CELL))
    until(lambda: any(folder.glob("started-*")), 120)
    return msg_id


def _slow_job(storage: str) -> dict:
    (summary,) = [s for s in json.loads(fnmap_cli(storage, "jobs", "--json")) if s["function"] == "slow"]
    return summary


@pytest.mark.parametrize("how, idle", [("restart", "300"), ("shutdown", "300"), ("restart", "0")])
def test_a_graceful_kernel_restart_leaves_its_job_abandoned_with_a_redrive_offered(kernel_in, tmp_path, how, idle):
    """JupyterLab's restart button (jupyter_client: interrupt, then a shutdown request, then a new
    kernel), or its shut-down: the running map was not cancelled by its user, its client went away;
    its items with no result are for ``fnmap redrive``.  On the emulator shared by the user's
    processes, and on one of the kernel's own (stopped with it)."""
    storage = (tmp_path / "storage").as_uri()
    kernel = kernel_in(FNMAP_STORAGE=storage, FNMAP_EMULATOR_IDLE=idle)
    _start_slow_map(kernel, tmp_path)
    if how == "restart":
        kernel.km.restart_kernel(now=False)
    else:
        kernel.km.shutdown_kernel(now=False)
    summary = _slow_job(storage)
    assert summary["status"] == "abandoned", summary
    shown = fnmap_cli(storage, "job", summary["job_id"])
    assert "raised   KeyboardInterrupt" not in shown, shown
    assert re.search(r"`fnmap redrive \w+` runs the (\d+) item\(s\) left", shown), shown
    left = int(re.search(r"runs the (\d+) item", shown).group(1))
    assert 4 <= 24 - left <= 20 and left >= 4, shown  # the fast items have results, the slow ones none


def test_an_interrupted_cell_still_cancels_its_job(kernel_in, tmp_path):
    """The interrupt button alone is the user's Ctrl-C: the job is cancelled, and the kernel lives on;
    shut down later, the kernel leaves the job as its user did."""
    storage = (tmp_path / "storage").as_uri()
    kernel = kernel_in(FNMAP_STORAGE=storage)
    msg_id = _start_slow_map(kernel, tmp_path)
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kernel.kc.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply
    until(lambda: _slow_job(storage)["status"] != "running", 60)
    summary = _slow_job(storage)
    assert summary["status"] == "cancelled", summary
    assert summary["raised"]["error"].startswith("KeyboardInterrupt"), summary
    reply, shown = kernel.run("print(fnmap.map(abs, [-1, -2]))")
    assert reply["status"] == "ok" and "[1, 2]" in shown, (reply, shown)
    from fnmap.lease import SHUTDOWN_INTERRUPT_SECONDS

    time.sleep(SHUTDOWN_INTERRUPT_SECONDS + 1)  # the interrupt was the user's, long before the shutdown
    kernel.km.shutdown_kernel(now=False)
    assert _slow_job(storage)["status"] == "cancelled"
