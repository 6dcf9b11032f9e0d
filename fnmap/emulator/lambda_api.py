"""AWS Lambda's API on the emulator, so the ``aws`` backend runs unchanged through boto3.

Point boto3 here with ``AWS_ENDPOINT_URL_LAMBDA=<emulator URL>`` (and storage at
any S3 server with ``AWS_ENDPOINT_URL_S3``).  Every request to a Lambda API path (``/20YY-MM-DD/...``)
must be signed with SigV4 and credentials the emulator knows (:mod:`.sigv4`), or it is refused
with 403 before any route sees it.  Routes, with botocore's paths:

* ``POST /2015-03-31/functions/<name>/invocations`` (Invoke), by
  ``X-Amz-Invocation-Type``: ``RequestResponse`` answers 200 with the handler's
  result, or with ``X-Amz-Function-Error: Unhandled`` and Lambda's error payload
  when the runtime exited (``Runtime.ExitError``), ran past its timeout
  (``Sandbox.Timedout``) or could not load the package (``Runtime.ImportModuleError``
  and the other init errors); ``Event`` answers 202 at once and queues the call
  (a result reaches storage only); ``DryRun`` answers 204.  Lambda's payload limits
  hold: 413 ``RequestTooLargeException`` for a request over 6 MiB (1 MiB for
  ``Event``), ``Function.ResponseSizeTooLarge`` for a response over 6 MiB.
* ``GET /2015-03-31/functions/<name>/configuration`` (GetFunctionConfiguration).
* With ``ric`` only, function management and layers (:mod:`.lambda_manage`): CreateFunction,
  GetFunction, UpdateFunctionCode, UpdateFunctionConfiguration, DeleteFunction, PublishLayerVersion,
  GetLayerVersion, ListLayerVersions and DeleteLayerVersion.
* Put/Update/Get/DeleteFunctionEventInvokeConfig (honoured: an event past its age is dropped; the
  fault plan's ``--drop-rate`` loses events silently) and GetAccountSettings (:mod:`.lambda_events`).
* ``PUT``/``DELETE /2017-10-31/...`` and ``GET /2019-09-30/functions/<name>/concurrency``
  (reserved concurrency): a synchronous invocation beyond it answers 429
  ``TooManyRequestsException`` as Lambda does; queued events wait for a slot.
* Lambda's scaling rate (``fnmap emulator --scaling-rate N``, default off): a function gains at most
  N new execution environments per 10 seconds (Lambda's own is 1,000), an initial N at once; an
  invocation that finds every environment busy and no new one allowed answers 429
  ``TooManyRequestsException`` (synchronous) or waits in the event queue (``Event``).
* Any other Lambda API operation: 501 ``NotImplemented``, naming the operation and saying that the
  emulator does not support it.
* ``GET /lambda/stats``: invocations by type, throttles (``scaling_throttled`` of them by the
  scaling rate), events queued, environments by function, how many access key ids signed Invokes
  (not which); with ``ric``, cold and warm starts, environments, init errors, timeouts and runtime
  exits (emulator only).

Two ways to run the events (``fnmap emulator --lambda-runtime``):

* ``ric`` (the default when ``awslambdaric`` is installed): Lambda's own path.  Each
  event goes through Lambda's Runtime API to an execution environment running AWS's
  runtime interface client over the unpacked deployment package
  (:mod:`.lambda_runtime`): warm reuse, cold starts, the function's timeout, init
  errors and Lambda's error payloads come from the real client.  The functions can
  be configured with boto3 as on Lambda: ``CreateFunction`` and ``UpdateFunctionCode``
  (a zip), ``UpdateFunctionConfiguration`` (``Timeout``, ``MemorySize``,
  ``Environment``, ``Layers``) and ``PublishLayerVersion``; a name never created
  runs the package ``fnmap deploy aws`` would upload, built from this fnmap.  The
  emulator's injected faults (``--fail-rate`` and the rest) are not applied here.
* ``pool``: every function name is served by the emulator's one pool of workers.
  The event is decoded exactly as ``handlers/aws_lambda.py`` decodes it
  (:mod:`fnmap.runtime.lambda_event`), and nothing is unpickled in the emulator itself; a
  spawner event's calls are queued as Events, as the handler invokes them.
"""

from __future__ import annotations

import base64
import collections
import importlib.util
import json
import queue
import re
import threading
import time

from flask import Response, jsonify, request

from ..runtime.lambda_event import SPAWN_PREFIX, Refused, decode_event, encode_result, is_spawn_event, spawn
from ..runtime.signing import REFUSED, SECRET_ENV
from ..runtime.wire import ERROR_KIND_HEADER
from . import lambda_events, lambda_manage, sigv4
from .lambda_common import ACCOUNT, API_VERSION, HANDLER, REGION, TIMEOUT_SECONDS, configuration, error, lambda_error
from .lambda_common import function_name as _function_name
from .lambda_events import EventQueueRules
from .routes import add_routes

__all__ = ["ACCOUNT", "HANDLER", "REGION", "TIMEOUT_SECONDS", "LambdaApi", "lambda_error", "register", "runtime_mode"]
#: Every Lambda API path: each request to one must carry a valid SigV4 signature (:mod:`.sigv4`).
API_PATH = re.compile(r"/20\d\d-\d\d-\d\d/")
#: The one route an execution role's credentials may use (a spawner's Invoke).
_INVOKE_PATH = re.compile(r"/2015-03-31/functions/[^/]+/invocations")
#: The access key id in a SigV4 ``Authorization`` header.
_ACCESS_KEY = re.compile(r"Credential=([^/,\s]+)/")
#: Lambda scales a function by ``--scaling-rate`` new execution environments per this many seconds.
SCALING_PERIOD_SECONDS = 10.0
#: Lambda's payload limits, enforced as Lambda does: requests (synchronous, asynchronous) answer
#: 413 beyond them; a synchronous response beyond its limit becomes a function error.
SYNC_PAYLOAD_LIMIT = 6 * 1024 * 1024
ASYNC_PAYLOAD_LIMIT = 1024 * 1024


class LambdaApi:
    """Reserved concurrency, the event queue and counters, shared by the routes."""

    def __init__(self, emulator, make_runtime=None, scaling_rate: int | None = None):
        self.emulator = emulator
        #: New execution environments per function per :data:`SCALING_PERIOD_SECONDS` (None: no limit).
        self.scaling_rate = scaling_rate
        #: Environments each function has scaled to, and the new ones it may still start now.
        self.environments: collections.Counter = collections.Counter()
        self._allowance: dict[str, tuple[float, float]] = {}
        #: Makes the execution environments under awslambdaric (``--lambda-runtime ric``); None: the pool.
        self._make_runtime = make_runtime
        self._runtime = None
        self._runtime_lock = threading.Lock()
        self.reserved: dict[str, int] = {}
        self.running: collections.Counter = collections.Counter()
        self.stats: collections.Counter = collections.Counter()
        self._cond = threading.Condition()
        self._events: queue.Queue = queue.Queue()
        #: The access key ids that signed Invoke requests (SigV4's ``Credential=``), first seen first.
        self.access_keys: dict[str, None] = {}
        self._runners: list[threading.Thread] = []
        #: This emulator's URL as its first Lambda client reached it; execution environments call it back.
        self.own_url: str | None = None
        #: Whether events run under awslambdaric (``--lambda-runtime ric``), not in the pool.
        self.ric = make_runtime is not None
        #: The event invoke configs and lost events (:mod:`.lambda_events`).
        self.events = EventQueueRules(self)

    def _acquire(self, name: str, wait: bool) -> bool:
        with self._cond:
            while True:
                if name in self.reserved and self.running[name] >= self.reserved[name]:
                    delay = 0.5
                else:
                    delay = self._scale(name)
                    if delay == 0.0:
                        break
                    self.stats["scaling_throttled" if not wait else "scaling_waits"] += 1
                if not wait:
                    return False
                self._cond.wait(min(delay, 0.5))
            self.running[name] += 1
            return True

    def _scale(self, name: str) -> float:
        """0 when an invocation of ``name`` has an environment (an idle one, or a new one the scaling
        rate allows now, which is then counted); else the seconds until the next may start.  The
        caller holds ``_cond``."""
        if self.running[name] < self.environments[name] or not self.scaling_rate:
            if self.running[name] >= self.environments[name]:
                self.environments[name] += 1
            return 0.0
        rate = float(self.scaling_rate)
        now = time.monotonic()
        tokens, then = self._allowance.get(name, (rate, now))
        tokens = min(rate, tokens + (now - then) * rate / SCALING_PERIOD_SECONDS)
        if tokens >= 1.0:
            self._allowance[name] = (tokens - 1.0, now)
            self.environments[name] += 1
            return 0.0
        self._allowance[name] = (tokens, now)
        return (1.0 - tokens) * SCALING_PERIOD_SECONDS / rate

    def _release(self, name: str) -> None:
        with self._cond:
            self.running[name] -= 1
            self._cond.notify_all()

    @property
    def runtime(self):
        """The :class:`.lambda_runtime.LambdaRuntime`, made on the first Lambda request (an emulator
        serving only ``/invoke`` does not pay for it), or None when events run in the pool."""
        if self._make_runtime is not None and self._runtime is None:
            with self._runtime_lock:
                if self._runtime is None:
                    self._runtime = self._make_runtime()
        return self._runtime

    def run(self, name: str, payload: bytes, client_context: str | None = None) -> tuple[bytes, bool]:
        """Run one event; return ``(the Invoke's answer payload, function error?)``."""
        if self.runtime is None:
            result, function_error = self.run_in_pool(name, payload)
            return json.dumps(function_error or result).encode(), bool(function_error)
        if len(payload) < 65536 and "key" in (_json_object(payload) or {}):
            self.stats["by_reference"] += 1
        if payload.startswith(SPAWN_PREFIX):  # the handler invokes its calls back through this API
            self.stats["spawners"] += 1
        return self.runtime.invoke(name, payload, client_context)

    def run_in_pool(self, name: str, payload: bytes) -> tuple[dict | None, dict]:
        """Run one event through the pool; return ``(result, function error or {})``."""
        try:
            event = json.loads(payload)
            if is_spawn_event(event):
                return self._spawn(name, event), {}
            body, signature = decode_event(event, self.emulator.secret)
        except Refused:
            return encode_result(403, REFUSED), {}
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
        if kind == "out_of_memory":  # what Lambda reports for a function over its MemorySize
            return None, {"errorType": "Runtime.OutOfMemory",
                          "errorMessage": f"Runtime exited with error: signal: killed ({out.decode(errors='replace')})"}
        if kind == "timeout":
            return None, {"errorType": "Sandbox.Timedout",
                          "errorMessage": f"Task timed out: {out.decode(errors='replace')}"}
        return encode_result(status, out), {}

    def _spawn(self, name: str, event: dict) -> dict:
        """A spawner event, as ``handlers/aws_lambda.py`` runs it: each of its calls invoked as an Event."""
        self.stats["spawners"] += 1

        def invoke(payload: bytes):
            if len(payload) > ASYNC_PAYLOAD_LIMIT:
                return ("rejected", f"RequestTooLargeException: over {ASYNC_PAYLOAD_LIMIT} bytes for an Event")
            self.stats["Event"] += 1
            self.stats["spawned"] += 1
            self.enqueue(name, payload)
            return None

        return spawn(event, invoke, self.emulator.secret, threads=1)

    def enqueue(self, name: str, payload: bytes) -> None:
        if self.events.dropped(payload):
            return  # lost as Lambda may lose an event (--drop-rate): accepted, never run
        with self._cond:
            if len(self._runners) < self.emulator.pool.size:  # Lambda's async queue, drained by daemons
                runner = threading.Thread(target=self._drain, name="fnmap-lambda-event", daemon=True)
                self._runners.append(runner)
                runner.start()
        self._events.put((name, payload, time.monotonic()))

    def _drain(self) -> None:
        while True:
            name, payload, queued = self._events.get()
            self._acquire(name, wait=True)
            try:
                if self.events.expired(name, queued):
                    pass  # older than the function's MaximumEventAgeInSeconds: dropped, as on Lambda
                elif self.runtime is not None:
                    if self.run(name, payload)[1]:  # the answer of an event is dropped, as on Lambda
                        self.stats["event_function_errors"] += 1
                else:
                    # Lambda retries a throttled event itself (the emulator's --max-concurrency answers 429).
                    while (self.run_in_pool(name, payload)[0] or {}).get("status") == 429:
                        self.stats["events_throttled"] += 1
                        time.sleep(0.2)
            except Exception:  # an event has nobody to answer; the client declares it lost
                self.stats["event_errors"] += 1
            finally:
                self._release(name)
                self.stats["events_done"] += 1


def _platform_environment(base_env: dict, own_url: str | None, role: dict) -> dict:
    """The emulator's environment as Lambda's environments see theirs: with credentials (``role``, the
    execution role's, unless the emulator's environment has its own, which the emulator also accepts),
    and with the Lambda and Batch APIs at hand: this emulator's, whatever the shell that started it
    exported (a function calls its own platform back, as on AWS; an exported endpoint is often an
    earlier emulator's, gone since)."""
    env = dict(base_env)
    if not any(env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        env.update(role)
    if own_url:
        env.update(AWS_ENDPOINT_URL_LAMBDA=own_url, AWS_ENDPOINT_URL_BATCH=own_url)
    return env


def _client_context(header: str | None) -> str | None:
    """The Invoke's ``X-Amz-Client-Context`` (base64 JSON) as the runtime receives it (the JSON)."""
    if not header:
        return None
    try:
        return base64.b64decode(header, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("X-Amz-Client-Context must be base64-encoded JSON") from None


def _json_object(data: bytes) -> dict | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _ric_installed() -> bool:
    return importlib.util.find_spec("awslambdaric") is not None


def runtime_mode(asked: str | None) -> str:
    """``ric`` or ``pool``: what was asked, else ``ric`` when awslambdaric is installed."""
    if asked is None:
        return "ric" if _ric_installed() else "pool"
    if asked not in ("ric", "pool"):
        raise ValueError(f"--lambda-runtime {asked!r} is not one of: ric, pool")
    if asked == "ric" and not _ric_installed():
        raise ValueError("--lambda-runtime ric needs AWS's runtime interface client: pip install awslambdaric, "
                         "or pass --lambda-runtime pool")
    return asked


def register(app, emulator) -> None:
    ric = runtime_mode(getattr(emulator, "lambda_runtime", None)) == "ric"
    known = sigv4.known_credentials(app, emulator)
    make_runtime = None
    if ric:
        def make_runtime():
            from .lambda_runtime import LambdaRuntime

            return LambdaRuntime(_platform_environment(emulator.pool.env or {}, api.own_url, known.role_environment),
                                 emulator.pool.size)

    api = LambdaApi(emulator, make_runtime, getattr(emulator, "lambda_scaling_rate", None))
    app.extensions["fnmap_lambda"] = api
    # One check for every Lambda API path, before any route (those added later included) is reached.
    sigv4.require_signatures(app, known, API_PATH, "lambda",
                             role_may=lambda method, path: method == "POST" and bool(_INVOKE_PATH.fullmatch(path)))

    @app.before_request
    def note_own_url():
        # Before any execution environment starts (the first Lambda request makes them): their
        # handlers call this API back (spawners), as a function on AWS calls AWS's.  Only a signed
        # Lambda request gets here and names it.
        if api.own_url is None and API_PATH.match(request.path):
            api.own_url = request.host_url.rstrip("/")

    add_routes(app, [*ROUTES[:2], *lambda_events.ROUTES, *(lambda_manage.ROUTES if ric else ()), *ROUTES[2:]], api)


def lambda_invoke(api: LambdaApi, name):
    name = _function_name(name)
    kind = request.headers.get("X-Amz-Invocation-Type", "RequestResponse")
    payload = request.get_data(cache=False)
    signed_by = _ACCESS_KEY.search(request.headers.get("Authorization", ""))
    if signed_by:
        api.access_keys.setdefault(signed_by.group(1), None)
    if kind == "DryRun":
        return Response(status=204)
    limit = ASYNC_PAYLOAD_LIMIT if kind == "Event" else SYNC_PAYLOAD_LIMIT
    if len(payload) > limit:
        return error(413, "RequestTooLargeException",
                     f"Request must be smaller than {limit} bytes for the {kind} invocation type")
    if kind == "Event":
        api.stats["Event"] += 1
        api.enqueue(name, payload)
        return Response(status=202)
    if kind != "RequestResponse":
        return error(400, "InvalidParameterValueException",
                     f"X-Amz-Invocation-Type {kind!r} is not one of Event, RequestResponse, DryRun")
    return _invoke_sync(api, name, payload)


def _invoke_sync(api: LambdaApi, name: str, payload: bytes):
    """A ``RequestResponse`` Invoke: within the function's concurrency, or 429."""
    try:
        client_context = _client_context(request.headers.get("X-Amz-Client-Context"))
    except ValueError as e:
        return error(400, "InvalidRequestContentException", str(e))
    if not api._acquire(name, wait=False):
        api.stats["throttled"] += 1
        reason = ("ReservedFunctionConcurrentInvocationLimitExceeded" if name in api.reserved
                  else "ConcurrentInvocationLimitExceeded")
        return error(429, "TooManyRequestsException", "Rate Exceeded.", Reason=reason)
    api.stats["RequestResponse"] += 1
    try:
        body, function_error = api.run(name, payload, client_context)
    finally:
        api._release(name)
    headers = {"X-Amz-Executed-Version": "$LATEST"}
    if not function_error and len(body) > SYNC_PAYLOAD_LIMIT:
        function_error, body = True, lambda_error("Function.ResponseSizeTooLarge", (
            f"Response payload size ({len(body)} bytes) exceeded maximum allowed payload size "
            f"({SYNC_PAYLOAD_LIMIT} bytes)."))
    if function_error and b"Function.ResponseSizeTooLarge" in body[:200]:
        api.stats["response_too_large"] += 1
    if function_error:
        headers["X-Amz-Function-Error"] = "Unhandled"
    return Response(body, status=200, mimetype="application/json", headers=headers)


def lambda_configuration(api: LambdaApi, name):
    """GetFunctionConfiguration.  A function never created here runs with the emulator's own secret,
    and its configuration says so, as Lambda's shows a deployed function's ``FNMAP_SECRET``: ``fnmap
    deploy aws deploy`` then keeps that secret (and the layers) when it creates the function over it."""
    name = _function_name(name)
    answer = configuration(api, name)
    runtime = api.runtime
    if runtime is not None and name not in runtime.created and runtime.base_env.get(SECRET_ENV):
        answer["Environment"]["Variables"].setdefault(SECRET_ENV, runtime.base_env[SECRET_ENV])
    return jsonify(answer)


def lambda_put_concurrency(api: LambdaApi, name):
    name = _function_name(name)
    if request.method == "DELETE":
        with api._cond:
            api.reserved.pop(name, None)
            api._cond.notify_all()
        return Response(status=204)
    value = (request.get_json(force=True, silent=True) or {}).get("ReservedConcurrentExecutions")
    if not isinstance(value, int) or value < 0:
        return error(400, "InvalidParameterValueException",
                     f"ReservedConcurrentExecutions={value!r} must be an integer >= 0")
    with api._cond:
        api.reserved[name] = value
        api._cond.notify_all()
    return jsonify({"ReservedConcurrentExecutions": value})


def lambda_get_concurrency(api: LambdaApi, name):
    name = _function_name(name)
    value = api.reserved.get(name)
    return jsonify({} if value is None else {"ReservedConcurrentExecutions": value})


def lambda_unsupported(api: LambdaApi, version, rest):
    """Any other Lambda API operation: a clear error naming it, not an HTML 404."""
    if not API_VERSION.fullmatch(version):
        return error(404, "ResourceNotFoundException", f"no route {request.path}")
    return lambda_manage.unsupported(api.ric)


def lambda_stats(api: LambdaApi):
    stats = {**api.stats, "events_queued": api._events.qsize(), "running": dict(api.running),
             "lambda_runtime": "ric" if api.ric else "pool", "scaling_rate": api.scaling_rate,
             "access_keys": len(api.access_keys)}  # how many keys, not which: the route is unsigned
    if api.scaling_rate:
        stats["scaled_to"] = dict(api.environments)
    if api.ric and api._runtime is not None:  # not made here: made before a signed request, its
        stats.update(api.runtime.stats, environments=api.runtime.environments())  # spawners lack own_url
    return jsonify(stats)


#: The Lambda API's routes (botocore's paths); with ``ric``, :data:`.lambda_manage.ROUTES` after the
#: first two.
ROUTES = [
    ("POST", "/2015-03-31/functions/<name>/invocations", lambda_invoke),
    ("GET", "/2015-03-31/functions/<name>/configuration", lambda_configuration),
    ("PUT,DELETE", "/2017-10-31/functions/<name>/concurrency", lambda_put_concurrency),
    ("GET", "/2019-09-30/functions/<name>/concurrency", lambda_get_concurrency),
    ("GET,POST,PUT,DELETE,PATCH", "/<version>/<path:rest>", lambda_unsupported),
    ("GET", "/lambda/stats", lambda_stats),
]
