"""Remote tracebacks point at the user's code: its file, line and source line.

A function defined in a notebook cell travels by value, and its source exists
only in the client (IPython registers each cell in :mod:`linecache`).  These
tests define a function the same way: compiled from a file name the worker
cannot read, with the source known only to this process's linecache.
"""

from __future__ import annotations

import linecache
import traceback

import pytest

import fnmap

CELL_SOURCE = '''\
def parse(x):
    value = int(x)
    if value == 1:
        raise ValueError(f"bad item {value}")
    return value
'''


@pytest.fixture
def cell_function(tmp_path):
    """``parse`` as a notebook cell would define it: its file exists only in this process's linecache."""
    filename = str(tmp_path / "not-on-any-worker" / "cell-7.py")
    linecache.cache[filename] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(keepends=True), filename)
    namespace = {"__name__": "notebook_cell_7"}  # not importable: cloudpickle ships it by value
    exec(compile(CELL_SOURCE, filename, "exec"), namespace)
    yield namespace["parse"], filename
    linecache.cache.pop(filename, None)


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_remote_traceback_names_the_users_file_line_and_source(cell_function, backend):
    parse, filename = cell_function
    with pytest.raises(ValueError) as info:
        fnmap.map(parse, ["0", "1", "2"], backend=backend)
    shown = "".join(traceback.format_exception(info.value))
    assert "<dynamic-code>" not in shown
    assert f'File "{filename}", line 4, in parse' in shown
    assert 'raise ValueError(f"bad item {value}")' in shown


def test_source_lines_the_worker_showed_are_not_repeated():
    from fnmap.runtime.serialization import add_local_source_lines

    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{__file__}", line 1, in <module>\n'
        "    already shown\n"
        "ValueError: x\n"
    )
    assert add_local_source_lines(tb) == tb
