"""``aws``: invoke an AWS Lambda function through boto3.

Each call is one Lambda Invoke, sent by :class:`.lambda_invoke.LambdaInvoker`: boto3 gives the
credentials, configuration, endpoint and error parsing, botocore's ``SigV4Auth`` signs, and a
urllib3 keep-alive pool sends (``client.invoke``'s per-call machinery cost five times the CPU).

With ``lambda_invocation="auto"`` (the default) a call goes ``RequestResponse``
while fewer than a quarter of the dispatch threads hold synchronous calls, so a
small job's results ride back in the responses; beyond that calls go ``Event`` (asynchronous, 202 at once), so a
fan-out of thousands is not bounded by the client's threads, and their results
are gathered from storage by the client's monitor (one LIST per poll).  Where the platform runs
no more calls at once than that quarter (``platform_concurrency``: a reserved concurrency, the
offline emulator's environments) every call goes ``RequestResponse``: the platform, not the
client's threads, is the bound, and an ``Event`` would only wait in its queue.

A request over Lambda's payload limit (``lambda_sync_limit`` 6 MiB,
``lambda_async_limit`` 1 MiB; base64 included) is written to the job's storage
and sent by reference (:mod:`fnmap.runtime.lambda_event`).  Throttling
(``TooManyRequestsException``, 429) becomes a ``throttled`` fault at once, so the
scheduler lowers the calls in flight and backs off (not charged as a retry).
5xx answers become ``server`` faults.  ``AWS_ENDPOINT_URL_LAMBDA`` points boto3
at another endpoint (the emulator) with no fnmap setting.

Fan-out from inside the platform (opt-in, :attr:`AwsBackend.fanout_threshold`): a job of at
least that many calls, handed over at once (``invoke_all``), is sent as a few *spawner*
invocations (``RequestResponse``), each carrying up to ``fanout_slice`` already-signed call
events, which the function invokes itself as ``Event`` calls (``handlers/aws_lambda.py``), so
the client sends a few requests, not one per call.  Every call counts as accepted; a call a
spawner could not invoke, or whose spawner failed, is reported through ``poll_failures`` and
retried directly; one a spawner invoked but that never ran is declared lost after the timeout
and retried.  A call invoked twice still commits once (the worker's first writer wins).

A job with ``memory`` steps (``memory=[1024, 4096]``) sends a call killed for memory
again to the next step's own function (:mod:`.lambda_memory`).

On creation the backend reads the function's configuration once: a missing
function, missing permissions, or a Python/cloudpickle version that differs
from the client's are reported before any call is sent.
"""

from __future__ import annotations

import json
import secrets
import threading
import time

from ..errors import ConfigError, PlatformFault, VersionMismatch
from ..runtime import keys
from ..runtime.lambda_event import decode_result, encode_event, encode_reference_event, encode_spawn_event
from ..runtime.serialization import runtime_info, runtime_mismatch
from ..storage import open_store
from .base import ACCEPTED, Answer, BaseBackend, FailedCall, Invocation
from .http import fault_from_status
from .lambda_deployment import concurrency, event_bounds, lost_after
from .lambda_fanout import EventSpawner
from .lambda_invoke import InvokeError, LambdaInvoker
from .lambda_memory import function_for, steps_problem

INVOCATION_TYPES = ("auto", "Event", "RequestResponse")
_CONNECT_TIMEOUT = 10
#: Seconds a call ``invoke_all`` could not deliver is held before ``poll_failures`` reports it.
_REPORT_AFTER = 1.0
#: Lambda runs a call for at most 15 minutes; a synchronous answer may take that long.
_READ_TIMEOUT = 15 * 60 + 60
#: Function errors that no retry can fix (the package is broken): fail the call at once.
_BROKEN_PACKAGE = ("Runtime.ImportModuleError", "Runtime.HandlerNotFound", "Runtime.UserCodeSyntaxError")


class AwsBackend(BaseBackend):
    name = "aws"
    #: Each call is a Lambda invocation (a request, maybe a cold start) and objects in S3.
    call_seconds = 1.5
    #: Jobs of at least this many calls fan out through spawner invocations (None: never).  Set, it
    #: makes the scheduler hand every job's calls over together (``fans_out``).
    fanout_threshold: int | None = None
    #: Call events per spawner (bounded too by the synchronous payload limit).
    fanout_slice = 1000

    def __init__(self, config):
        if config.lambda_invocation not in INVOCATION_TYPES:
            raise ConfigError(
                f"{config.describe('lambda_invocation')} is not a Lambda invocation type; "
                f"choose one of: {', '.join(INVOCATION_TYPES)}"
            )
        for name in ("lambda_sync_limit", "lambda_async_limit"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
                raise ConfigError(f"{config.describe(name)} must be a payload size in bytes, at least 1024")
        self.config = config
        self.function_name = config.function_name
        self.invocation = config.lambda_invocation
        self.sync_limit = config.lambda_sync_limit
        self.async_limit = config.lambda_async_limit
        self.max_workers = config.workers or 64
        self._sync_slots = max(1, self.max_workers // 4)
        self._sync_in_flight = 0
        self._lock = threading.Lock()
        from botocore.exceptions import NoRegionError

        try:
            self._session, self._client = make_lambda_client(config.region, self.max_workers)
        except NoRegionError:
            raise ConfigError(
                "the aws backend needs the function's AWS region: set region=... or FNMAP_REGION "
                "(the deploy printed it), or AWS_REGION"
            ) from None
        self.function = self._describe()
        #: An Event call with no result this long after its acceptance never ran and never will
        #: (the function's event invoke config bounds it, see :mod:`.lambda_deployment`).
        self.lost_after = lost_after(self.function, event_bounds(self._client, self.function_name))
        #: Calls the platform runs at once (None: it does not say); automatic chunking's first wave.
        self.platform_concurrency = concurrency(self._client, self.function_name)
        self._invoker = LambdaInvoker(self._session, self._client, self.function_name, self.max_workers,
                                      _CONNECT_TIMEOUT, _READ_TIMEOUT)
        #: Invokers of the functions of higher memory steps, by name (see :mod:`.lambda_memory`).
        self._step_invokers: dict[str, LambdaInvoker] = {}
        #: What :func:`steps_problem` found, per tuple of memory steps.
        self._steps_checked: dict[tuple, str | None] = {}
        # The ``lambda_fanout`` option (FNMAP_LAMBDA_FANOUT) overrides the class's default.
        self.fanout_threshold = config.lambda_fanout or self.fanout_threshold
        self.fans_out = self.fanout_threshold is not None
        self._failures: list[tuple[float, FailedCall]] = []
        self._senders = None
        #: Event calls go out through spawners by default (:mod:`.lambda_fanout`); lambda_fanout=0: never.
        self._spawner = EventSpawner(self) if config.lambda_fanout != 0 else None

    # -- checks before anything is sent ----------------------------------------

    def _describe(self) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"Lambda function {self.function_name!r} (region {self._client.meta.region_name})"
        try:
            function = self._client.get_function_configuration(FunctionName=self.function_name)
        except NoCredentialsError:
            raise ConfigError(
                "the aws backend found no AWS credentials: configure them (aws configure, "
                "AWS_PROFILE, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            ) from None
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise ConfigError(
                    f"{where} does not exist ({self.config.describe('function_name')}): deploy it with "
                    f"`fnmap deploy aws deploy --name {self.function_name}`, or set function_name and "
                    "region to what the deploy printed"
                ) from None
            if code in ("AccessDeniedException", "AccessDenied", "UnrecognizedClientException"):
                raise ConfigError(
                    f"cannot read the configuration of {where} ({code}): the client's credentials need "
                    "lambda:GetFunctionConfiguration and lambda:InvokeFunction on it (see docs/deploy.md, Run on AWS)"
                ) from None
            raise ConfigError(f"cannot read the configuration of {where}: {e}") from e
        except BotoCoreError as e:
            raise ConfigError(f"cannot reach {where} at {self._client.meta.endpoint_url}: {e}") from e
        mismatch = runtime_mismatch(runtime_info(), _function_runtime(function))
        if mismatch:
            raise VersionMismatch(f"{where}: {mismatch}")
        return function

    # -- invocation --------------------------------------------------------------

    def invoke(self, invocation: Invocation) -> Answer:
        problem = self._unsupported(invocation.config)
        if problem:
            raise PlatformFault("rejected", problem)
        kind = self._choose()
        config = invocation.config
        name = function_for(self.function_name, config.memory_steps if config else (), invocation.memory)
        try:
            payload = self._payload(invocation, kind)
            if kind == "Event" and name == self.function_name and self._spawner and self._spawner.enabled:
                self._spawner.add(invocation, payload)  # sent with others by one spawner
                return ACCEPTED
            answer = self._call(kind, payload, name)
        finally:
            if kind == "RequestResponse" and self.invocation == "auto":
                with self._lock:
                    self._sync_in_flight -= 1
        return answer

    def invoke_all(self, invocations: list[Invocation]) -> list[Answer]:
        """Calls handed over together: through spawners from ``fanout_threshold`` on, else one by one
        in parallel.  A call that could not be delivered is answered ACCEPTED and its fault reported
        by :meth:`poll_failures` (the scheduler then retries it), so one throttled call does not fail
        the rest."""
        stepped = any(i.config is not None and function_for(self.function_name, i.config.memory_steps, i.memory)
                      != self.function_name for i in invocations)  # spawners invoke the function itself
        if len(invocations) < (self.fanout_threshold or 0) or self.fanout_threshold is None or stepped:
            return list(self.senders().map(self._invoke_or_report, invocations))
        slices, current, size = [], [], 0
        for invocation in invocations:
            try:
                payload = self._payload(invocation, "Event")
            except PlatformFault as fault:
                self._report(invocation, fault)
                continue
            if current and (len(current) >= self.fanout_slice or size + len(payload) + 64 > self.sync_limit):
                slices.append(current)
                current, size = [], 0
            current.append((invocation, payload))
            size += len(payload) + 2
        if current:
            slices.append(current)
        list(self.senders().map(self.spawn, slices))
        return [ACCEPTED] * len(invocations)

    def senders(self):
        """The threads that send calls handed over together, and spawners."""
        if self._senders is None:
            from concurrent.futures import ThreadPoolExecutor

            with self._lock:
                if self._senders is None:
                    self._senders = ThreadPoolExecutor(self.max_workers, thread_name_prefix="fnmap-aws-send")
        return self._senders

    def send_event(self, invocation: Invocation, payload: bytes) -> None:
        """One buffered call sent directly as an Event; a fault is reported (``poll_failures``)."""
        try:
            self._call("Event", payload)
        except PlatformFault as fault:
            self._report(invocation, fault)

    def _invoke_or_report(self, invocation: Invocation) -> Answer:
        try:
            return self.invoke(invocation)
        except PlatformFault as fault:
            self._report(invocation, fault)
            return ACCEPTED

    def spawn(self, calls: list, give_back: bool = False) -> list:
        """One spawner: it invokes ``calls`` (``(invocation, payload)``) from inside the platform;
        report those it did not.  With ``give_back``, a spawner that could invoke none of its calls
        (and not for throttling: the function may not invoke itself, or cannot reach the Lambda API)
        reports nothing and returns them as ``(invocation, payload, message)``."""
        try:
            first = calls[0][0].request
            event = encode_spawn_event([payload for _, payload in calls], [i.signature for i, _ in calls],
                                       self._secret(), first.job_id, secrets.token_hex(8), first.store_url,
                                       first.job_record or "", self.signature_lifetime)
            answer = self._call("RequestResponse", event)
            failed = json.loads(answer.body) if answer.body is not None else []
        except PlatformFault as fault:
            for invocation, _ in calls:
                self._report(invocation, fault)
            return []
        except ValueError as e:
            fault = PlatformFault("server", f"a spawner's answer is not a list of failed calls: {e}")
            for invocation, _ in calls:
                self._report(invocation, fault)
            return []
        if give_back and failed and len(failed) == len(calls) and all(kind != "throttled" for _, kind, _ in failed):
            return [(*calls[index], str(message)) for index, _kind, message in failed]
        for index, kind, message in failed:
            try:
                fault = PlatformFault(kind, f"a spawner could not invoke the call: {message}")
            except ValueError:
                fault = PlatformFault("server", f"a spawner could not invoke the call ({kind}): {message}")
            self._report(calls[index][0], fault)
        return []

    def _report(self, invocation: Invocation, fault: PlatformFault) -> None:
        req = invocation.request
        with self._lock:
            self._failures.append((time.monotonic(), FailedCall(req.job_id, req.call_id, req.attempt, fault)))

    def poll_failures(self) -> list[FailedCall]:
        """Calls ``invoke_all`` answered ACCEPTED but could not deliver, once the scheduler has
        recorded them as accepted (:data:`_REPORT_AFTER` seconds on; it drops a failure of a call it
        does not await yet)."""
        ripe = time.monotonic() - _REPORT_AFTER
        with self._lock:
            failures = [f for at, f in self._failures if at <= ripe]
            self._failures = [(at, f) for at, f in self._failures if at > ripe]
        return failures

    def _unsupported(self, config) -> str | None:
        """Why the function cannot serve a job's options (Lambda fixes memory and timeout per function)."""
        if config is None:
            return None
        where = f"Lambda function {self.function_name!r}"
        memory = int(self.function.get("MemorySize") or 0)
        if config.gpu:
            return f"{config.describe('gpu')}: {where} has no GPUs; run GPU work with backend='batch'"
        first = config.memory_steps[0] if config.memory_steps else None
        if first and memory and first > memory:
            return (f"{config.describe('memory')} but {where} has {memory} MB (Lambda sets memory per "
                    f"function): redeploy with `fnmap deploy aws update --name {self.function_name} "
                    f"--memory {first}`, or ask for memory={memory} or less")
        if len(config.memory_steps) > 1:
            steps = config.memory_steps
            if steps not in self._steps_checked:
                self._steps_checked[steps] = steps_problem(self.function_name, steps, self._memory_of)
            if self._steps_checked[steps]:
                return self._steps_checked[steps]
        limit = float(self.function.get("Timeout") or 900)
        if config.timeout and config.timeout > limit:
            return (f"{config.describe('timeout')} but {where} stops calls after {limit:.0f} s: redeploy "
                    f"with `--timeout` up to 900, or use a smaller timeout")
        return None

    def _choose(self) -> str:
        if self.invocation != "auto":
            return self.invocation
        with self._lock:
            if self._sync_in_flight < self._sync_slots or self._platform_bound():
                self._sync_in_flight += 1
                return "RequestResponse"
        return "Event"

    def _platform_bound(self) -> bool:
        """Whether the platform, not the client's threads, bounds the calls running at once: it runs
        no more than the synchronous slots.  Calls beyond them would wait in Lambda's event queue
        as ``Event``s; as ``RequestResponse`` they wait as long (on Lambda, throttled: the scheduler
        lowers the calls in flight) and their results ride back in the answers, not through storage."""
        platform = self.platform_concurrency
        return isinstance(platform, int) and 0 < platform <= self._sync_slots

    def _payload(self, invocation: Invocation, kind: str) -> bytes:
        """The event, inline when it fits the payload limit, else by reference through storage."""
        limit = self.sync_limit if kind == "RequestResponse" else self.async_limit
        # base64 grows the body by a third; skip encoding it when it clearly cannot fit.
        if 4 * ((len(invocation.body) + 2) // 3) + 200 <= limit:
            payload = encode_event(invocation.body, invocation.signature)
            if len(payload) <= limit:
                return payload
        req = invocation.request
        key = keys.blob_key(req.job_id, f"request-{req.call_id}-{req.attempt}")
        try:
            open_store(req.store_url).put(key, invocation.body)
        except Exception as e:
            raise PlatformFault("server", f"cannot store the {len(invocation.body)}-byte request: {e!r}") from e
        return encode_reference_event(req.store_url, key, invocation.body, invocation.signature, self._secret(),
                                      (req.job_id, req.call_id, req.attempt), self.signature_lifetime)

    def _secret(self) -> bytes:
        """The deployment's secret (``secret=`` / ``FNMAP_SECRET``): it signs references and spawners."""
        secret = self.config.secret.encode() if self.config.secret else self.secret
        if not secret:
            raise PlatformFault("rejected", "the aws backend needs the deployment's secret: set FNMAP_SECRET")
        return secret

    def _memory_of(self, name: str) -> int | None:
        """A function's ``MemorySize``; None when it does not exist."""
        from botocore.exceptions import ClientError

        try:
            return int(self._client.get_function_configuration(FunctionName=name).get("MemorySize") or 0)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return None
            raise

    def _invoker_for(self, name: str | None) -> LambdaInvoker:
        if name is None or name == self.function_name:
            return self._invoker
        with self._lock:
            if name not in self._step_invokers:
                self._step_invokers[name] = LambdaInvoker(self._session, self._client, name, self.max_workers,
                                                          _CONNECT_TIMEOUT, _READ_TIMEOUT)
            return self._step_invokers[name]

    def _call(self, kind: str, payload: bytes, name: str | None = None) -> Answer:
        from urllib3.exceptions import HTTPError, MaxRetryError, ReadTimeoutError

        invoker = self._invoker_for(name)
        target = f"Lambda function {name or self.function_name!r}"
        try:
            _status, headers, body = invoker.invoke(kind, payload)
        except InvokeError as e:
            raise _fault_from_error_response(e.response, target) from None
        except ReadTimeoutError as e:
            raise PlatformFault("lost", f"no answer from {target} within {_READ_TIMEOUT} s") from e
        except MaxRetryError as e:
            raise PlatformFault("connection", f"cannot reach {target} at {invoker.url}: {e.reason}") from e
        except HTTPError as e:
            raise PlatformFault("connection", f"cannot reach {target} at {invoker.url}: {e!r}") from e
        if kind == "Event":
            return ACCEPTED
        if headers.get("X-Amz-Function-Error"):
            return _function_error(body, target)
        try:
            status, out = decode_result(body)
        except ValueError as e:
            raise PlatformFault("server", f"{target}: {e}") from None
        if status == 200:
            return Answer(out)
        raise fault_from_status(status, {}, out.decode(errors="replace"), target)

    def close(self) -> None:
        if self._spawner is not None:
            self._spawner.close()
        if self._senders is not None:
            self._senders.shutdown(wait=False)
        self._invoker.close()
        for invoker in self._step_invokers.values():
            invoker.close()
        self._client.close()


def make_lambda_client(region: str | None, max_workers: int):
    """``(botocore session, boto3 Lambda client)``: endpoint and credentials from boto3's settings.

    The client reads the function's configuration; Invoke goes through :class:`LambdaInvoker`.
    """
    import boto3
    import botocore.session
    from botocore.config import Config

    config = Config(
        retries={"mode": "adaptive", "max_attempts": 3},
        connect_timeout=_CONNECT_TIMEOUT,
        read_timeout=_READ_TIMEOUT,
        max_pool_connections=max_workers,
        tcp_keepalive=True,
    )
    core = botocore.session.get_session()
    return core, boto3.session.Session(botocore_session=core).client("lambda", region_name=region, config=config)


def _function_runtime(function: dict) -> dict:
    """The Python and cloudpickle versions a deployed function runs, as far as it says."""
    mine = runtime_info()
    env = (function.get("Environment") or {}).get("Variables") or {}
    try:
        recorded = json.loads(env.get("FNMAP_RUNTIME") or "{}")
    except ValueError:
        recorded = {}
    runtime = str(function.get("Runtime") or "")
    python = recorded.get("python") or (runtime[len("python"):] if runtime.startswith("python") else None)
    # A container image (no Runtime) deployed without FNMAP_RUNTIME cannot tell; its calls report
    # a mismatch themselves ("version" fault).
    return {"protocol": recorded.get("protocol") if recorded else mine["protocol"],
            "python": python or mine["python"], "cloudpickle": recorded.get("cloudpickle") or mine["cloudpickle"]}


def _fault_from_error_response(response: dict, target: str) -> PlatformFault:
    """The fault of an Invoke's error answer, parsed by botocore (``ClientError.response``'s shape)."""
    err = response.get("Error", {})
    code = err.get("Code", "")
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    message = f"{target}: {code}: {err.get('Message', '')}"
    if code in ("TooManyRequestsException", "ThrottlingException") or status == 429:
        return PlatformFault("throttled", message)
    if status >= 500:
        return PlatformFault("server", message)
    if code == "ResourceNotFoundException":
        return PlatformFault("rejected", message + " (was the function destroyed? redeploy it)")
    return PlatformFault("rejected", message)


def _function_error(body: bytes, target: str) -> Answer:
    """Lambda's own error payload (the runtime died, timed out, or the answer was too big)."""
    try:
        error = json.loads(body)
    except ValueError:
        error = {"errorMessage": body[:500].decode(errors="replace")}
    kind = str(error.get("errorType", ""))
    message = f"{target}: {kind or 'error'}: {error.get('errorMessage', '')}"
    if kind == "Function.ResponseSizeTooLarge":
        return ACCEPTED  # the worker committed the result before answering: the monitor reads it from storage
    if kind == "Runtime.OutOfMemory":  # over the function's MemorySize: the same memory fails again
        raise PlatformFault("out_of_memory", message)
    if kind == "Runtime.ExitError" or "exited" in message:
        raise PlatformFault("crashed", message)
    if kind == "Sandbox.Timedout" or "timed out" in message:
        raise PlatformFault("timeout", message)
    if kind in _BROKEN_PACKAGE:
        raise PlatformFault("rejected", message + " (the deployed package is broken: redeploy it)")
    raise PlatformFault("server", message)
