"""A script's neighbour modules: shipped by value when used at module level, a clear error when
imported inside the function (the emulator must not hide what a cloud worker would do)."""

from __future__ import annotations

import os
import subprocess
import sys

HELPER = "def twice(x):\n    return 2 * x\n"

INSIDE = """
import fnmap
def f(x):
    import helper3
    return helper3.twice(x)
print(fnmap.map(f, [1, 2]))
"""

AT_MODULE_LEVEL = """
import fnmap
import helper3
def f(x):
    return helper3.twice(x)
print(fnmap.map(f, [1, 2]))
"""


CACHED_HELPER = """
import functools, os
@functools.lru_cache(maxsize=8)
def table(n):
    return (n * 10, os.getpid())
def use(x):
    return table(x % 2)
"""

CACHED = """
import fnmap
import helper3
def f(x):
    value, pid = helper3.use(x)
    return value, pid, helper3.table.cache_info().hits, helper3.table.cache_parameters()
print(repr(fnmap.map(f, range(6), chunksize=3, workers=1)))
"""

#: The tree whose fnmap the scripts use (the test folder itself stays off the path: the helper
#: module must travel, not be found by the workers).
FNMAP_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(folder, source: str, helper: str = HELPER) -> subprocess.CompletedProcess:
    (folder / "helper3.py").write_text(helper)
    (folder / "main.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env["PYTHONPATH"] = FNMAP_ROOT
    return subprocess.run([sys.executable, "main.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_module_imported_inside_the_function_is_named_with_the_fix(tmp_path):
    done = run_script(tmp_path, INSIDE)
    assert done.returncode != 0, done.stdout
    assert "ModuleNotFoundError: No module named 'helper3'" in done.stderr
    assert f"module 'helper3' is a local module here ({tmp_path / 'helper3.py'})" in done.stderr, done.stderr
    assert "Import it at module level" in done.stderr
    # the local-file note alone: not the worker's advice to install a PyPI package of that name first
    assert "pip install helper3" not in done.stderr and "helper3 is not installed" not in done.stderr, done.stderr


def test_a_module_imported_at_module_level_ships_by_value(tmp_path):
    done = run_script(tmp_path, AT_MODULE_LEVEL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 4]"


def test_a_module_with_an_lru_cache_function_travels_by_value(tmp_path):
    """``@functools.lru_cache(maxsize=8)`` in a local module once stopped the module from travelling
    (the cached function pickled by name) with a hint blaming an import inside the function."""
    done = run_script(tmp_path, CACHED, CACHED_HELPER)
    assert done.returncode == 0, done.stderr
    results = eval(done.stdout.strip())
    assert [value for value, *_ in results] == [0, 10, 0, 10, 0, 10]
    assert {pid for _v, pid, *_ in results}.isdisjoint({os.getpid()})
    # One call of three items: the first two fill the cache, the third is a hit; same settings.
    assert [hits for _v, _p, hits, _s in results][:3] == [0, 0, 1], results
    assert results[0][3] == {"maxsize": 8, "typed": False}


BY_NAME_HELPER = """
class Marker:
    def __reduce__(self):  # pickles itself by name, as some C-level wrappers do
        return "MARKER"
MARKER = Marker()
"""

BY_NAME = """
import fnmap
import helper3
class Here:
    def __reduce__(self):
        return "HERE"
HERE = Here()
def uses_module(x):
    return helper3.MARKER
def uses_main(x):
    return HERE
for f in (uses_module, uses_main):
    try:
        fnmap.map(f, [1])
    except Exception as e:
        print(type(e).__name__, *getattr(e, "__notes__", []))
"""


def test_what_still_pickles_by_name_gets_a_hint_that_says_so(tmp_path):
    """The module travelled; an object in it did not: the hint must not blame an import inside the
    function alone, and a ``__main__`` name the worker lacks is explained too."""
    done = run_script(tmp_path, BY_NAME, BY_NAME_HELPER)
    assert done.returncode == 0, done.stderr
    module_line, main_line = done.stdout.strip().splitlines()
    assert module_line.startswith("ModuleNotFoundError"), module_line
    assert "travels by value with the function, but something asked the worker to import it by name" in module_line
    assert "pickles itself by name" in module_line
    assert main_line.startswith("AttributeError"), main_line
    assert "__main__.HERE was pickled by reference" in main_line and "plain function" in main_line


def test_a_module_file_is_resolved_as_realpath_does_folder_by_folder(tmp_path):
    """Which modules travel by value is decided on their resolved path: a folder resolved once for all
    its modules must give what ``os.path.realpath`` gives, a linked folder or file included."""
    from fnmap.runtime.local_modules import _real_path

    project = tmp_path / "project"
    project.mkdir()
    (project / "mod.py").write_text("x = 1\n")
    (tmp_path / "linked_folder").symlink_to(project)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "linked_file.py").symlink_to(project / "mod.py")
    for path in (project / "mod.py", tmp_path / "linked_folder" / "mod.py", tmp_path / "plain" / "linked_file.py"):
        assert _real_path(str(path)) == os.path.realpath(path) == str((project / "mod.py").resolve())
