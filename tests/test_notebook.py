"""fnmap in a real Jupyter kernel (ipykernel driven by nbclient), as a notebook user meets it."""

from __future__ import annotations

import importlib.util
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

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
