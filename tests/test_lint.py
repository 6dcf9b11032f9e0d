"""Lint is part of the suite: ``ruff check`` with the settings in pyproject.toml stays clean."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff")
    cmd = [ruff, "check", "."] if ruff else [sys.executable, "-m", "ruff", "check", "."]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
