"""A read-only or full storage folder: one clear error naming the storage, the setting and the fix,
and no retries (a full disk does not empty itself between attempts).

Each case runs a script inside a user and mount namespace (``unshare -rm``) where the storage
folder is a small tmpfs, read-only or nearly full: no root needed, nothing left mounted after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys, fnmap
def big(x):
    import os
    return os.urandom(400_000)  # does not compress
try:
    fnmap.map({func}, range(3), retries=2, return_job=False)
except fnmap.StorageError as e:
    print("STORAGE-ERROR", e)
    sys.exit(3)
except Exception as e:
    print("OTHER", type(e).__name__, e)
    sys.exit(4)
print("NO-ERROR")
"""


def run_on_tmpfs(tmp_path, mount_options: str, func: str, prepare: str = "") -> subprocess.CompletedProcess:
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("user namespaces are not available here (unshare -rm)")
    store = tmp_path / "store"
    store.mkdir()
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(func=func))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FNMAP_")}
    env["FNMAP_STORAGE"] = store.as_uri()
    shell = (f"{prepare}mount -t tmpfs -o {mount_options} tmpfs {store} && "
             f"exec {sys.executable} {script}")
    return subprocess.run(["unshare", "-rm", "sh", "-c", shell], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_a_read_only_storage_folder_names_the_setting_and_the_fix(tmp_path):
    done = run_on_tmpfs(tmp_path, "ro", "abs")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "STORAGE-ERROR cannot store the function in file://" in done.stdout
    assert "FNMAP_STORAGE=" in done.stdout and "(from the environment)" in done.stdout
    assert "Read-only file system" in done.stdout and "point storage= / FNMAP_STORAGE at a writable" in done.stdout


def test_a_full_storage_fails_the_call_once_with_the_fix(tmp_path):
    done = run_on_tmpfs(tmp_path, "size=600k", "big")  # room for the function, not for three results
    assert done.returncode == 3, done.stdout + done.stderr
    assert "No space left on device" in done.stdout
    assert "the storage is full" in done.stdout and "fnmap gc" in done.stdout
    assert "failed after 1 attempt(s)" in done.stdout  # not retried


def test_a_worker_that_cannot_reach_storage_fails_the_job_at_once_with_the_fix(s3_env):
    """The offline rehearsal's classic slip: the emulator was started without the S3 endpoint."""
    from conftest import EmulatorProcess

    import fnmap

    bucket = s3_env("unreachable")
    emulator = EmulatorProcess(env={"FNMAP_S3_ENDPOINT_URL": "http://127.0.0.1:9"})  # nothing listens there
    try:
        with pytest.raises(fnmap.StorageError) as info:
            fnmap.map(abs, [-1, -2], storage=f"s3://{bucket}/p", emulator_url=emulator.url,
                      secret=emulator.secret, retries=2)
    finally:
        emulator.stop()
    message = str(info.value)
    assert f"the worker cannot reach storage s3://{bucket}/p" in message
    assert "AWS_ENDPOINT_URL_S3" in message and "failed after 1 attempt(s)" in message
