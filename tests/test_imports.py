"""No import circle in ``fnmap/``: the modules form layers, each readable and testable without those above it.
And a plain map imports only what a map needs (:func:`test_a_plain_map_imports_only_what_a_map_needs`).

Every ``import`` counts, at module level and inside functions alike.  An import inside a function
is still a dependency of its module; fnmap defers one only to keep ``import fnmap`` light (boto3,
Flask, the client machinery), and a deferred import is also how a circle hides: every circle this
check found when it was written (``client`` <-> ``redrive``, ``attach`` <-> ``redrive``, ``api``
<-> ``named``) ran through one, while the module-level imports alone were acyclic already.
Names that a registry imports by string at run time (``fnmap/backends/__init__.py``, the command
line's subcommands) are no edge: choosing among them by name is what a registry is for.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from test_layout import ROOT, fnmap_imports


def _module(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(sources: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module of ``fnmap/`` -> the modules of ``fnmap/`` it imports (``sources``: the text of some
    files, by path under the root, in place of what is on disk)."""
    sources = sources or {}
    paths = {_module(p): p for p in sorted((ROOT / "fnmap").rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        edges = set()
        for _, imported in fnmap_imports(path, sources.get(str(path.relative_to(ROOT)))):
            while imported not in paths:  # `from .client import get_client` imports fnmap.client
                imported = imported.rpartition(".")[0]
            if imported != name:
                edges.add(imported)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``[a, b, ..., a]``) through each group of modules that import one another
    (each strongly connected component of more than one module, by Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(set(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_in(graph, group) for group in groups]


def _circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path from the group's first module back to it, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle in {group}")


def test_no_import_circle_in_fnmap():
    found = [" -> ".join(circle) for circle in circles(import_graph())]
    assert not found, ("modules of fnmap/ import one another (inside functions too): " + "; ".join(found)
                       + ". Move what both need into a module below both, or hand the lower one an object")


def test_the_check_finds_a_circle_behind_an_import_inside_a_function():
    """The checker itself: one import inside a function, from a low module up to one that imports it,
    is a circle, named module by module."""
    lease = (ROOT / "fnmap" / "lease.py").read_text()
    assert "fnmap.lease" in import_graph()["fnmap.observe.records"]
    probe = {"fnmap/lease.py": lease + "\n\ndef _probe():\n    from .observe.records import load\n"}
    assert circles(import_graph(probe)) == [["fnmap.lease", "fnmap.observe.records", "fnmap.lease"]]
    assert "fnmap.lease" in import_graph()["fnmap.attach"]
    probe = {"fnmap/lease.py": lease + "\n\ndef _probe():\n    from . import attach\n"}
    assert circles(import_graph(probe)) == [["fnmap.attach", "fnmap.lease", "fnmap.attach"]]


#: Modules a plain ``fnmap.map`` has no use for: each loads where its feature is used (a job name, a
#: redrive or re-attach, a cost cap, a ``map_reduce``'s shared cap, a plot, an Executor, the
#: dashboard, the command line, an awaited twin's ``asyncio``).  Every fresh script and command
#: paid for them at its first map.
NOT_FOR_A_PLAIN_MAP = ("fnmap.named", "fnmap.redrive", "fnmap.attach", "fnmap.cost.forecast", "fnmap.cost.shared",
                       "fnmap.cost.budget", "fnmap.observe.plot", "fnmap.executor", "fnmap.dashboard", "fnmap.cli",
                       "asyncio")

PLAIN_MAP = """
import sys, fnmap
assert fnmap.map(abs, [-1, -2, -3]) == [1, 2, 3]
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("backend, idle", [("emulator", "120"), ("local", "0")])
def test_a_plain_map_imports_only_what_a_map_needs(backend, idle):
    """A fresh process's ``import fnmap; fnmap.map(...)``, on the emulator its processes share and on
    ``local``, loads none of :data:`NOT_FOR_A_PLAIN_MAP` (nor a module of theirs)."""
    env = dict(os.environ, FNMAP_BACKEND=backend, FNMAP_EMULATOR_IDLE=idle)
    done = subprocess.run([sys.executable, "-c", PLAIN_MAP], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert "fnmap.client" in loaded, loaded  # the map ran in this process
    needless = [m for m in loaded if any(m == name or m.startswith(name + ".") for name in NOT_FOR_A_PLAIN_MAP)]
    assert not needless, (f"a plain map on {backend} imported {needless}: import each where its feature is used "
                          "(the option that asks for it, the failure that needs it), not at module level")
