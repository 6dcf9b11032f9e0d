"""The emulator's Lambda execution environments: AWS's runtime interface client (awslambdaric) over a package.

Most tests deploy a small probe package (its own ``handlers/aws_lambda.py``) with
boto3's CreateFunction, so what Lambda's Runtime API hands the real client (the
event, the context, errors, timeouts) can be seen directly.  One emulator serves
the module; the aws backend's own path is in ``test_backend_aws.py``.
"""

from __future__ import annotations

import base64
import io
import json
import os
import textwrap
import time
import zipfile

import boto3
import pytest
import requests
from conftest import aws_credentials_of

import fnmap

pytest.importorskip("awslambdaric", reason="the emulator's Lambda environments run AWS's awslambdaric")
pytestmark = pytest.mark.timeout(120)

_PROBE = textwrap.dedent("""
    import importlib, os, time

    CALLS = 0

    def handler(event, context):
        global CALLS
        CALLS += 1
        action = event.get("action")
        if action == "raise":
            raise ValueError(f"probe failure {event['n']}")
        if action == "sleep":
            if event.get("pid_file"):
                with open(event["pid_file"], "w") as f:
                    f.write(str(os.getpid()))
            time.sleep(event["seconds"])
        if action == "exit":
            os._exit(event["code"])
        if action == "big":
            return "x" * event["n"]
        if action == "import":
            module = importlib.import_module(event["module"])
            return {"file": module.__file__, "value": getattr(module, "VALUE", None)}
        cc = context.client_context
        return {
            "calls": CALLS, "pid": os.getpid(), "request_id": context.aws_request_id,
            "arn": context.invoked_function_arn, "remaining_ms": context.get_remaining_time_in_millis(),
            "client_context": cc.custom if cc else None, "trace": os.environ.get("_X_AMZN_TRACE_ID"),
            "function_name": context.function_name, "memory": context.memory_limit_in_mb,
            "cwd": os.getcwd(), "task_root": os.environ.get("LAMBDA_TASK_ROOT"),
        }
""")


def _zip(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buffer.getvalue()


@pytest.fixture
def emulator(_module_emulator):
    return _module_emulator  # conftest's, one per module; its Lambda API is signed for, not pointed at


@pytest.fixture
def lam(emulator, monkeypatch):
    for name, value in aws_credentials_of(emulator).items():
        monkeypatch.setenv(name, value)
    # Its own session: boto3's default one keeps the credentials it resolved first (another test's).
    client = boto3.session.Session().client("lambda", endpoint_url=emulator.url)
    yield client
    client.close()


def _create(lam, name: str, files: dict[str, str], **config) -> None:
    lam.create_function(FunctionName=name, Runtime="python3.11", Role="arn:aws:iam::000000000000:role/probe",
                        Handler="handlers.aws_lambda.handler", Code={"ZipFile": _zip(files)}, **config)


@pytest.fixture
def probe(lam, request):
    """A function running the probe package; returns ``invoke(event, **kwargs) -> (payload, function error)``."""
    name = f"probe-{request.node.name[:40]}".replace("[", "-").replace("]", "")
    _create(lam, name, {"handlers/__init__.py": "", "handlers/aws_lambda.py": _PROBE}, Timeout=30, MemorySize=512)

    def invoke(event: dict, **kwargs):
        resp = lam.invoke(FunctionName=name, Payload=json.dumps(event).encode(), **kwargs)
        return json.loads(resp["Payload"].read()), resp.get("FunctionError")

    invoke.name = name
    return invoke


def _stats(emulator) -> dict:
    return requests.get(emulator.url + "/lambda/stats", timeout=5).json()


def test_runtime_api_hands_the_client_its_event_and_context(probe):
    custom = {"job": "probe"}
    context = base64.b64encode(json.dumps({"custom": custom}).encode()).decode()
    answer, error = probe({}, ClientContext=context)
    assert error is None
    assert answer["client_context"] == custom
    assert answer["arn"] == f"arn:aws:lambda:us-east-1:000000000000:function:{probe.name}"
    assert answer["function_name"] == probe.name and answer["memory"] == "512"
    assert 0 < answer["remaining_ms"] <= 30_000  # Lambda-Runtime-Deadline-Ms: the function's 30 s timeout
    assert answer["trace"].startswith("Root=1-") and len(answer["request_id"]) == 36
    assert answer["cwd"] == answer["task_root"]  # the package folder, as /var/task


def test_an_environment_is_reused_warm(probe, emulator):
    before = _stats(emulator)
    first, _ = probe({})
    second, _ = probe({})
    after = _stats(emulator)
    assert second["pid"] == first["pid"] and (first["calls"], second["calls"]) == (1, 2)
    assert after["cold_starts"] - before["cold_starts"] == 1
    assert after["warm_starts"] - before["warm_starts"] == 1


def test_an_unhandled_exception_is_lambdas_error_payload(probe):
    answer, error = probe({"action": "raise", "n": 7})
    assert error == "Unhandled"
    assert answer["errorType"] == "ValueError" and answer["errorMessage"] == "probe failure 7"
    assert any("aws_lambda.py" in line for line in answer["stackTrace"])
    again, _ = probe({})
    assert again["calls"] == 2  # the runtime reported the error and took the next event: still warm


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_functions_timeout_ends_the_environment(probe, lam, emulator, tmp_path):
    lam.update_function_configuration(FunctionName=probe.name, Timeout=1)
    before = _stats(emulator)
    pid_file = tmp_path / "pid"
    answer, error = probe({"action": "sleep", "seconds": 600, "pid_file": str(pid_file)})
    assert error == "Unhandled"
    assert answer["errorType"] == "Sandbox.Timedout"
    assert answer["errorMessage"].endswith("Error: Task timed out after 1.00 seconds")
    assert _stats(emulator)["timeouts"] - before["timeouts"] == 1
    pid = int(pid_file.read_text())
    for _ in range(100):  # the emulator killed and reaped it; allow it a moment
        if _gone(pid):
            break
        time.sleep(0.1)
    assert _gone(pid), f"the timed-out environment (pid {pid}) is still running"
    fresh, _ = probe({})
    assert fresh["calls"] == 1  # the timed-out environment was stopped: a cold start


def test_a_runtime_that_exits_is_a_runtime_exit_error(probe):
    answer, error = probe({"action": "exit", "code": 7})
    assert error == "Unhandled" and answer["errorType"] == "Runtime.ExitError"
    assert answer["errorMessage"].endswith("Runtime exited with error: exit status 7")


def test_a_response_over_6_mib_is_function_response_size_too_large(probe):
    answer, error = probe({"action": "big", "n": 7 * 2**20})
    assert error == "Unhandled" and answer["errorType"] == "Function.ResponseSizeTooLarge"
    after, error = probe({})
    assert error is None and after["calls"] == 1  # awslambdaric exits on the Runtime API's 413: a new environment


def test_an_import_error_in_the_package_is_lambdas_init_error(lam, emulator):
    broken = "import nonexistent_dependency\n\ndef handler(event, context):\n    return 1\n"
    _create(lam, "broken-probe", {"handlers/__init__.py": "", "handlers/aws_lambda.py": broken})
    before = _stats(emulator)
    resp = lam.invoke(FunctionName="broken-probe", Payload=b"{}")
    answer = json.loads(resp["Payload"].read())
    assert resp["FunctionError"] == "Unhandled"
    assert answer["errorType"] == "Runtime.ImportModuleError"
    assert "Unable to import module 'handlers.aws_lambda': No module named 'nonexistent_dependency'" \
        in answer["errorMessage"]
    assert _stats(emulator)["init_errors"] - before["init_errors"] == 1


def test_the_environment_sees_the_package_and_its_layers_only(probe, lam):
    """Neither the emulator's site-packages nor the editable fnmap checkout is on the environment's path."""
    for module in ("fnmap", "pytest"):  # the probe package has no fnmap; pytest is installed here only
        answer, error = probe({"action": "import", "module": module})
        assert error == "Unhandled" and answer["errorType"] == "ModuleNotFoundError", (module, answer)
    answer, error = probe({"action": "import", "module": "boto3"})  # Lambda's runtime provides boto3
    assert error is None
    layer = lam.publish_layer_version(LayerName="probe-layer", Content={"ZipFile": _zip(
        {"python/layer_probe.py": "VALUE = 42\n"})})
    lam.update_function_configuration(FunctionName=probe.name, Layers=[layer["LayerVersionArn"]])
    answer, error = probe({"action": "import", "module": "layer_probe"})
    assert error is None and answer["value"] == 42


def test_reserved_concurrency_of_zero_answers_429(probe, lam):
    lam.put_function_concurrency(FunctionName=probe.name, ReservedConcurrentExecutions=0)
    try:
        with pytest.raises(lam.exceptions.TooManyRequestsException):
            probe({})
    finally:
        lam.delete_function_concurrency(FunctionName=probe.name)
    assert probe({})[1] is None


def test_bad_function_settings_are_refused_with_the_value(lam):
    refused = lam.exceptions.InvalidParameterValueException
    with pytest.raises(refused, match="Timeout=901 must be an integer from 1 to 900"):
        lam.update_function_configuration(FunctionName="fnmap", Timeout=901)
    with pytest.raises(refused, match="not a zip file"):
        lam.update_function_code(FunctionName="fnmap", ZipFile=b"not a zip")


def square(x):
    return x * x


def test_pool_mode_keeps_the_worker_pool(emulator_process, monkeypatch):
    emu = emulator_process("--lambda-runtime", "pool", workers=1)
    for name, value in {**aws_credentials_of(emu), "AWS_ENDPOINT_URL_LAMBDA": emu.url,
                        "FNMAP_SECRET": emu.secret}.items():
        monkeypatch.setenv(name, value)
    assert fnmap.map(square, range(3), backend="aws", lambda_invocation="RequestResponse") == [0, 1, 4]
    stats = _stats(emu)
    assert stats["lambda_runtime"] == "pool" and "cold_starts" not in stats
