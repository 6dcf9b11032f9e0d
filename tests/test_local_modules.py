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


def run_script(folder, source: str) -> subprocess.CompletedProcess:
    (folder / "helper3.py").write_text(HELPER)
    (folder / "main.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "main.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_module_imported_inside_the_function_is_named_with_the_fix(tmp_path):
    done = run_script(tmp_path, INSIDE)
    assert done.returncode != 0, done.stdout
    assert "ModuleNotFoundError: No module named 'helper3'" in done.stderr
    assert f"module 'helper3' is a local module here ({tmp_path / 'helper3.py'})" in done.stderr, done.stderr
    assert "Import it at module level" in done.stderr


def test_a_module_imported_at_module_level_ships_by_value(tmp_path):
    done = run_script(tmp_path, AT_MODULE_LEVEL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[2, 4]"
