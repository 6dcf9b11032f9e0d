"""What the emulator's Lambda modules share: the account, Lambda's error shapes, function names
and the function configuration they report.

A leaf of the Lambda emulator (:mod:`.lambda_api`, :mod:`.lambda_manage`, :mod:`.lambda_runtime`
and :mod:`.lambda_layers` import it; it imports none of them), so that none of those import each
other in a circle.
"""

from __future__ import annotations

import json
import re

from ..deploy.package import host_architecture

ACCOUNT = "000000000000"
REGION = "us-east-1"
#: The handler every function runs (what ``fnmap deploy aws`` configures).
HANDLER = "handlers.aws_lambda.handler"
#: What GetFunctionConfiguration reports as the function's timeout (Lambda's maximum).
TIMEOUT_SECONDS = 900
#: The date prefix of Lambda's REST paths (2015-03-31, 2017-10-31, ...).
API_VERSION = re.compile(r"20\d\d-\d\d-\d\d")


def lambda_error(error_type: str, message: str) -> bytes:
    """Lambda's error payload (what an Invoke with ``X-Amz-Function-Error: Unhandled`` carries)."""
    return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


def function_name(name: str) -> str:
    """``my-fn``, ``arn:aws:lambda:...:function:my-fn[:qualifier]`` or ``123:function:my-fn`` -> ``my-fn``."""
    if ":function:" in name:
        name = name.split(":function:", 1)[1]
    return name.split(":", 1)[0]


def error(status: int, code: str, message: str, **extra):
    """A Lambda API error answer: JSON with ``x-amzn-ErrorType``, as botocore parses them."""
    from flask import Response

    body = json.dumps({"Type": "User", "message": message, **extra})
    return Response(body, status=status, mimetype="application/json", headers={"x-amzn-ErrorType": code})


def configuration(api, name: str) -> dict:
    """GetFunctionConfiguration's answer; the pool serves every name alike."""
    from ..runtime.serialization import runtime_info

    info = runtime_info()
    variables = {"FNMAP_RUNTIME": json.dumps(info)}
    timeout, memory, layers = TIMEOUT_SECONDS, 1024, []
    runtime = api.runtime
    extra = {}
    if runtime is not None:
        function = runtime.function(name)
        timeout, memory, layers = function.timeout, function.memory, [arn for arn, _ in function.layers]
        variables.update(function.variables)
        extra = {k: v for k, v in runtime.created.get(name, {}).items() if k != "Tags"}
    return {
        "FunctionName": name,
        "FunctionArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}",
        "Runtime": f"python{info['python']}",
        "Handler": HANDLER,
        "Timeout": timeout,
        "MemorySize": memory,
        "PackageType": "Zip",
        "State": "Active",
        "LastUpdateStatus": "Successful",
        "Environment": {"Variables": variables},
        "Layers": [{"Arn": arn} for arn in layers],
        "Architectures": [host_architecture()],
        **extra,
    }
