"""fnmap in a real Jupyter kernel (ipykernel driven by nbclient), as a notebook user meets it."""

from __future__ import annotations

import importlib.util
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.util import run_sync

pytestmark = pytest.mark.timeout(180)


def run_cells(cells: list[str], tmp_path) -> list[dict]:
    """Run ``cells`` in a fresh kernel in ``tmp_path``; return each cell's outputs."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=dict(os.environ))
    return [cell.get("outputs", []) for cell in nb.cells]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def text_of(outputs: list[dict]) -> str:
    parts = []
    for out in outputs:
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return _ANSI.sub("", "".join(parts))


def test_progress_without_ipywidgets_is_quiet_text(tmp_path):
    if importlib.util.find_spec("ipykernel") is None:  # not imported here: fnmap would think it runs in a kernel
        pytest.skip("ipykernel is not installed")
    if __import__("importlib").util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed here: the widget bar is used")
    outputs = run_cells(["import fnmap\nprint(sum(fnmap.map(abs, range(-150, 0), progress=True)))"], tmp_path)
    shown = text_of(outputs[0])
    assert "11325" in shown, shown
    assert "TqdmWarning" not in shown and "IProgress" not in shown, shown
    assert "150/150" in shown, shown  # the text bar, drawn to the cell's stderr


def test_traceback_of_a_cell_function_shows_the_cells_source(tmp_path):
    cells = [
        "import fnmap",
        "def parse(x):\n    if x == 2:\n        raise ValueError(f'bad item {x}')\n    return x",
        "fnmap.map(parse, range(4))",
    ]
    shown = text_of(run_cells(cells, tmp_path)[2])
    assert "ValueError" in shown and "bad item 2" in shown, shown
    assert "<dynamic-code>" not in shown, shown
    assert "raise ValueError(f'bad item {x}')" in shown, shown


def test_a_functools_cache_function_of_the_notebook_travels(tmp_path):
    """``@functools.cache def load_model()`` in a cell, used by the mapped function: it once failed
    with "Can't get attribute 'load_model' on <module '__main__'>" (issue 24)."""
    cells = [
        "import functools, os, fnmap",
        "@functools.cache\ndef load_model():\n    return {'weight': 3, 'pid': os.getpid()}",
        "def predict(x):\n    model = load_model()\n"
        "    return x * model['weight'], model['pid'], load_model.cache_info().hits",
        "out = fnmap.map(predict, range(4), chunksize=4)\nprint(out)\nprint('kernel', os.getpid())",
    ]
    shown = text_of(run_cells(cells, tmp_path)[3])
    assert "Error" not in shown, shown
    results = eval(shown.splitlines()[0])
    kernel_pid = int(shown.splitlines()[1].split()[1])
    assert [value for value, _pid, _hits in results] == [0, 3, 6, 9]
    assert {pid for _v, pid, _h in results} != {kernel_pid}  # loaded on the worker, not in the kernel
    assert [hits for _v, _p, hits in results] == [0, 1, 2, 3]  # one load, then the worker's cache


def test_a_named_map_of_a_cell_re_attaches_after_a_kernel_restart(tmp_path):
    """The cell's function names the kernel's own file (``/tmp/ipykernel_<pid>/...``): the same cell
    after a restart is the same function, so the named job is picked up, not refused or run again."""
    runs = tmp_path / "runs.txt"
    cell = (f"import fnmap\nRUNS = {str(runs)!r}\n"
            "def slow(x):\n    with open(RUNS, 'a') as f:\n        f.write(f'{x}\\n')\n    return x * 3\n"
            "print(fnmap.map(slow, range(6), job_name='kernel-restart-' + " + repr(tmp_path.name) + "))\n"
            "import os; print('kernel', os.getpid())")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    shown = []
    with client.setup_kernel(env=dict(os.environ)):
        for restart in (False, True):
            if restart:
                run_sync(client.km.restart_kernel)(now=True)
                run_sync(client.kc.wait_for_ready)(timeout=60)
            nb.cells[0].outputs = []
            client.execute_cell(nb.cells[0], 0)
            shown.append(text_of(nb.cells[0].outputs))
    assert shown[0].splitlines()[0] == str([x * 3 for x in range(6)]), shown[0]
    assert shown[1].splitlines()[0] == shown[0].splitlines()[0], shown[1]  # re-attached: no JobNameTaken
    assert shown[1].splitlines()[1] != shown[0].splitlines()[1]  # in another kernel process
    assert sorted(int(x) for x in runs.read_text().split()) == list(range(6))  # nothing ran twice
