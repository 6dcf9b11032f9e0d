"""``fnmap deploy aws env``: the packages a Lambda function's calls import, as a layer attached to it.

One step builds the environment for the function's runtime (its Python version) and
architecture, publishes it as a version of the layer ``<name>-deps`` and attaches it
(UpdateFunctionConfiguration ``Layers``).  The environment comes from one source:

* ``--requirements FILE``: ``pip install -r FILE`` of manylinux wheels for the function's
  platform (``--platform manylinux2014_x86_64`` or ``_aarch64``, ``--only-binary=:all:``);
* ``--lock FILE``: the same with ``--no-deps``: a fully pinned file (``pip freeze``,
  ``pip-compile``, ``uv pip compile``), every line ``name==version``;
* ``--from-imports SCRIPT_OR_MODULE``: the installed distributions its code imports (``import``
  statements at any depth), pinned to the versions installed here.

With ``--current`` the packages are copied from this environment's installed files instead of
downloaded (offline; only when this machine's Python and platform are the function's).

Cached by the hash of its inputs (the source's text or pins, runtime, architecture, mode): the
layer version's description carries the hash, so an unchanged environment publishes nothing and,
already attached, changes nothing.  ``fnmap deploy aws deploy --requirements`` uses the same step.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import tempfile
import zipfile

from ..errors import ConfigError, FnmapError
from .package import UNZIPPED_LIMIT, build_layer, host_architecture, unzipped_size

#: Changes when the way a layer is built changes, so layers built the old way are not reused.
_FORMAT = "1"
#: The marker of a layer version's description: ``fnmap-env:<sha256 of the inputs>``.
_MARKER = "fnmap-env:"
#: Lambda takes a layer's zip directly up to this size (bigger ones go through S3).
DIRECT_UPLOAD_LIMIT = 50 * 1024 * 1024
#: What the function's zip or Lambda's runtime already provides: never copied into a layer.
PROVIDED = {"fnmap", "cloudpickle", "boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six",
            "urllib3", "awslambdaric", "pip", "setuptools", "wheel"}


class Source:
    """Where an environment's packages come from; ``text`` is what its hash covers."""

    def __init__(self, kind: str, path: str, current: bool = False):
        self.kind, self.path, self.current = kind, path, current
        if kind == "imports":
            self.pins = pins_for(imported_distributions(path))
            self.text = "\n".join(self.pins)
        else:
            if not os.path.isfile(path):
                raise ConfigError(f"--{kind} {path!r} is not a file; pass a requirements.txt or a lock file")
            with open(path) as f:
                self.text = f.read()
            if kind == "lock":
                check_pinned(self.text, path)
            self.pins = [_requirement_name(line) for line in _requirement_lines(self.text)]

    def describe(self) -> str:
        flag = {"requirements": "--requirements", "lock": "--lock", "imports": "--from-imports"}[self.kind]
        return f"{flag} {os.path.basename(self.path)}" + (" --current" if self.current else "")

    def digest(self, runtime: str, architecture: str) -> str:
        parts = [_FORMAT, self.kind, str(self.current), runtime, architecture, self.text]
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file (no comments, options or hash continuations)."""
    lines = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            lines.append(line.split(" --hash", 1)[0].strip())
    return lines


def _requirement_name(line: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", line).group(0)


def check_pinned(text: str, path: str) -> None:
    loose = [line for line in _requirement_lines(text) if not re.match(r"^[A-Za-z0-9._\[\],-]+\s*===?\s*[^,;]+", line)]
    if loose:
        raise ConfigError(f"--lock {path!r} has requirements not pinned to one version: {', '.join(loose[:5])}; "
                          "a lock file pins every package (`pip freeze > FILE`, `pip-compile`), or pass it as "
                          "--requirements")


# -- --from-imports --------------------------------------------------------------------


def imported_distributions(script_or_module: str) -> list[str]:
    """The installed distributions (not the standard library, not local modules) that the code of a
    script, a module or a package imports, at any depth of its source."""
    files = _source_files(script_or_module)
    names: set[str] = set()
    for path in files:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    owners = importlib.metadata.packages_distributions()
    dists = {dist for name in names - set(sys.stdlib_module_names) for dist in owners.get(name, [])}
    return sorted(d for d in dists if _normal(d) not in PROVIDED)


def _source_files(script_or_module: str) -> list[str]:
    if os.path.isfile(script_or_module):
        return [script_or_module]
    if os.path.isdir(script_or_module):
        root = script_or_module
    else:
        try:
            spec = importlib.util.find_spec(script_or_module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise ConfigError(f"--from-imports {script_or_module!r} is neither a Python file nor an importable "
                              "module here; pass the script your functions are in (or its module name)")
        if not spec.submodule_search_locations:
            return [spec.origin]
        root = os.path.dirname(spec.origin)
    return sorted(os.path.join(folder, name) for folder, _dirs, names in os.walk(root)
                  for name in names if name.endswith(".py"))


def pins_for(dists: list[str]) -> list[str]:
    return [f"{d}=={importlib.metadata.version(d)}" for d in dists]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- building ---------------------------------------------------------------------------


def build(source: Source, runtime: str, architecture: str, path: str) -> str:
    """Write the layer's zip (``python/`` inside) for ``runtime`` and ``architecture`` to ``path``."""
    if source.current:
        return copy_current(source.pins, runtime, architecture, path)
    if source.kind == "imports":
        with tempfile.TemporaryDirectory() as tmp:
            pinned = os.path.join(tmp, "requirements.txt")
            with open(pinned, "w") as f:
                f.write(source.text + "\n")
            return build_layer(pinned, runtime, architecture, path)
    return build_layer(source.path, runtime, architecture, path, no_deps=source.kind == "lock")


def copy_current(names: list[str], runtime: str, architecture: str, path: str) -> str:
    """Zip the installed files of ``names`` and their dependencies into a layer (``python/``)."""
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not sys.platform.startswith("linux") or host_architecture() != architecture or here != runtime:
        raise ConfigError(
            f"--current copies this environment's installed files, built for {here} on {sys.platform} "
            f"{host_architecture()}, but the function runs {runtime} on linux {architecture}: leave out --current "
            "(manylinux wheels are downloaded for the function's platform)")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for dist in _closure([_requirement_name(name) for name in names]):
            for file in dist.files or []:
                if file.parts[0] in ("..", "__pycache__") or "__pycache__" in file.parts:
                    continue
                full = str(dist.locate_file(file))
                if os.path.isfile(full):
                    zf.write(full, os.path.join("python", *file.parts))
    return path


def _closure(names: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``names`` and everything they require (what Lambda provides left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = _normal(todo.pop())
        if name in found or name in PROVIDED:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ConfigError(f"--current: {name!r} is not installed here; pip install it, or leave out "
                              "--current to download it") from None
        found[name] = dist
        todo.extend(_requirement_name(r) for r in dist.requires or [] if _applies(r))
    return [found[k] for k in sorted(found)]


def _applies(requirement: str) -> bool:
    """Whether a dependency line applies here (no extra; its environment marker true)."""
    if ";" not in requirement:
        return True
    if "extra ==" in requirement or "extra==" in requirement:
        return False
    try:
        from packaging.markers import Marker
    except ImportError:
        return True
    return Marker(requirement.split(";", 1)[1]).evaluate()


# -- publishing and attaching ---------------------------------------------------------


def layer_for(lam, function: str, source: Source, runtime: str, architecture: str, out=print) -> str:
    """The ARN of the layer version holding ``source``'s environment: an existing version with the same
    hash, else a new one built and published now."""
    layer_name = f"{function}-deps"
    digest = source.digest(runtime, architecture)
    for version in _layer_versions(lam, layer_name):
        if _MARKER + digest in (version.get("Description") or ""):
            out(f"environment unchanged ({source.describe()}, {runtime}, {architecture}): layer "
                f"{version['LayerVersionArn']} reused, nothing built or published")
            return version["LayerVersionArn"]
    with tempfile.TemporaryDirectory() as tmp:
        path = build(source, runtime, architecture, os.path.join(tmp, "layer.zip"))
        data = _checked_layer(path)
    description = f"{_MARKER}{digest} {source.describe()}"[:256]
    layer = lam.publish_layer_version(
        LayerName=layer_name, Content={"ZipFile": data}, CompatibleRuntimes=[runtime],
        CompatibleArchitectures=[architecture], Description=description)
    out(f"environment layer {layer['LayerVersionArn']} published ({source.describe()}, {runtime}, "
        f"{architecture}; {len(data) / 1e6:.1f} MB zipped)")
    return layer["LayerVersionArn"]


def _checked_layer(path: str) -> bytes:
    size = unzipped_size(path)
    if size > UNZIPPED_LIMIT:
        raise FnmapError(f"the environment is {size / 2**20:.0f} MiB unzipped, over Lambda's 250 MiB for a "
                         "function and its layers: trim the requirements, or deploy an image (--image)")
    with open(path, "rb") as f:
        data = f.read()
    if len(data) > DIRECT_UPLOAD_LIMIT:
        raise FnmapError(f"the environment's layer is {len(data) / 2**20:.0f} MiB zipped, over the 50 MiB "
                         "Lambda takes in one request: trim the requirements, or deploy an image (--image)")
    return data


def _layer_versions(lam, layer_name: str) -> list[dict]:
    try:
        pages = lam.get_paginator("list_layer_versions").paginate(LayerName=layer_name)
        return [v for page in pages for v in page.get("LayerVersions", [])]
    except lam.exceptions.ResourceNotFoundException:
        return []


def attach(lam, function: str, layer_arn: str, current: list[str], out=print) -> bool:
    """Make ``layer_arn`` the function's environment layer (other layers kept); False if it already was."""
    ours = layer_arn.rsplit(":", 1)[0] + ":"
    layers = [arn for arn in current if not arn.startswith(ours)] + [layer_arn]
    if layers == current:
        out(f"function {function} already uses {layer_arn}: nothing changed")
        return False
    lam.update_function_configuration(FunctionName=function, Layers=layers)
    lam.get_waiter("function_updated").wait(FunctionName=function, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    out(f"function {function} now uses {layer_arn}")
    return True


def add_env_arguments(p) -> None:
    """The options of ``fnmap deploy aws env`` (``--requirements`` is deploy's too)."""
    e = p.add_argument_group(
        "environment (env, and deploy --requirements)",
        "`fnmap deploy aws env` builds the packages for the function's Python and architecture (pip's manylinux "
        "wheels), publishes them as the layer <name>-deps and attaches it. Cached by the hash of its inputs: an "
        "unchanged environment publishes nothing. One source: --requirements FILE, --lock FILE or "
        "--from-imports SCRIPT_OR_MODULE.")
    e.add_argument("--lock", metavar="FILE", help="a fully pinned file (pip freeze, pip-compile): installed "
                                                  "exactly, without resolving dependencies")
    e.add_argument("--from-imports", metavar="SCRIPT_OR_MODULE",
                   help="the installed packages this script, module or package imports, at the versions "
                        "installed here")
    e.add_argument("--current", action="store_true",
                   help="copy the packages from this environment instead of downloading wheels (offline; only "
                        "when this machine's Python and platform are the function's)")


def source_from(args) -> Source:
    chosen = [(kind, value) for kind, value in (("requirements", args.requirements), ("lock", args.lock),
                                                 ("imports", args.from_imports)) if value]
    if len(chosen) != 1:
        raise ConfigError("`fnmap deploy aws env` needs one of --requirements FILE, --lock FILE or "
                          f"--from-imports SCRIPT_OR_MODULE (got {len(chosen)}); add --current to copy the "
                          "packages installed here instead of downloading them")
    return Source(chosen[0][0], chosen[0][1], current=args.current)


def run_env(args, out=print) -> dict:
    """``fnmap deploy aws env``: build (or find) the environment's layer and attach it to the function."""
    import boto3

    source = source_from(args)
    lam = boto3.session.Session(region_name=args.region).client("lambda")
    try:
        config = lam.get_function_configuration(FunctionName=args.name)
    except lam.exceptions.ResourceNotFoundException:
        raise ConfigError(f"there is no Lambda function {args.name!r} in {lam.meta.region_name}: run `fnmap deploy "
                          "aws deploy` first, or pass the function's --name") from None
    runtime = config.get("Runtime") or f"python{sys.version_info.major}.{sys.version_info.minor}"
    architecture = args.architecture or (config.get("Architectures") or ["x86_64"])[0]
    arn = layer_for(lam, args.name, source, runtime, architecture, out)
    attached = attach(lam, args.name, arn, [layer["Arn"] for layer in config.get("Layers") or []], out)
    return {"layer": arn, "attached": attached}

