"""The installed distributions' top-level names are scanned once, then remembered between fresh
processes until something on sys.path changes (fnmap/runtime/installed.py): the scan cost every
fresh process whose function uses a local module 0.3 - 0.6 s on its first map."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import importlib.metadata, json
scans = []
real = importlib.metadata.packages_distributions
def counted():
    scans.append(1)
    return real()
importlib.metadata.packages_distributions = counted
from fnmap.runtime.installed import installed_top_level
names = installed_top_level()
print(json.dumps({"scans": len(scans), "pytest": "pytest" in names, "fnmap": "fnmap" in names}))
"""


def _run(env) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_scan_is_made_once_and_again_when_sys_path_changes(tmp_path):
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(on_path), os.environ.get("PYTHONPATH")) if p))
    first = _run(env)
    assert first == {"scans": 1, "pytest": True, "fnmap": True}
    assert list((tmp_path / "cache" / "fnmap" / "installed").glob("*.json"))
    assert _run(env) == {"scans": 0, "pytest": True, "fnmap": True}  # remembered
    (on_path / "newly_installed-1.0.dist-info").mkdir()  # an install changes a folder on sys.path
    assert _run(env)["scans"] == 1
    assert _run(env)["scans"] == 0


def test_files_written_beside_the_script_keep_the_cache(tmp_path):
    """The script's folder (sys.path[0]) and a project folder holding its *.egg-info change whenever
    a file is written there: that is no install, and must not cost the next run a scan."""
    project = tmp_path / "project"
    (project / "myproj.egg-info").mkdir(parents=True)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(project), os.environ.get("PYTHONPATH")) if p))
    assert _run(env)["scans"] == 1
    (project / "results.json").write_text("{}")  # the folder's mtime changes
    os.utime(project, ns=(1, 1))
    assert _run(env)["scans"] == 0
    info = project / "myproj.egg-info"
    (info / "top_level.txt").write_text("myproj\nanother\n")  # a re-install rewrites its metadata
    os.utime(info, ns=(2, 2))
    assert _run(env)["scans"] == 1


def test_an_unreadable_cache_is_scanned_again(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    _run(env)
    for path in (tmp_path / "cache" / "fnmap" / "installed").glob("*.json"):
        path.write_text("{not json")
    assert _run(env) == {"scans": 1, "pytest": True, "fnmap": True}
