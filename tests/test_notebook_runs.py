"""A map in a real Jupyter kernel, driven as JupyterLab drives it (jupyter_client): ``output="live"``
lines in the running cell, and a job stopped by a restart of the kernel."""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap

import pytest

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
        full.update(PYTHONPATH=FNMAP_ROOT, FNMAP_STORAGE=os.environ["FNMAP_STORAGE"], FNMAP_PROGRESS="false", **env)
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
