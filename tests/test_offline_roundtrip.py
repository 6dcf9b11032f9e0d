"""The offline AWS rehearsal of docs/deploy.md, as a user runs it: its files stay private, a restarted emulator
ignores the endpoints the shell still exports, and deploy/destroy over it round-trip.

Each test starts ``fnmap emulator --aws --env-file F --port 0 --detach`` (moto's S3, IAM, STS and Logs
in the emulator's process; the emulator's Lambda and Batch APIs), runs the commands in real
processes with the environment of a shell that sourced F, and stops the emulator after.
"""

from __future__ import annotations

import io
import json
import re
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import boto3
import pytest
from test_lambda_env import clean_env, stop_pid

pytestmark = pytest.mark.timeout(300)


def exported(env_file: Path) -> dict:
    return dict(re.findall(r"^export (\w+)=(.*)$", env_file.read_text(), re.M))


def stop(settings: dict) -> None:
    """Stop a detached emulator (started by ``--detach``, so not our child) and wait for it to go."""
    stop_pid(int(settings["OFFLINE_EMULATOR_PID"]))


def fnmap_cli(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnmap", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=240)


class Rehearsal:
    """Detached offline emulators started from one shell; each ``start`` sources the new env file."""

    def __init__(self, work: Path):
        self.work = work
        self.shell = clean_env()
        self.started: list[dict] = []

    def start(self, env_file: str = ".fnmap/offline.env") -> subprocess.CompletedProcess:
        done = fnmap_cli("emulator", "--aws", "--workers", "2", "--port", "0", "--env-file", env_file, "--detach",
                         env=self.shell, cwd=self.work)
        path = self.work / env_file
        settings = exported(path) if path.exists() else {}
        if settings:
            self.started.append(settings)
        assert done.returncode == 0, done.stdout + done.stderr
        self.shell = {**self.shell, **settings}  # source F
        return done

    def stop_all(self) -> None:
        for settings in self.started:
            stop(settings)

    def python(self, code: str) -> subprocess.CompletedProcess:
        script = self.work / "job.py"
        script.write_text(textwrap.dedent(code))
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=self.shell,
                              cwd=self.work, timeout=240)

    def client(self, service: str):
        endpoint = self.shell["AWS_ENDPOINT_URL_LAMBDA" if service == "lambda" else "AWS_ENDPOINT_URL"]
        return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                            aws_access_key_id=self.shell["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.shell["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture
def rehearsal(tmp_path):
    """A git work tree to rehearse in (as a user's project is), and the emulators started there."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    r = Rehearsal(tmp_path)
    try:
        yield r
    finally:
        r.stop_all()


_ABS = """
    import fnmap
    print(fnmap.map(abs, [-1, -2, 3]))
"""


def test_every_file_the_rehearsal_writes_is_private_and_out_of_git(rehearsal):
    work = rehearsal.work
    rehearsal.start()
    ran = rehearsal.python(_ABS)
    assert ran.returncode == 0 and ran.stdout.strip() == "[1, 2, 3]", ran.stderr
    secrets = [rehearsal.shell["FNMAP_SECRET"], rehearsal.shell["AWS_SECRET_ACCESS_KEY"]]

    folder = work / ".fnmap"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("offline.env", "offline.env.log"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    log = (folder / "offline.env.log").read_text()
    assert "listening on" in log and not any(s in log for s in secrets), log
    for path in work.rglob("*"):  # nothing else anywhere in the project holds a secret readable by others
        if path.is_file() and ".git" not in path.relative_to(work).parts:
            if any(s.encode() in path.read_bytes() for s in secrets):
                assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    untracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True,
                               text=True, cwd=work, check=True).stdout
    assert ".fnmap" not in untracked, untracked


def test_an_env_file_git_would_pick_up_is_warned_about_and_an_old_log_made_private(rehearsal):
    """The older command (``--env-file offline.env`` in the project folder), where an earlier emulator
    left a log readable by everyone: the new log is 0600 and the command says git would add them."""
    old_log = rehearsal.work / "offline.env.log"
    old_log.write_text("export FNMAP_SECRET=an-older-emulator-s\n")
    old_log.chmod(0o644)
    done = rehearsal.start("offline.env")
    assert stat.S_IMODE(old_log.stat().st_mode) == 0o600
    assert "an-older-emulator-s" not in old_log.read_text()
    assert "# warning: git does not ignore offline.env and offline.env.log, which hold the secret" in done.stdout, \
        done.stdout


def test_an_emulator_restarted_in_the_shell_of_a_stopped_one_points_its_lambda_environments_at_itself(rehearsal):
    rehearsal.start()
    first = rehearsal.started[0]
    stop(first)
    rehearsal.shell["FNMAP_S3_ENDPOINT_URL"] = first["AWS_ENDPOINT_URL_S3"]  # any stale endpoint setting
    rehearsal.shell["AWS_SESSION_TOKEN"] = "a-token-of-other-credentials"  # a stale session token
    rehearsal.start()
    second = rehearsal.started[1]
    assert second["AWS_ENDPOINT_URL_LAMBDA"] != first["AWS_ENDPOINT_URL_LAMBDA"]
    del rehearsal.shell["FNMAP_S3_ENDPOINT_URL"]  # the client's own settings are the user's to fix
    del rehearsal.shell["AWS_SESSION_TOKEN"]  # the emulator dropped it too: its keys have no token
    ran = rehearsal.python("""
        import json, os
        import fnmap

        names = ["AWS_ENDPOINT_URL_LAMBDA", "AWS_ENDPOINT_URL_BATCH", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
                 "FNMAP_S3_ENDPOINT_URL"]
        seen = fnmap.map(lambda _: {k: os.environ.get(k) for k in names}, [0])[0]
        token = fnmap.map(lambda _: os.environ.get("AWS_SESSION_TOKEN"), [0], backend="batch")[0]
        print(json.dumps({"seen": seen, "results": fnmap.map(abs, range(-30, 0), lambda_invocation="Event"),
                          "batch_token": token}))
    """)
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    emulator, s3 = second["AWS_ENDPOINT_URL_LAMBDA"], second["AWS_ENDPOINT_URL_S3"]
    assert answer["seen"] == {"AWS_ENDPOINT_URL_LAMBDA": emulator, "AWS_ENDPOINT_URL_BATCH": emulator,
                              "AWS_ENDPOINT_URL_S3": s3, "AWS_ENDPOINT_URL": s3, "FNMAP_S3_ENDPOINT_URL": s3}
    assert answer["results"] == list(range(30, 0, -1))
    assert answer["batch_token"] is None  # a Batch job runs with the emulator's environment, the stale token gone


def _layer_zip(module: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(f"python/{module}.py", "def twice(x):\n    return 2 * x\n")
    return buffer.getvalue()


_WITH_LAYER = """
    import fnmap

    def f(x):
        import {module}
        return {module}.twice(x)

    print(fnmap.map(f, [1, 2]))
"""


def test_deploy_over_the_rehearsal_keeps_its_secret_and_layers_and_destroy_removes_what_it_made(rehearsal):
    rehearsal.start()
    work, shell = rehearsal.work, rehearsal.shell
    lam, iam, s3 = (rehearsal.client(s) for s in ("lambda", "iam", "s3"))
    # What `fnmap deploy aws env` does in docs/deploy.md: a layer, attached to the function the clients call.
    module = "offline_probe"
    layer = lam.publish_layer_version(LayerName="fnmap-deps", Content={"ZipFile": _layer_zip(module)},
                                      CompatibleRuntimes=[f"python{sys.version_info.major}.{sys.version_info.minor}"])
    lam.update_function_configuration(FunctionName="fnmap", Layers=[layer["LayerVersionArn"]])
    job = _WITH_LAYER.format(module=module)
    before = rehearsal.python(job)
    assert before.returncode == 0 and before.stdout.strip() == "[2, 4]", before.stderr

    deployed = fnmap_cli("deploy", "aws", "deploy", env=shell, cwd=work)
    assert deployed.returncode == 0, deployed.stderr
    said = deployed.stdout
    assert "function fnmap: secret kept (the clients' FNMAP_SECRET still works)" in said, said
    assert f"function fnmap: layers kept: {layer['LayerVersionArn']}" in said, said
    assert f"export FNMAP_SECRET={shell['FNMAP_SECRET']}" in said, said
    assert "note: FNMAP_STORAGE here is s3://fnmap-offline/fnmap, not this deployment's" in said, said
    bucket = re.search(r"export FNMAP_STORAGE=s3://([^/]+)/", said).group(1)
    assert lam.get_function(FunctionName="fnmap")["Tags"] == {"fnmap:deployment": "fnmap"}
    after = rehearsal.python(job)  # the env file of the rehearsal still works
    assert after.returncode == 0 and after.stdout.strip() == "[2, 4]", after.stderr

    destroyed = fnmap_cli("deploy", "aws", "destroy", env=shell, cwd=work)
    assert destroyed.returncode == 0, destroyed.stderr
    removed = [line for line in destroyed.stdout.splitlines() if line.startswith("removed ")]
    assert removed == ["removed function fnmap", f"removed layer fnmap-deps:{layer['Version']}",
                       "removed log group /aws/lambda/fnmap", "removed IAM role fnmap-lambda",
                       f"removed bucket s3://{bucket} (and its objects)"], destroyed.stdout
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_function(FunctionName="fnmap")
    assert [r["RoleName"] for r in iam.list_roles()["Roles"]] == []
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["fnmap-offline"]
    again = rehearsal.python(_ABS)  # the emulator's own function again, with the rehearsal's secret
    assert again.returncode == 0 and again.stdout.strip() == "[1, 2, 3]", again.stderr


def test_batch_deploy_offline_makes_nothing_and_says_the_emulator_needs_no_deploy(rehearsal):
    rehearsal.start()
    done = fnmap_cli("deploy", "batch", "deploy", "--image", "fnmap-gpu:latest", env=rehearsal.shell,
                     cwd=rehearsal.work)
    assert done.returncode == 1, done.stdout + done.stderr
    error = done.stderr.strip()
    assert error.startswith("fnmap deploy: error: fnmap deploy batch deploy: the Batch endpoint "
                            f"{rehearsal.shell['AWS_ENDPOINT_URL_BATCH']} serves no compute environments"), error
    assert "built-in job definition fnmap" in error and "FNMAP_BACKEND=batch" in error, error
    assert len(error.splitlines()) == 1 and done.stdout == "", done.stdout
    destroy = fnmap_cli("deploy", "batch", "destroy", env=rehearsal.shell, cwd=rehearsal.work)
    assert destroy.returncode == 1 and destroy.stdout == "", destroy.stdout + destroy.stderr
    assert destroy.stderr.strip().startswith("fnmap deploy: error: fnmap deploy batch destroy: the Batch endpoint "
                                             f"{rehearsal.shell['AWS_ENDPOINT_URL_BATCH']} serves no compute"), \
        destroy.stderr
    assert rehearsal.client("iam").list_roles()["Roles"] == []
    assert [b["Name"] for b in rehearsal.client("s3").list_buckets()["Buckets"]] == ["fnmap-offline"]
