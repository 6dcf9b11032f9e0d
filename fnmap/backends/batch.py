"""``batch``: GPU container jobs, one AWS Batch array job per fnmap job.

``invoke_all`` writes each call's signed request to storage under a fresh
request prefix, then submits one array job (array size = number of calls;
above AWS Batch's 10,000 children the calls are split into balanced array
jobs) whose children run ``python -m handlers.container STORE PREFIX`` and
each read their own request by index.  GPUs and memory are asked per
submission through ``resourceRequirements``; the job definition's timeout and
retry strategy are overridden from the job's options.  Calls retried after an
out-of-memory kill go in a new array job asking for the next ``memory`` step
(one array job per memory: Batch sets resources per submission).  Results come back
through storage like every asynchronous backend.  ``poll_failures`` asks
``describe_jobs`` (and ``list_jobs`` for the failed children of an array) at
most every ``status_interval`` seconds and reports failed children to the
client, which retries or fails them; calls are never declared lost on a timer,
because a job may wait in the queue for as long as the compute environment
takes to start an instance.

The endpoint comes from boto3's own settings, so ``AWS_ENDPOINT_URL_BATCH``
pointing at ``fnmap emulator`` runs everything offline; for a loopback
endpoint, a missing region gets a placeholder; the emulator accepts only requests signed
with its own credentials (those it printed; the embedded emulator's are used directly).
"""

from __future__ import annotations

import ipaddress
import math
import os
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

from ..errors import ConfigError, PlatformFault
from ..runtime import container
from ..storage import open_store
from .base import ACCEPTED, Answer, BaseBackend, FailedCall, Invocation

#: Seconds AWS Batch's own timeout allows past the call's timeout (the worker stops the call first).
TIMEOUT_GRACE_SECONDS = 60
#: AWS Batch refuses attempt durations below 60 s and retry attempts above 10.
_MIN_ATTEMPT_SECONDS = 60
_MAX_BATCH_ATTEMPTS = 10
#: Batch itself re-runs a child only when its host went away (a Spot reclaim); every other failure
#: goes back to the client, which owns retries.
_EVALUATE_ON_EXIT = [
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},
]
_THROTTLING = {
    "TooManyRequestsException",
    "ThrottlingException",
    "Throttling",
    "RequestLimitExceeded",
}
_TERMINAL = {"SUCCEEDED", "FAILED"}


def plan_arrays(n: int, limit: int = container.MAX_ARRAY_SIZE) -> list[tuple[int, int]]:
    """Split ``n`` calls into ``(start, size)`` array jobs of at most ``limit``, as even as can be.

    Even parts keep every part an array (AWS Batch wants 2..10,000 children),
    except for a job of a single call.
    """
    if n <= 0:
        return []
    parts = math.ceil(n / limit)
    base, extra = divmod(n, parts)
    plan, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        plan.append((start, size))
        start += size
    return plan


def container_overrides(config, memory: int | None = None) -> dict:
    """``resourceRequirements`` for the job's GPUs and ``memory`` (MiB, the calls' step of the
    job's ``memory``); empty when neither is set."""
    needs = []
    if config.gpu:
        needs.append({"type": "GPU", "value": str(config.gpu)})
    if memory:
        needs.append({"type": "MEMORY", "value": str(memory)})
    return {"resourceRequirements": needs} if needs else {}


def job_timeout(timeout: float | None) -> dict | None:
    if not timeout:
        return None
    return {
        "attemptDurationSeconds": max(
            _MIN_ATTEMPT_SECONDS, math.ceil(timeout + TIMEOUT_GRACE_SECONDS)
        )
    }


def retry_strategy(retries: int) -> dict:
    return {
        "attempts": max(1, min(_MAX_BATCH_ATTEMPTS, retries + 1)),
        "evaluateOnExit": _EVALUATE_ON_EXIT,
    }


def fault_for(
    job_id: str,
    status_reason: str | None,
    exit_code: int | None,
    reason: str | None,
    log_stream: str | None = None,
) -> PlatformFault:
    """What a failed child means: retried (server, crashed) or given up (rejected, timeout)."""
    detail = "; ".join(
        p
        for p in (
            status_reason,
            f"exit code {exit_code}" if exit_code is not None else "no exit code",
            reason,
            f"log stream {log_stream}" if log_stream else None,
        )
        if p
    )
    message = f"AWS Batch job {job_id} failed: {detail}"
    text = f"{status_reason or ''} {reason or ''}"
    if exit_code == container.EXIT_RETRY:
        return PlatformFault("server", message + " (an exception listed in retry_on; re-running)")
    if exit_code == container.EXIT_REJECTED:
        return PlatformFault("rejected", message)
    if "OutOfMemory" in text:  # retried one ``memory`` step up, if there is one
        return PlatformFault("out_of_memory", message)
    if "exceeded timeout" in text:
        return PlatformFault("timeout", message)
    if exit_code == container.EXIT_PLATFORM:
        return PlatformFault("server", message)
    return PlatformFault("crashed", message)


@dataclass
class _Submission:
    """One submitted (array) job and the calls its children run, by index."""

    batch_job_id: str
    job_id: str
    calls: list[tuple[int, int]]  # index -> (call_id, attempt)
    array: bool
    reported: set = field(default_factory=set)


class BatchBackend(BaseBackend):
    name = "batch"
    stops_attempts = True  # see BaseBackend: its stop_attempts stops a running call
    #: Each call is a container that is scheduled and started (tens of seconds).
    call_seconds = 60.0
    max_workers = 8
    fans_out = True
    watches_calls = True
    #: Seconds between two looks at job status (AWS Batch's API allows a few requests per second).
    status_interval = 5.0

    #: A child's request is signed at submission and may wait in the job queue: valid for a day.
    signature_lifetime = 24 * 3600.0

    def __init__(self, config):
        self.config = config
        self.store = open_store(config.storage_url)
        emulator = self._emulator = _offline_emulator(config)
        if emulator is not None:
            self.secret = emulator.secret.encode()
        self.client, self.endpoint, local = _batch_client(config, emulator)
        if not local and self.store.url.startswith("file://"):
            raise ConfigError(
                f"the batch backend runs calls in containers on {self.endpoint}, which cannot "
                f"read the local folder {self.store.url}: set storage='s3://bucket/prefix' "
                "(or FNMAP_STORAGE)"
            )
        self._submitted: dict[str, _Submission] = {}
        self._lock = threading.Lock()
        self._cancelled: set[str] = set()  # jobs whose array jobs cancel() terminated
        self._last_status = 0.0

    def usable(self) -> bool:
        """False once the embedded emulator running these jobs offline is gone: the client is replaced."""
        return self._emulator is None or self._emulator.alive()

    # -- submitting ------------------------------------------------------------

    def invoke(self, invocation: Invocation) -> Answer:
        return self.invoke_all([invocation])[0]

    def invoke_all(self, invocations: list[Invocation]) -> list[Answer]:
        by_job: dict[tuple, list[Invocation]] = {}
        for invocation in invocations:
            by_job.setdefault((invocation.request.job_id, invocation.memory), []).append(invocation)
        for (job_id, memory), calls in by_job.items():
            for start, size in plan_arrays(len(calls)):
                self._submit(job_id, calls[start : start + size], memory)
        return [ACCEPTED] * len(invocations)

    def _submit(self, job_id: str, calls: list[Invocation], memory: int | None) -> None:
        config = calls[0].config or self.config
        array_id = secrets.token_hex(4)
        prefix = container.request_prefix(job_id, array_id)
        self._write_requests(prefix, calls)
        request = {
            "jobName": f"fnmap-{job_id[:16]}-{array_id}",
            "jobQueue": config.job_queue,
            "jobDefinition": config.job_definition,
            "parameters": {"store": self.store.url, "prefix": prefix},
            "retryStrategy": retry_strategy(config.retries),
        }
        if len(calls) > 1:
            request["arrayProperties"] = {"size": len(calls)}
        if container_overrides(config, memory):
            request["containerOverrides"] = container_overrides(config, memory)
        if job_timeout(config.timeout):
            request["timeout"] = job_timeout(config.timeout)
        answer = self._call("submit_job", **request)
        submission = _Submission(
            answer["jobId"],
            job_id,
            [(c.request.call_id, c.request.attempt) for c in calls],
            len(calls) > 1,
        )
        with self._lock:
            self._submitted[submission.batch_job_id] = submission

    def _write_requests(self, prefix: str, calls: list[Invocation]) -> None:
        def put(index: int) -> None:
            data = container.pack_request(calls[index].signature, calls[index].body)
            self.store.put(container.request_key(prefix, index), data)

        try:
            if len(calls) == 1:
                put(0)
                return
            with ThreadPoolExecutor(
                min(16, len(calls)), thread_name_prefix="fnmap-batch-put"
            ) as pool:
                list(pool.map(put, range(len(calls))))
        except Exception as e:
            raise PlatformFault(
                "server", f"cannot write the requests under {self.store.url} {prefix}: {e!r}"
            ) from e

    # -- status ----------------------------------------------------------------

    def poll_failures(self) -> list[FailedCall]:
        now = time.monotonic()
        if now - self._last_status < self.status_interval:
            return []
        self._last_status = now
        with self._lock:
            pending = list(self._submitted.values())
        failures: list[FailedCall] = []
        for i in range(0, len(pending), 100):  # describe_jobs takes at most 100 ids
            part = {s.batch_job_id: s for s in pending[i : i + 100]}
            details = {d["jobId"]: d for d in self._call("describe_jobs", jobs=list(part))["jobs"]}
            for batch_job_id, submission in part.items():
                detail = details.get(batch_job_id)
                if detail is None:
                    failures.extend(
                        self._report(
                            submission,
                            range(len(submission.calls)),
                            PlatformFault("lost", f"AWS Batch no longer knows job {batch_job_id}"),
                        )
                    )
                    self._forget(batch_job_id)
                    continue
                failures.extend(self._failed_children(submission, detail))
                if detail["status"] in _TERMINAL:
                    self._forget(batch_job_id)
        return failures

    def _failed_children(self, submission: _Submission, detail: dict) -> list[FailedCall]:
        if not submission.array:
            if detail["status"] != "FAILED":
                return []
            return self._report(submission, [0], _fault_of(detail))
        summary = (detail.get("arrayProperties") or {}).get("statusSummary") or {}
        if (
            summary.get("FAILED", 0) <= len(submission.reported)
            and detail["status"] not in _TERMINAL
        ):
            return []
        failures: list[FailedCall] = []
        token = None
        while True:
            page = self._call(
                "list_jobs",
                arrayJobId=submission.batch_job_id,
                jobStatus="FAILED",
                **({"nextToken": token} if token else {}),
            )
            for child in page.get("jobSummaryList", []):
                index = (child.get("arrayProperties") or {}).get("index")
                if isinstance(index, int) and 0 <= index < len(submission.calls):
                    failures.extend(self._report(submission, [index], _fault_of(child)))
            token = page.get("nextToken")
            if not token:
                return failures

    def _report(self, submission: _Submission, indexes, fault: PlatformFault) -> list[FailedCall]:
        out = []
        for index in indexes:
            if index not in submission.reported:
                submission.reported.add(index)
                call_id, attempt = submission.calls[index]
                out.append(FailedCall(submission.job_id, call_id, attempt, fault))
        return out

    def cancel(self, job_id: str) -> None:
        """Terminate the job's array jobs (queued children are cancelled, running ones stopped),
        so an abandoned map stops paying for its containers."""
        with self._lock:  # still watched: poll_failures then reports the stopped calls as failed
            mine = [s for s in self._submitted.values() if s.job_id == job_id]
            self._cancelled.add(job_id)
        for submission in mine:
            self._call("terminate_job", jobId=submission.batch_job_id,
                       reason=f"cancelled by the fnmap client (job {job_id})")

    def stop_attempts(self, job_id: str, attempts: list[tuple[int, int]], secret: bytes) -> None:
        """Terminate the children running these attempts (``TerminateJob`` on ``arrayJobId:index``,
        or on the job itself for a one-call submission): their call is decided already."""
        wanted = set(attempts)
        with self._lock:
            if job_id in self._cancelled:  # cancel() terminated every child already, with its reason
                return
            targets = [
                f"{s.batch_job_id}:{index}" if s.array else s.batch_job_id
                for s in self._submitted.values() if s.job_id == job_id
                for index, call in enumerate(s.calls) if call in wanted
            ]
        for target in targets:
            self._call("terminate_job", jobId=target,
                       reason=f"stopped by the fnmap client: another attempt decided its call (job {job_id})")

    def _forget(self, batch_job_id: str) -> None:
        with self._lock:
            self._submitted.pop(batch_job_id, None)

    def close(self) -> None:
        self.client.close()  # its pooled connections; running array jobs go on in the cloud

    def _call(self, operation: str, **kwargs) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, operation)(**kwargs)
        except ClientError as e:
            error = e.response.get("Error", {})
            code, status = (
                error.get("Code", ""),
                e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0),
            )
            message = (
                f"AWS Batch {operation} at {self.endpoint} answered {code}: "
                f"{error.get('Message', e)}"
            )
            if code in _THROTTLING or status == 429:
                raise PlatformFault("throttled", message) from e
            if status >= 500:
                raise PlatformFault("server", message) from e
            fix = "" if "GPUs per child" in message else _FIX  # the refusal names its own fix
            raise PlatformFault("rejected", message + fix) from e
        except BotoCoreError as e:
            raise PlatformFault(
                "connection", f"cannot reach AWS Batch at {self.endpoint}: {e}"
            ) from e


_FIX = (
    " (is the job queue and job definition deployed? `fnmap deploy batch deploy` creates them; "
    "the job_queue and job_definition options name them)"
)


def _fault_of(job: dict) -> PlatformFault:
    """The fault of a failed job, from a JobDetail or a JobSummary."""
    box = job.get("container") or {}
    return fault_for(
        job["jobId"],
        job.get("statusReason"),
        box.get("exitCode"),
        box.get("reason"),
        box.get("logStreamName"),
    )


_offline_noted = False


def _offline_emulator(config):
    """The embedded emulator whose Batch API runs the container jobs, when ``gpu=`` chose this
    backend and there is no cloud configuration (no region, no Batch endpoint); else None.

    A backend named explicitly (``backend="batch"``) is never run offline: without a region or an
    endpoint it fails in :func:`_batch_client` with the fix.
    """
    global _offline_noted
    if not config.gpu_chose_backend or _cloud_configured(config):
        return None
    from ..config import endpoint_environment
    from .emulator import embedded_emulator

    emulator = embedded_emulator(config.workers, config.emulator_options, endpoint_environment(),
                                 secret=config.secret)
    if not _offline_noted:
        _offline_noted = True
        print(
            f"fnmap: no AWS region or Batch endpoint is configured, so the gpu={config.gpu} container jobs run "
            "as local processes on fnmap's embedded emulator. To run them on AWS Batch, set region=... "
            "(FNMAP_REGION or AWS_DEFAULT_REGION) or AWS_ENDPOINT_URL_BATCH, or pass backend='batch'.",
            file=sys.stderr, flush=True,
        )
    return emulator


def _cloud_configured(config) -> bool:
    """A Batch endpoint, or a region from any source boto3 reads (keyword, environment, profile)."""
    if os.environ.get("AWS_ENDPOINT_URL_BATCH") or os.environ.get("AWS_ENDPOINT_URL"):
        return True
    if config.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        return True
    import boto3

    return boto3.Session().region_name is not None


def _batch_client(config, emulator=None):
    """A boto3 Batch client from boto3's settings, or for ``emulator`` (an embedded one, signing with
    its credentials); returns ``(client, endpoint, is_loopback)``."""
    import boto3
    from botocore.config import Config as BotoConfig

    # AWS_REGION is the SDKs' newer name; the botocore here reads only AWS_DEFAULT_REGION.
    session = boto3.Session(region_name=config.region or os.environ.get("AWS_REGION") or None)
    endpoint = emulator.url if emulator is not None else None
    extra: dict = {}
    if emulator is not None:
        env = emulator.aws_environment
        extra.update(endpoint_url=endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], aws_session_token=None)
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_BATCH") or os.environ.get("AWS_ENDPOINT_URL")
    local = bool(endpoint) and _is_loopback(endpoint)
    if session.region_name is None:
        if not local:
            raise ConfigError(
                "the batch backend needs an AWS region: set region=... (FNMAP_REGION) or "
                "AWS_DEFAULT_REGION, or set AWS_ENDPOINT_URL_BATCH to a local `fnmap emulator` "
                "to run container jobs offline"
            )
        extra["region_name"] = "us-east-1"
    if emulator is None and session.get_credentials() is None:
        if not local:
            raise ConfigError(
                "the batch backend found no AWS credentials: configure them as for the AWS CLI, "
                "or set "
                "AWS_ENDPOINT_URL_BATCH to a local `fnmap emulator` to run container jobs offline"
            )
        raise ConfigError(
            f"the batch backend found no AWS credentials for the emulator at {endpoint}: export the "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY that `fnmap emulator` printed when it started"
        )
    retries = BotoConfig(retries={"mode": "standard", "max_attempts": 8})
    client = session.client("batch", config=retries, **extra)
    return client, client.meta.endpoint_url, local


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
