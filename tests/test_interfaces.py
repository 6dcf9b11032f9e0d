"""One name per thing and honest interfaces, checked.

* The ``Backend`` Protocol lists every member the client side uses of a backend: what a platform
  can do is a declared attribute with a default on ``BaseBackend``, never probed with ``getattr``
  nor inferred from the backend's name.  Otherwise the Protocol is a partial story and a new
  backend finds out what it lacks at run time.
* The scheduler is composed: it builds its dispatch and its monitor and hands them what they
  need; no module plants attributes on it from outside.
* No two classes of fnmap share a name, so a class name in a traceback or a review names one thing.
"""

from __future__ import annotations

import ast
import collections
import importlib
import pathlib

import pytest

from fnmap.backend_table import BACKENDS
from fnmap.backends.base import Backend, BaseBackend

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The modules that may name backends: the table of names, and the configuration that resolves them.
NAMES_BACKENDS = {"fnmap/backend_table.py", "fnmap/config.py", "fnmap/options.py"}


def _client_side() -> list[pathlib.Path]:
    """Every client-side module that uses a backend without being one."""
    files = [p for p in sorted((ROOT / "fnmap").rglob("*.py"))
             if not p.relative_to(ROOT).as_posix().startswith(("fnmap/backends/", "fnmap/runtime/", "fnmap/emulator/"))]
    assert len(files) > 30, files
    return files


def _declared() -> set[str]:
    """The members the ``Backend`` Protocol declares: its annotated attributes and its methods."""
    tree = ast.parse((ROOT / "fnmap/backends/base.py").read_text())
    protocol = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Backend")
    return {n.target.id for n in protocol.body if isinstance(n, ast.AnnAssign)} | \
           {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}


def _is_backend(node: ast.AST) -> bool:
    """``backend``, ``self.backend``, ``client.backend``...: an expression naming a backend object."""
    return (isinstance(node, ast.Name) and node.id == "backend") or \
           (isinstance(node, ast.Attribute) and node.attr == "backend" and not _is_config(node.value))


def _is_config(node: ast.AST) -> bool:
    """``config``, ``cfg``, ``job.config``: the resolved options, whose ``backend`` is a name."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in ("config", "cfg")


def backend_uses(source: str) -> list[tuple[int, str]]:
    """What ``source`` uses of a backend object outside the Protocol, or probes for: ``(line, what)``."""
    declared = _declared()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_backend(node.value) and node.attr not in declared:
            found.append((node.lineno, f"backend.{node.attr} (not declared on the Backend Protocol)"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and node.args and _is_backend(node.args[0]):
            found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, ...) probes the backend"))
    return found


def backend_names_tested(source: str) -> list[tuple[int, str]]:
    """Comparisons with a backend's user-facing name in ``source``: ``(line, the comparison)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                constants = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                if any(isinstance(c, ast.Constant) and c.value in BACKENDS for c in constants):
                    found.append((node.lineno, ast.unparse(node)))
                    break
    return found


@pytest.mark.parametrize("path", _client_side(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_client_side_uses_only_what_the_backend_protocol_declares(path):
    bad = backend_uses(path.read_text())
    assert not bad, f"{path.relative_to(ROOT)}: declare it on Backend and BaseBackend instead: {bad}"


@pytest.mark.parametrize("path", sorted((ROOT / "fnmap").glob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_core_never_tests_a_backend_by_name(path):
    """The core (``fnmap/*.py``: the scheduler, the client, the front-ends) asks the backend what it
    can do; only the table of names and the configuration name backends.  (Readers of stored
    records, such as the cost estimate, go by the platform a record names.)"""
    if path.relative_to(ROOT).as_posix() in NAMES_BACKENDS:
        return
    bad = backend_names_tested(path.read_text())
    assert not bad, f"{path.relative_to(ROOT)}: declare a capability on the backend instead: {bad}"


@pytest.mark.parametrize("probe, what", [
    ('limit = getattr(self.backend, "group_limit", 0)', "getattr"),
    ("if hasattr(client.backend, 'spawn'): pass", "hasattr"),
    ("n = self._client.backend.fanout_slice", "fanout_slice"),
    ("backend.invoke_everything(calls)", "invoke_everything"),
    ('echo = cfg.backend not in ("emulator", "local")', "emulator"),
    ('if job.config.backend == "batch": pass', "batch"),
])
def test_the_rules_see_probes_undeclared_members_and_names(probe, what):
    found = backend_uses(probe) + backend_names_tested(probe)
    assert found and what in found[0][1], (probe, found)


def test_the_rules_leave_declared_members_and_the_backend_option_alone():
    probe = ("self.backend.invoke(inv)\nlimit = self.backend.group_limit\nname = config.backend\n"
             "cfg.backend.upper()\nif client.backend.fans_out: pass\n")
    assert backend_uses(probe) == [] and backend_names_tested(probe) == []


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_has_every_member_of_the_protocol(name):
    """Each member has a default on ``BaseBackend`` or the backend's own, so nothing need probe."""
    module, cls_name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    assert issubclass(cls, BaseBackend)
    missing = sorted(m for m in _declared() if not hasattr(cls, m))
    assert not missing, f"{cls_name} lacks {missing}"
    assert _declared() <= set(dir(Backend)) | set(Backend.__annotations__)


def test_the_scheduler_is_composed_and_nothing_plants_attributes_on_it():
    tree = {name: ast.parse((ROOT / f"fnmap/{name}.py").read_text()) for name in ("scheduler", "dispatch", "monitor")}
    for name, module in tree.items():
        for node in module.body:
            if isinstance(node, ast.ClassDef):
                assert not node.bases, f"fnmap/{name}.py: {node.name} mixes in {[ast.unparse(b) for b in node.bases]}"
        assert "scheduler" not in {n.module for n in ast.walk(module) if isinstance(n, ast.ImportFrom)}, name
    planted = []
    for path in sorted((ROOT / "fnmap").rglob("*.py")):
        if path.name == "scheduler.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and ast.unparse(target.value).endswith("scheduler"):
                        planted.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(target)}")
    assert not planted, f"pass it to Scheduler(...) instead: {planted}"


def test_no_two_classes_of_fnmap_share_a_name():
    where = collections.defaultdict(list)
    for path in sorted((ROOT / "fnmap").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    shared = {name: places for name, places in where.items() if len(places) > 1}
    assert not shared, f"one name per class: {shared}"
