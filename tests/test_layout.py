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


#: The lower layers of the client side and what of fnmap each may import: nothing above it.
#: Configuration (config.py, the option declarations, the backend table and the emulator's option
#: parser it checks ``emulator_options`` with) never imports the backends or the command line, and
#: the deployment code (fnmap/deploy/) never the command line, the client or the emulator.
LOWER_LAYERS = {
    "configuration": (
        ["fnmap/config.py", "fnmap/options.py", "fnmap/backend_table.py", "fnmap/emulator/options.py"],
        ("fnmap.config", "fnmap.options", "fnmap.backend_table", "fnmap.errors", "fnmap.storage", "fnmap.runtime",
         "fnmap.emulator.options", "fnmap.emulator.faults"),
    ),
    "deployment": (
        sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fnmap" / "deploy").glob("*.py")),
        ("fnmap.deploy", "fnmap.errors", "fnmap.storage", "fnmap.runtime"),
    ),
}
#: (runtime/, storage/ and errors.py: test_runtime_code_never_imports_the_client_side above.)


def _upward(path: pathlib.Path, allowed: tuple, source: str | None = None) -> list[str]:
    return [f"line {line}: {name}" for line, name in fnmap_imports(path, source)
            if not any(name == a or name.startswith(a + ".") for a in allowed)]


@pytest.mark.parametrize("layer, path", [(layer, path) for layer, (paths, _) in LOWER_LAYERS.items() for path in paths],
                         ids=lambda v: str(v))
def test_lower_layers_import_nothing_above_them(layer, path):
    allowed = LOWER_LAYERS[layer][1]
    bad = _upward(ROOT / path, allowed)
    assert not bad, f"{path} ({layer}) imports from above its layer: {bad}; allowed: {', '.join(allowed)}"


def test_the_layer_rule_sees_upward_imports():
    """The checker over each lower layer: a backend, the command line or the client imported anywhere in
    the file (lazily inside a function too) is found."""
    config_paths, config_allowed = LOWER_LAYERS["configuration"]
    deploy_paths, deploy_allowed = LOWER_LAYERS["deployment"]
    assert "fnmap/config.py" in config_paths and "fnmap/deploy/batch.py" in deploy_paths
    probe = "from .backends import BACKENDS\ndef f():\n    from .cli.emulator import check_options\n"
    assert _upward(ROOT / "fnmap" / "config.py", config_allowed, probe) == [
        "line 1: fnmap.backends.BACKENDS", "line 3: fnmap.cli.emulator.check_options"]
    probe = "def main():\n    from ..cli import main\n    from ..emulator import lambda_manage\n"
    assert _upward(ROOT / "fnmap" / "deploy" / "batch.py", deploy_allowed, probe) == [
        "line 2: fnmap.cli.main", "line 3: fnmap.emulator.lambda_manage"]
