"""``fnmap deploy aws env``: a function's packages as a Lambda layer, on the emulator's offline AWS path.

Everything runs as a user would: ``fnmap emulator --aws --detach`` (moto's S3, the emulator's
Lambda API, awslambdaric environments), then the commands and scripts in a shell.  The package
is a wheel the test writes itself, installed by pip from a local folder (no network).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
import zipfile
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

import fnmap
from fnmap.deploy.aws import explain_failure
from fnmap.deploy.aws_env import Source, imported_distributions

pytest.importorskip("awslambdaric", reason="the emulator's Lambda environments run AWS's awslambdaric")
pytest.importorskip("moto.server", reason="fnmap emulator --aws serves S3 with moto")
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_PAGE = ROOT / "docs" / "deploy.md"


def make_wheel(folder: Path, name: str, version: str = "0.1") -> Path:
    """A pure-Python wheel of package ``name`` (``twice(x)``), written by hand: a wheel is a zip."""
    files = {f"{name}/__init__.py": "def twice(x):\n    return 2 * x\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n"}
    record = "".join(f"{path},sha256={_digest(text)},{len(text.encode())}\n" for path, text in files.items())
    files[f"{name}-{version}.dist-info/RECORD"] = record + f"{name}-{version}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return path


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("FNMAP_", "AWS_"))}


def stop_pid(pid: int) -> None:
    """Stop a detached emulator (not our child: it was started by ``--detach``) and wait for it to go."""
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(300):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """``fnmap emulator --aws --env-file F --port 0 --detach``; yields the environment of a shell that
    sourced F, and a folder to work in; the emulator is stopped after."""
    work = tmp_path_factory.mktemp("offline")
    env_file = work / "offline.env"
    done = subprocess.run([sys.executable, "-m", "fnmap", "emulator", "--aws", "--workers", "2", "--port", "0",
                           "--env-file", str(env_file), "--detach"], capture_output=True, text=True,
                          env=clean_env(), cwd=work, timeout=180)
    settings = dict(re.findall(r"^export (\w+)=(.*)$", env_file.read_text(), re.M)) if env_file.exists() else {}
    try:
        assert done.returncode == 0, done.stderr
        yield {**clean_env(), **settings}, work
    finally:
        if "OFFLINE_EMULATOR_PID" in settings:
            stop_pid(int(settings["OFFLINE_EMULATOR_PID"]))


def run(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=240)


def fnmap_cli(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "fnmap", *args], env, cwd)


_JOB = textwrap.dedent("""
    import json, sys
    import fnmap

    def f(x):
        import {package}
        return {package}.twice(x)

    try:
        print(json.dumps({{"results": fnmap.map(f, [1, 2])}}))
    except ModuleNotFoundError as e:
        print(json.dumps({{"type": type(e).__name__, "name": e.name, "notes": getattr(e, "__notes__", [])}}))
""")


def _lambda(env: dict):
    return boto3.client("lambda", endpoint_url=env["AWS_ENDPOINT_URL_LAMBDA"], region_name="us-east-1",
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])


def _package(work: Path) -> tuple[str, Path]:
    """A new package's name and a requirements file that installs its wheel from a local folder."""
    package = f"tiny{uuid.uuid4().hex[:8]}"
    wheels = make_wheel(work / "wheels", package).parent
    requirements = work / f"{package}.txt"
    requirements.write_text(f"--no-index\n--find-links {wheels}\n{package}==0.1\n")
    return package, requirements


def test_a_layer_from_requirements_makes_the_package_importable_and_is_published_once(offline):
    env, work = offline
    package, requirements = _package(work)
    name = f"fn-{package}"
    env = {**env, "FNMAP_FUNCTION_NAME": name}
    job = work / f"{package}_job.py"
    job.write_text(_JOB.format(package=package))

    before = json.loads(run([sys.executable, str(job)], env, work).stdout.strip().splitlines()[-1])
    assert before["type"] == "ModuleNotFoundError" and before["name"] == package, before
    notes = "\n".join(before["notes"])
    assert f"{package} is not installed where the calls run (Lambda function '{name}')" in notes, notes
    assert f"fnmap deploy aws env --name {name} --requirements" in notes, notes

    built = fnmap_cli("deploy", "aws", "env", "--name", name, "--requirements", str(requirements), env=env, cwd=work)
    assert built.returncode == 0, built.stderr
    assert "published" in built.stdout and f"function {name} now uses" in built.stdout, built.stdout
    after = json.loads(run([sys.executable, str(job)], env, work).stdout.strip().splitlines()[-1])
    assert after == {"results": [2, 4]}, after

    lam = _lambda(env)
    layer = f"{name}-deps"
    assert len(lam.list_layer_versions(LayerName=layer)["LayerVersions"]) == 1
    again = fnmap_cli("deploy", "aws", "env", "--name", name, "--requirements", str(requirements), env=env, cwd=work)
    assert again.returncode == 0, again.stderr
    assert "environment unchanged" in again.stdout and "nothing changed" in again.stdout, again.stdout
    versions = lam.list_layer_versions(LayerName=layer)["LayerVersions"]
    assert len(versions) == 1, "an unchanged environment published a layer version"
    config = lam.get_function_configuration(FunctionName=name)
    assert [x["Arn"] for x in config["Layers"]] == [versions[0]["LayerVersionArn"]]
    assert lam.get_layer_version(LayerName=layer, VersionNumber=1)["Description"].startswith("fnmap-env:")

    # A lock file is another input: a new version, attached in place of the first.
    lock = work / f"{package}.lock"
    lock.write_text(requirements.read_text())
    locked = fnmap_cli("deploy", "aws", "env", "--name", name, "--lock", str(lock), env=env, cwd=work)
    assert locked.returncode == 0, locked.stderr
    config = lam.get_function_configuration(FunctionName=name)
    assert [x["Arn"] for x in config["Layers"]] == [lam.get_layer_version(LayerName=layer, VersionNumber=2)[
        "LayerVersionArn"]]


def test_deploy_with_requirements_against_the_emulator(offline):
    """``fnmap deploy aws deploy --requirements`` in a shell that sourced the env file: IAM, STS, Logs and
    S3 at moto, Lambda at the emulator; the printed settings then run a map that imports the package."""
    env, work = offline
    package, requirements = _package(work)
    name = f"dep-{package}"
    deployed = fnmap_cli("deploy", "aws", "deploy", "--name", name, "--requirements", str(requirements),
                         "--concurrency", "0", env=env, cwd=work)
    assert deployed.returncode == 0, deployed.stderr
    assert "Check the credentials" not in deployed.stdout + deployed.stderr
    settings = dict(re.findall(r"export (FNMAP_\w+)=(\S+)", deployed.stdout))
    lam = _lambda(env)
    function = lam.get_function(FunctionName=name)
    assert function["Tags"]["fnmap:deployment"] == name
    assert [x["Arn"] for x in function["Configuration"]["Layers"]] == [
        lam.list_layer_versions(LayerName=f"{name}-deps")["LayerVersions"][0]["LayerVersionArn"]]
    job = work / f"{package}_job.py"
    job.write_text(_JOB.format(package=package))
    ran = run([sys.executable, str(job)], {**env, **settings}, work)
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"results": [2, 4]}, ran.stderr[-3000:]
    again = fnmap_cli("deploy", "aws", "deploy", "--name", name, "--requirements", str(requirements),
                      "--concurrency", "0", env=env, cwd=work)
    assert again.returncode == 0 and "environment unchanged" in again.stdout, again.stderr
    assert len(lam.list_layer_versions(LayerName=f"{name}-deps")["LayerVersions"]) == 1


def test_an_operation_the_emulator_does_not_serve_is_named_without_blaming_credentials(offline):
    env, _work = offline
    lam = _lambda(env)
    with pytest.raises(ClientError) as info:
        lam.list_aliases(FunctionName="fnmap")
    error = info.value.response["Error"]
    assert error["Code"] == "NotImplemented"
    assert "does not support the Lambda operation ListAliases" in error["Message"], error
    advice = explain_failure("deploy", "fnmap", info.value)
    assert "credentials" not in advice and "ListAliases" in advice
    denied = ClientError({"Error": {"Code": "UnrecognizedClientException", "Message": "bad token"}}, "GetFunction")
    assert "Check the credentials" in explain_failure("deploy", "fnmap", denied)


def test_a_deploy_with_neither_credentials_nor_a_region_names_both(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FNMAP_"))}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    neither = fnmap_cli("deploy", "aws", "deploy", env=env, cwd=tmp_path)
    assert neither.returncode != 0 and "Unable to locate credentials" in neither.stderr, neither.stderr
    assert "No AWS region is set either" in neither.stderr and "--region, or AWS_DEFAULT_REGION" in neither.stderr
    with_region = fnmap_cli("deploy", "aws", "deploy", "--region", "eu-west-1", env=env, cwd=tmp_path)
    assert with_region.returncode != 0 and "Check the credentials" in with_region.stderr, with_region.stderr
    assert "region" not in with_region.stderr.lower()


def test_a_lock_file_must_pin_every_package(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("requests==2.31.0 \\\n    --hash=sha256:abc\nnumpy>=1.24\n")
    with pytest.raises(fnmap.ConfigError, match=r"--lock .* not pinned to one version: numpy>=1.24; .*pip freeze"):
        Source("lock", str(lock))


def test_from_imports_finds_the_installed_distributions_a_script_imports(tmp_path):
    pytest.importorskip("numpy")
    script = tmp_path / "job.py"
    script.write_text("import os, json\nimport fnmap\nimport neighbour\n\ndef f(x):\n"
                      "    from numpy.linalg import norm\n    return norm(x)\n")
    assert imported_distributions(str(script)) == ["numpy"]  # not the stdlib, fnmap, or a local module


def test_the_docs_offline_block_runs_as_a_script(tmp_path):
    """The offline block of docs/deploy.md, pasted as it is into ``bash -e``: the emulator returns once the env
    file is written (0600), a numpy function runs on the aws path with the layer the command builds, and
    the emulator stops."""
    pytest.importorskip("numpy")
    text = DEPLOY_PAGE.read_text()
    section = text[text.index("## Rehearse the AWS path offline"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert "--detach" in block and "kill $OFFLINE_EMULATOR_PID" in block
    (tmp_path / "examples").mkdir()
    example = ROOT / "examples" / "lambda_numpy.py"
    (tmp_path / "examples" / "lambda_numpy.py").write_text(example.read_text())
    script = tmp_path / "rehearse.sh"
    script.write_text("set -e\n" + block)
    pid = None
    try:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=clean_env(), cwd=tmp_path,
                              timeout=280)
        env_file = tmp_path / ".fnmap" / "offline.env"
        pid = int(re.search(r"OFFLINE_EMULATOR_PID=(\d+)", env_file.read_text()).group(1))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        lines = done.stdout.strip().splitlines()
        assert "[1, 2, 3]" in lines, done.stdout
        assert lines[-1] == "[2.23606797749979, 3.7416573867739413, 5.477225575051661]", done.stdout
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    finally:
        found = re.search(r"OFFLINE_EMULATOR_PID=(\d+)", (tmp_path / ".fnmap" / "offline.env").read_text()) if (
            tmp_path / ".fnmap" / "offline.env").exists() else None
        if pid is None and found:
            pid = int(found.group(1))
        if pid is not None:
            stop_pid(pid)


def test_current_is_refused_when_this_machine_is_not_the_functions_platform(tmp_path):
    from fnmap.deploy.aws_env import copy_current

    with pytest.raises(fnmap.ConfigError, match=r"--current copies this environment's installed files, built for "
                                                r"python3\.\d+ .* the function runs python3\.0 .*leave out --current"):
        copy_current(["cloudpickle"], "python3.0", "x86_64", str(tmp_path / "layer.zip"))
    assert not (tmp_path / "layer.zip").exists()
