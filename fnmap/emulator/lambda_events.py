"""Lambda's asynchronous invocation on the emulator: the event invoke config, lost events, account limits.

Routes (botocore's paths), with either ``--lambda-runtime``:

* ``PUT``/``POST``/``GET``/``DELETE /2019-09-25/functions/<name>/event-invoke-config``
  (Put/Update/Get/DeleteFunctionEventInvokeConfig): ``MaximumRetryAttempts`` (0-2) and
  ``MaximumEventAgeInSeconds`` (Lambda takes 60-21600; the emulator takes 1-21600, so tests need not
  wait a minute).
* ``GET /2016-08-19/account-settings`` (GetAccountSettings): the emulator's concurrency is its
  workers (``ConcurrentExecutions``), less the functions' reserved concurrency (``Unreserved...``).

How the event queue honours them (:class:`EventQueueRules`, ``LambdaApi.events``):

* an event that waited in the queue longer than its function's ``MaximumEventAgeInSeconds`` is
  dropped without running (``events_expired`` in ``/lambda/stats``), as Lambda drops it;
* the emulator never runs an event twice (Lambda's ``MaximumRetryAttempts`` 0, what ``fnmap deploy
  aws`` sets; the client retries);
* the fault plan's ``--drop-rate`` also loses ``Event`` invocations as Lambda may: accepted (202),
  never run, nothing said (``events_dropped``), drawn from the call's id and attempt as every fault is.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time

from flask import Response, jsonify, request

from .lambda_common import configuration, error, function_name

#: Lambda's bounds of the event invoke config (the emulator also takes ages down to 1 s).
MAX_RETRIES = 2
MAX_EVENT_AGE = 21600


class EventQueueRules:
    """The functions' event invoke configs, and the fates of events under them."""

    def __init__(self, api):
        self.api = api
        self.configs: dict[str, dict] = {}
        self._lock = threading.Lock()

    def max_age(self, name: str) -> float | None:
        with self._lock:
            return (self.configs.get(name) or {}).get("MaximumEventAgeInSeconds")

    def dropped(self, payload: bytes) -> bool:
        """Whether the fault plan loses this ``Event`` invocation (``--drop-rate``); counted."""
        plan = self.api.emulator.faults
        if not plan.drop_rate:
            return False
        fate = plan.fate(*_call_key(payload))
        if fate.drop:
            self.api.stats["events_dropped"] += 1
        return fate.drop

    def expired(self, name: str, queued: float) -> bool:
        """Whether an event queued at ``queued`` (monotonic) is past its age limit now; counted."""
        age = self.max_age(name)
        if age is None or time.monotonic() - queued <= age:
            return False
        self.api.stats["events_expired"] += 1
        return True


def _call_key(payload: bytes) -> tuple:
    """``(call id, attempt)`` of a call event, read from its envelope's JSON header (nothing is
    unpickled); a stand-in key for an event that does not say (a by-reference one)."""
    from ..runtime.wire import decode_header

    try:
        event = json.loads(payload)
        header, _ = decode_header(base64.b64decode(event["body"]))
        call_id, attempt = header["call_id"], header["attempt"]
        if isinstance(call_id, int) and isinstance(attempt, int):
            return call_id, attempt
    except (ValueError, KeyError, TypeError):
        pass
    return "event-" + hashlib.sha256(payload).hexdigest()[:16], 0


def _checked(spec: dict) -> str | None:
    """What is wrong with an event invoke config, or None."""
    retries, age = spec.get("MaximumRetryAttempts"), spec.get("MaximumEventAgeInSeconds")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)
                                or not 0 <= retries <= MAX_RETRIES):
        return f"MaximumRetryAttempts={retries!r} must be an integer from 0 to {MAX_RETRIES}"
    if age is not None and (isinstance(age, bool) or not isinstance(age, int) or not 1 <= age <= MAX_EVENT_AGE):
        return f"MaximumEventAgeInSeconds={age!r} must be an integer from 60 to {MAX_EVENT_AGE} (the emulator: 1)"
    return None


def lambda_event_invoke_config(api, name):
    """Put (replace), Update (POST: the fields named), Get and Delete a function's event invoke config."""
    rules = api.events
    name = function_name(name)
    if request.method in ("PUT", "POST"):
        spec = request.get_json(force=True, silent=True) or {}
        problem = _checked(spec)
        if problem:
            return error(400, "InvalidParameterValueException", problem)
        fields = {k: spec[k] for k in ("MaximumRetryAttempts", "MaximumEventAgeInSeconds") if k in spec}
        with rules._lock:
            rules.configs[name] = fields if request.method == "PUT" else {**rules.configs.get(name, {}), **fields}
    with rules._lock:
        config = rules.configs.pop(name, None) if request.method == "DELETE" else rules.configs.get(name)
    if config is None:
        return error(404, "ResourceNotFoundException", f"The function {name} has no event invoke config")
    if request.method == "DELETE":
        return Response(status=204)
    return jsonify({"FunctionArn": configuration(api, name)["FunctionArn"], "LastModified": time.time(),
                    "DestinationConfig": {}, **config})


def lambda_account_settings(api):
    """The account's concurrency: the emulator's workers, less the functions' reserved concurrency."""
    size = api.emulator.pool.size
    with api._cond:
        reserved = sum(api.reserved.values())
    return jsonify({"AccountLimit": {"ConcurrentExecutions": size,
                                     "UnreservedConcurrentExecutions": max(0, size - reserved),
                                     "TotalCodeSize": 80 * 2**30, "CodeSizeUnzipped": 250 * 2**20,
                                     "CodeSizeZipped": 50 * 2**20},
                    "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0}})


#: Routes (botocore's paths), served with either ``--lambda-runtime``.
ROUTES = [
    ("PUT,POST,GET,DELETE", "/2019-09-25/functions/<name>/event-invoke-config", lambda_event_invoke_config),
    ("GET", "/2016-08-19/account-settings", lambda_account_settings),
]
