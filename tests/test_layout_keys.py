"""Two layout rules of the job records' split (issue 22): the control path (the client, the
scheduler) imports nothing from ``fnmap.observe``, and the storage key layout is spelled and
parsed in ``fnmap/runtime/keys.py`` alone."""

from __future__ import annotations

import ast
import pathlib

import pytest
from test_layout import ROOT, fnmap_imports

CONTROL_PATH = ("fnmap/client.py", "fnmap/scheduler.py")
#: The prefixes of the key layout: no string outside keys.py starts with one.
LAYOUT = ("jobs/", "index/jobs/", "functions/", ".tmp-")


@pytest.mark.parametrize("name", CONTROL_PATH)
def test_the_control_path_imports_nothing_from_observe(name):
    path = ROOT / name
    bad = [f"line {line}: {mod}" for line, mod in fnmap_imports(path) if mod.startswith("fnmap.observe")]
    assert not bad, f"{name} imports the observation package: {bad}"


def _layout_strings(path: pathlib.Path) -> list[str]:
    """String constants (docstrings aside) and f-string parts of ``path`` that spell a key prefix."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and node.value.startswith(LAYOUT)]


def test_the_key_layout_is_spelled_in_keys_py_alone():
    keys_py = ROOT / "fnmap" / "runtime" / "keys.py"
    assert _layout_strings(keys_py)  # the rule sees the layout where it is
    bad = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "fnmap").rglob("*.py"))
           if p != keys_py and (found := _layout_strings(p))}
    assert not bad, f"key prefixes spelled outside fnmap/runtime/keys.py: {bad}"
