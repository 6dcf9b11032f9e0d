"""AWS Lambda's API on the emulator, so the ``aws`` backend runs unchanged through boto3.

Point boto3 here with ``AWS_ENDPOINT_URL_LAMBDA=<emulator URL>`` (and storage at
any S3 server with ``AWS_ENDPOINT_URL_S3``).  Routes, with botocore's paths:

* ``POST /2015-03-31/functions/<name>/invocations`` (Invoke), by
  ``X-Amz-Invocation-Type``: ``RequestResponse`` answers 200 with the handler's
  result, or with ``X-Amz-Function-Error: Unhandled`` and Lambda's error payload
  when the worker process died (``Runtime.ExitError``) or ran past its timeout
  (``Sandbox.Timedout``); ``Event`` answers 202 at once and queues the call
  (a result reaches storage only); ``DryRun`` answers 204.  Lambda's payload limits
  hold: 413 ``RequestTooLargeException`` for a request over 6 MiB (1 MiB for
  ``Event``), ``Function.ResponseSizeTooLarge`` for a response over 6 MiB.
* ``GET /2015-03-31/functions/<name>/configuration`` (GetFunctionConfiguration).
* ``PUT``/``DELETE /2017-10-31/...`` and ``GET /2019-09-30/functions/<name>/concurrency``
  (reserved concurrency): a synchronous invocation beyond it answers 429
  ``TooManyRequestsException`` as Lambda does; queued events wait for a slot.
* Any other Lambda API path: 501 ``NotImplemented``, naming what is served.
* ``GET /lambda/stats``: invocations by type, throttles, events queued (emulator only).

Every function name is served by the emulator's one pool of workers.  The event
is decoded exactly as ``handlers/aws_lambda.py`` decodes it
(:mod:`fnmap.lambda_event`), and nothing is unpickled in the emulator itself.
"""

from __future__ import annotations

import collections
import json
import queue
import re
import threading
import time

from flask import Response, jsonify, request

from ..lambda_event import decode_event, encode_result
from ..serialization import runtime_info
from ..wire import ERROR_KIND_HEADER

ACCOUNT = "000000000000"
#: The date prefix of Lambda's REST paths (2015-03-31, 2017-10-31, ...).
_API_VERSION = re.compile(r"20\d\d-\d\d-\d\d")
REGION = "us-east-1"
#: What GetFunctionConfiguration reports as the function's timeout (Lambda's maximum).
TIMEOUT_SECONDS = 900
#: Lambda's payload limits, enforced as Lambda does: requests (synchronous, asynchronous) answer
#: 413 beyond them; a synchronous response beyond its limit becomes a function error.
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
ASYNC_PAYLOAD_LIMIT = 1024 * 1024


class LambdaApi:
    """Reserved concurrency, the event queue and counters, shared by the routes."""

    def __init__(self, emulator):
        self.emulator = emulator
        self.reserved: dict[str, int] = {}
        self.running: collections.Counter = collections.Counter()
        self.stats: collections.Counter = collections.Counter()
        self._cond = threading.Condition()
        self._events: queue.Queue = queue.Queue()
        self._runners: list[threading.Thread] = []

    def _acquire(self, name: str, wait: bool) -> bool:
        with self._cond:
            while name in self.reserved and self.running[name] >= self.reserved[name]:
                if not wait:
                    return False
                self._cond.wait(0.5)
            self.running[name] += 1
            return True

    def _release(self, name: str) -> None:
        with self._cond:
            self.running[name] -= 1
            self._cond.notify_all()

    def run(self, name: str, payload: bytes) -> tuple[dict | None, dict]:
        """Run one event through the pool; return ``(result, function error or {})``."""
        try:
            event = json.loads(payload)
            body, signature = decode_event(event)
        except ValueError as e:
            return encode_result(400, f"malformed fnmap event: {e}".encode()), {}
        except Exception as e:  # the request stored by reference could not be read
            return encode_result(503, f"cannot read the stored request: {e!r}".encode()), {}
        if "key" in event:
            self.stats["by_reference"] += 1
        status, out, headers = self.emulator.execute(body, signature)
        kind = headers.get(ERROR_KIND_HEADER)
        if kind == "crashed":
            return None, {"errorType": "Runtime.ExitError",
                          "errorMessage": f"Runtime exited with error: {out.decode(errors='replace')}"}
        if kind == "timeout":
            return None, {"errorType": "Sandbox.Timedout",
                          "errorMessage": f"Task timed out: {out.decode(errors='replace')}"}
        return encode_result(status, out), {}

    def enqueue(self, name: str, payload: bytes) -> None:
        with self._cond:
            if len(self._runners) < self.emulator.pool.size:  # Lambda's async queue, drained by daemons
                runner = threading.Thread(target=self._drain, name="fnmap-lambda-event", daemon=True)
                self._runners.append(runner)
                runner.start()
        self._events.put((name, payload))

    def _drain(self) -> None:
        while True:
            name, payload = self._events.get()
            self._acquire(name, wait=True)
            try:
                # Lambda retries a throttled event itself (the emulator's --max-concurrency answers 429).
                while (self.run(name, payload)[0] or {}).get("status") == 429:
                    self.stats["events_throttled"] += 1
                    time.sleep(0.2)
            except Exception:  # an event has nobody to answer; the client declares it lost
                self.stats["event_errors"] += 1
            finally:
                self._release(name)
                self.stats["events_done"] += 1


def _function_name(name: str) -> str:
    """``my-fn``, ``arn:aws:lambda:...:function:my-fn[:qualifier]`` or ``123:function:my-fn`` -> ``my-fn``."""
    if ":function:" in name:
        name = name.split(":function:", 1)[1]
    return name.split(":", 1)[0]


def _error(status: int, code: str, message: str, **extra) -> Response:
    body = json.dumps({"Type": "User", "message": message, **extra})
    return Response(body, status=status, mimetype="application/json", headers={"x-amzn-ErrorType": code})


def register(app, emulator) -> None:
    api = LambdaApi(emulator)
    app.extensions["fnmap_lambda"] = api

    @app.post("/2015-03-31/functions/<name>/invocations")
    def lambda_invoke(name):
        name = _function_name(name)
        kind = request.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        payload = request.get_data(cache=False)
        if kind == "DryRun":
            return Response(status=204)
        limit = ASYNC_PAYLOAD_LIMIT if kind == "Event" else SYNC_PAYLOAD_LIMIT
        if len(payload) > limit:
            return _error(413, "RequestTooLargeException",
                          f"Request must be smaller than {limit} bytes for the {kind} invocation type")
        if kind == "Event":
            api.stats["Event"] += 1
            api.enqueue(name, payload)
            return Response(status=202)
        if kind != "RequestResponse":
            return _error(400, "InvalidParameterValueException",
                          f"X-Amz-Invocation-Type {kind!r} is not one of Event, RequestResponse, DryRun")
        if not api._acquire(name, wait=False):
            api.stats["throttled"] += 1
            return _error(429, "TooManyRequestsException", "Rate Exceeded.",
                          Reason="ReservedFunctionConcurrentInvocationLimitExceeded")
        api.stats["RequestResponse"] += 1
        try:
            result, function_error = api.run(name, payload)
        finally:
            api._release(name)
        headers = {"X-Amz-Executed-Version": "$LATEST"}
        body = json.dumps(function_error or result)
        if not function_error and len(body) > SYNC_PAYLOAD_LIMIT:
            api.stats["response_too_large"] += 1
            function_error = {"errorType": "Function.ResponseSizeTooLarge", "errorMessage": (
                f"Response payload size ({len(body)} bytes) exceeded maximum allowed payload size "
                f"({SYNC_PAYLOAD_LIMIT} bytes).")}
            body = json.dumps(function_error)
        if function_error:
            headers["X-Amz-Function-Error"] = "Unhandled"
        return Response(body, status=200, mimetype="application/json", headers=headers)

    @app.get("/2015-03-31/functions/<name>/configuration")
    def lambda_configuration(name):
        name = _function_name(name)
        info = runtime_info()
        return jsonify({
            "FunctionName": name,
            "FunctionArn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}",
            "Runtime": f"python{info['python']}",
            "Handler": "handlers.aws_lambda.handler",
            "Timeout": TIMEOUT_SECONDS,
            "MemorySize": 1024,
            "PackageType": "Zip",
            "State": "Active",
            "LastUpdateStatus": "Successful",
            "Environment": {"Variables": {"FNMAP_RUNTIME": json.dumps(info)}},
        })

    @app.route("/2017-10-31/functions/<name>/concurrency", methods=["PUT", "DELETE"])
    def lambda_put_concurrency(name):
        name = _function_name(name)
        if request.method == "DELETE":
            with api._cond:
                api.reserved.pop(name, None)
                api._cond.notify_all()
            return Response(status=204)
        value = (request.get_json(force=True, silent=True) or {}).get("ReservedConcurrentExecutions")
        if not isinstance(value, int) or value < 0:
            return _error(400, "InvalidParameterValueException",
                          f"ReservedConcurrentExecutions={value!r} must be an integer >= 0")
        with api._cond:
            api.reserved[name] = value
            api._cond.notify_all()
        return jsonify({"ReservedConcurrentExecutions": value})

    @app.get("/2019-09-30/functions/<name>/concurrency")
    def lambda_get_concurrency(name):
        name = _function_name(name)
        value = api.reserved.get(name)
        return jsonify({} if value is None else {"ReservedConcurrentExecutions": value})

    @app.route("/<version>/<path:rest>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    def lambda_unsupported(version, rest):
        """Any other Lambda API operation: a clear error for boto3, not an HTML 404."""
        if not _API_VERSION.fullmatch(version):
            return _error(404, "ResourceNotFoundException", f"no route {request.path}")
        return _error(
            501, "NotImplemented",
            f"the fnmap emulator speaks only Lambda's Invoke, GetFunctionConfiguration and "
            f"concurrency APIs, not {request.method} {request.path}; deploy to AWS "
            "(`fnmap deploy aws deploy`) for the rest",
        )

    @app.get("/lambda/stats")
    def lambda_stats():
        return jsonify({**api.stats, "events_queued": api._events.qsize(), "running": dict(api.running)})
