"""The one architectural rule, checked: code that runs where the calls run never imports the client.

``fnmap/runtime/`` (with ``fnmap/storage/`` and ``fnmap/errors.py``, which both sides share) and
``handlers/`` are what the cloud function, the container and the emulator's workers load.  If one
of them imported the client side (``fnmap.api``, ``fnmap.client``, ``fnmap.backends``, the Dask
shim, the CLI...), the worker would drag the client's dependencies into every cloud package and
the two sides could no longer be read, versioned or packaged apart.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: What runtime code may import from fnmap: itself and the two shared parts.
ALLOWED = ("fnmap.runtime", "fnmap.storage", "fnmap.errors")


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def fnmap_imports(path: pathlib.Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every ``fnmap...`` name that ``path`` imports (relative imports resolved), with its line."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            # Each imported name, as a module path: `from fnmap import client` imports fnmap.client,
            # `from ..errors import ConfigError` a name under fnmap.errors.
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return [(line, name) for line, name in found if name == "fnmap" or name.startswith("fnmap.")]


def runtime_files() -> list[pathlib.Path]:
    files = [*sorted((ROOT / "fnmap" / "runtime").rglob("*.py")), *sorted((ROOT / "fnmap" / "storage").rglob("*.py")),
             ROOT / "fnmap" / "errors.py", *sorted((ROOT / "handlers").glob("*.py"))]
    assert len(files) > 10, files
    return files


@pytest.mark.parametrize("path", runtime_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_runtime_code_never_imports_the_client_side(path):
    bad = [f"line {line}: {name}" for line, name in fnmap_imports(path)
           if not any(name == a or name.startswith(a + ".") for a in ALLOWED)]
    assert not bad, f"{path.relative_to(ROOT)} imports the client side: {bad}"


def test_the_rule_sees_relative_and_absolute_imports():
    """The checker itself: each spelling of a forbidden import is found, with its line."""
    worker = ROOT / "fnmap" / "runtime" / "worker.py"
    probe = "from .. import client\nfrom ..api import map\nimport fnmap.backends.aws\nfrom fnmap import executor\n"
    names = [name for _, name in fnmap_imports(worker, probe)]
    assert names == ["fnmap.client", "fnmap.api.map", "fnmap.backends.aws", "fnmap.executor"]
    assert {name for _, name in fnmap_imports(ROOT / "handlers" / "aws_lambda.py")} >= {"fnmap.runtime.worker"}
