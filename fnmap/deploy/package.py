"""The code the cloud runs: a reproducible zip of fnmap + handlers + cloudpickle, and dependency layers.

The zip carries the client's own cloudpickle, so pickles made by the client
load in the function; boto3 comes with Lambda's Python runtime.  The same
zip serves any host that runs ``handlers/`` from a folder.
"""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import zipfile

from ..errors import ConfigError, FnmapError

#: Lambda's limit on a function's unzipped code and layers together.
UNZIPPED_LIMIT = 250 * 1024 * 1024


def host_architecture() -> str:
    """Lambda's name for this machine's architecture (what a ``--current`` layer and the emulator's
    execution environments run on)."""
    return "arm64" if platform.machine().lower() in ("aarch64", "arm64") else "x86_64"


def build_zip(path: str) -> str:
    """Write the function's zip (fnmap, handlers, cloudpickle) to ``path``; reproducible byte for byte."""
    import cloudpickle

    fnmap_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # fnmap/, this file's grandparent
    roots = [fnmap_dir, _handlers_dir(), os.path.dirname(cloudpickle.__file__)]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for root in roots:
            base = os.path.dirname(root)
            for folder, dirs, files in sorted(os.walk(root)):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".typed")):
                        full = os.path.join(folder, name)
                        info = zipfile.ZipInfo(os.path.relpath(full, base), date_time=(2020, 1, 1, 0, 0, 0))
                        info.external_attr = 0o644 << 16
                        info.compress_type = zipfile.ZIP_DEFLATED
                        with open(full, "rb") as f:
                            zf.writestr(info, f.read())
    return path


def build_folder(dest: str) -> str:
    """Unpack the function's zip (:func:`build_zip`, the bytes ``fnmap deploy aws`` uploads) into ``dest``,
    as Lambda unpacks it into ``/var/task``; returns ``dest``."""
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(build_zip(os.path.join(tmp, "function.zip"))) as zf:
            zf.extractall(dest)
    return dest


def _handlers_dir() -> str:
    import handlers

    return os.path.dirname(os.path.abspath(handlers.__file__))


def unzipped_size(path: str) -> int:
    with zipfile.ZipFile(path) as zf:
        return sum(i.file_size for i in zf.infolist())


def build_layer(requirements: str, runtime: str, architecture: str, path: str, no_deps: bool = False) -> str:
    """pip-install ``requirements`` for Lambda's platform (manylinux wheels of ``runtime``'s Python and
    ``architecture``) into a layer zip (``python/`` inside); ``no_deps`` for a fully pinned lock file."""
    if not os.path.isfile(requirements):
        raise ConfigError(f"--requirements {requirements!r} is not a file; pass a requirements.txt")
    platform = "manylinux2014_aarch64" if architecture == "arm64" else "manylinux2014_x86_64"
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "python")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", requirements,
               "--target", target, "--platform", platform, "--implementation", "cp",
               "--python-version", runtime[len("python"):], "--only-binary=:all:"] + (["--no-deps"] if no_deps else [])
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise FnmapError(f"building the dependency layer failed ({' '.join(cmd)}):\n{result.stderr[-2000:]}")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for folder, dirs, files in os.walk(target):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__" and (folder, d) != (target, "bin"))
                for name in sorted(files):
                    full = os.path.join(folder, name)
                    zf.write(full, os.path.relpath(full, tmp))
    return path


def code_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def stage_gcf_source(dest: str, requirements: str | None = None) -> str:
    """Write a Google Cloud Functions source folder: ``main.py`` (``handlers/gcf.py``), the zip's
    packages, and ``requirements.txt`` (functions-framework, boto3, and ``requirements`` if given).

    Returns ``dest``; deploy it with ``gcloud functions deploy ... --source=DEST --entry-point=invoke``.
    """
    import shutil
    from importlib.metadata import PackageNotFoundError, version

    if os.path.exists(dest) and os.listdir(dest):
        raise ConfigError(f"{dest!r} is not empty; pass a new or empty folder to stage the source in")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(build_zip(os.path.join(tmp, "src.zip"))) as zf:
            zf.extractall(dest)
    shutil.copyfile(os.path.join(_handlers_dir(), "gcf.py"), os.path.join(dest, "main.py"))
    try:
        framework = f"functions-framework=={version('functions-framework')}"
    except PackageNotFoundError:
        framework = "functions-framework"
    lines = [framework, "boto3"]
    if requirements:
        if not os.path.isfile(requirements):
            raise ConfigError(f"requirements {requirements!r} is not a file; pass a requirements.txt")
        with open(requirements) as f:
            lines.extend(line.strip() for line in f if line.strip() and not line.startswith("#"))
    with open(os.path.join(dest, "requirements.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return dest
