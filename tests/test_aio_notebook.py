"""The asyncio twins in a real Jupyter kernel, whose cells run on the kernel's running event loop."""

from __future__ import annotations

import pytest
from test_notebook import run_cells, text_of

pytestmark = pytest.mark.timeout(180)


def test_a_cell_awaits_map_aio_and_blocking_forms_warn_only_inside_coroutines(tmp_path):
    cells = [
        "import asyncio, warnings, fnmap\nwarnings.simplefilter('always')",
        # top-level await in a cell, beside the blocking form (a cell is not a coroutine: no warning)
        "out = await fnmap.map.aio(abs, range(-5, 0))\nprint(out == fnmap.map(abs, range(-5, 0)), out)",
        "async def inside():\n    return fnmap.map(abs, [-7])\nprint(await inside())",
        "print([r async for r in fnmap.imap.aio(abs, range(-3, 0))])",
    ]
    outputs = run_cells(cells, tmp_path)
    top_level, in_coroutine, streamed = (text_of(o) for o in outputs[1:])
    assert "True [5, 4, 3, 2, 1]" in top_level and "BlockingCallWarning" not in top_level, top_level
    assert "[7]" in in_coroutine, in_coroutine
    assert "BlockingCallWarning" in in_coroutine and "await fnmap.map.aio(...)" in in_coroutine, in_coroutine
    assert "return fnmap.map(abs, [-7])" in in_coroutine  # the warning names the cell's line
    assert "[3, 2, 1]" in streamed, streamed
