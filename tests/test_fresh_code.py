"""Fresh code within one client process: an editable package edited (and reloaded) between two maps
is what the second map's calls run, though the client's workers imported it once already.

The package is installed in editable mode for real (``setup.py develop`` into a virtual environment:
an ``.egg-link``, a ``.pth`` naming the source folder and the ``.egg-info`` beside it), so it is
pickled by name and each worker imports it, as a user's ``pip install -e .`` package is."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX virtual environment")

#: The tree whose fnmap the scripts and the kernel use.
FNMAP_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VERSION_1 = 'def version(x):\n    return "s1"\n'


def editable_package(tmp_path) -> tuple[str, pathlib.Path]:
    """A virtual environment with ``edpkg`` installed in editable mode from ``tmp_path/src``: its python
    and the package's ``__init__.py``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    source = tmp_path / "src"
    (source / "edpkg").mkdir(parents=True)
    module = source / "edpkg" / "__init__.py"
    module.write_text(VERSION_1)
    (source / "setup.py").write_text('from setuptools import setup\nsetup(name="edpkg", version="0.1", '
                                     'packages=["edpkg"])\n')
    done = subprocess.run([python, "setup.py", "-q", "develop"], cwd=source, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        pytest.skip(f"setuptools cannot install in editable mode here: {done.stderr[-500:]}")
    return python, module


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env.update(PYTHONPATH=FNMAP_ROOT, FNMAP_STORAGE=os.environ["FNMAP_STORAGE"], FNMAP_PROGRESS="false", **extra)
    return env


SCRIPT = """
import importlib, pathlib, sys
import fnmap, edpkg

backend = sys.argv[1]

def use(x):  # a function of the script's: it refers to the package by name
    return edpkg.version(x)

print("before", fnmap.map(use, range(4), chunksize=1, backend=backend), flush=True)
print("by name", fnmap.map(edpkg.version, range(2), chunksize=1, backend=backend), flush=True)
module = pathlib.Path(edpkg.__file__)
module.write_text('def version(x):\\n    return "s2"\\n')
importlib.reload(edpkg)
print("reloaded", edpkg.version(0), fnmap.map(use, range(4), chunksize=1, backend=backend), flush=True)
print("by name", fnmap.map(edpkg.version, range(2), chunksize=1, backend=backend), flush=True)
"""


@pytest.mark.parametrize("backend, idle", [("emulator", "0"), ("emulator", "120"), ("local", "0")])
def test_an_edited_and_reloaded_editable_package_is_what_the_next_map_runs(tmp_path, backend, idle):
    """The workers of the emulator (one of this process's own, or the one shared by the user's
    processes) imported ``edpkg`` during the first map; the second map's calls run the edited file.
    On the local backend the calls run in the client: its reloaded module, not a function cached
    from the first map."""
    python, _module = editable_package(tmp_path)
    script = tmp_path / "main.py"
    script.write_text(SCRIPT)
    done = subprocess.run([python, str(script), backend], cwd=tmp_path, env=_env(FNMAP_EMULATOR_IDLE=idle),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "before ['s1', 's1', 's1', 's1']",
        "by name ['s1', 's1']",
        "reloaded s2 ['s2', 's2', 's2', 's2']",
        "by name ['s2', 's2']",
    ], done.stderr


UNRELOADED = """
import pathlib
import fnmap, edpkg

print("before", fnmap.map(edpkg.version, range(3), chunksize=1), flush=True)
pathlib.Path(edpkg.__file__).write_text('def version(x):\\n    return "s3"\\n')
print("edited", edpkg.version(0), fnmap.map(edpkg.version, range(3), chunksize=1), flush=True)
"""


def test_a_module_file_changed_without_a_reload_is_imported_afresh_by_the_workers(tmp_path):
    """Any change of the file counts: the workers import it as a new worker would (the client, which
    did not reload it, still has the old code)."""
    python, _module = editable_package(tmp_path)
    script = tmp_path / "main.py"
    script.write_text(UNRELOADED)
    done = subprocess.run([python, str(script)], cwd=tmp_path, env=_env(FNMAP_EMULATOR_IDLE="0"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before ['s1', 's1', 's1']", "edited s1 ['s3', 's3', 's3']"], done.stderr


def test_autoreload_in_a_real_kernel_reaches_the_workers(tmp_path, monkeypatch):
    """``%autoreload 2`` in a Jupyter kernel: an edit of the editable package, then the same cell."""
    if importlib.util.find_spec("ipykernel") is None:
        pytest.skip("ipykernel is not installed")
    from jupyter_client import KernelManager

    python, module = editable_package(tmp_path)
    spec = tmp_path / "jupyter" / "kernels" / "edvenv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "edvenv", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    km = KernelManager(kernel_name="edvenv")
    km.start_kernel(env=_env(FNMAP_EMULATOR_IDLE="0"), cwd=str(tmp_path))
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)

        def run(code: str) -> str:
            out: list[str] = []
            reply = kc.execute_interactive(textwrap.dedent(code), timeout=180, output_hook=lambda m: out.append(
                m["content"].get("text", "") if m["msg_type"] == "stream" else ""))
            assert reply["content"]["status"] == "ok", reply["content"]
            return "".join(out)

        run("%load_ext autoreload\n%autoreload 2")
        cell = ("import fnmap, edpkg\ndef use(x):\n    return edpkg.version(x)\n"
                "print(edpkg.version(0), fnmap.map(use, range(3), chunksize=1))")
        assert run(cell).strip() == "s1 ['s1', 's1', 's1']"
        module.write_text('def version(x):\n    return "s2"\n')
        assert run(cell).strip() == "s2 ['s2', 's2', 's2']"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


MID_JOB = """
import pathlib, time
import fnmap, edpkg

path = pathlib.Path(edpkg.__file__)

def use(x):
    if x == 0:  # an edit while the job runs, on a worker kept busy with it
        path.write_text('def version(x):\\n    return "s2"\\n')
    time.sleep(0.3)
    return edpkg.version(x)

print("during", fnmap.map(use, range(6), chunksize=1, workers=1), flush=True)
print("next", fnmap.map(use, range(2), chunksize=1, workers=1), flush=True)
"""


def test_the_calls_of_one_job_run_one_version_of_a_module(tmp_path):
    """A worker looks at the files between jobs (or after a second with no call), not between the
    calls of a job it is kept busy with: an edit in the middle of a map is for the next map."""
    python, _module = editable_package(tmp_path)
    script = tmp_path / "main.py"
    script.write_text(MID_JOB)
    done = subprocess.run([python, str(script)], cwd=tmp_path, env=_env(FNMAP_EMULATOR_IDLE="0"),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["during ['s1', 's1', 's1', 's1', 's1', 's1']", "next ['s2', 's2']"], done.stderr
