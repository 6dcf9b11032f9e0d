"""AWS Batch, emulated: enough of its REST API for the ``batch`` backend and boto3's client.

Point boto3 here with ``AWS_ENDPOINT_URL_BATCH=http://127.0.0.1:PORT``.  Routes
(``POST``, JSON, as the real service): ``/v1/submitjob``, ``/v1/describejobs``,
``/v1/listjobs``, ``/v1/terminatejob``, ``/v1/canceljob``,
``/v1/registerjobdefinition``, ``/v1/describejobdefinitions``; any other operation is
answered 501 ``NotImplemented``, naming it.  Any job queue
name is accepted (the emulator is one local queue); job definition ``fnmap``
(revision 1) is registered from the start with the command the ``fnmap deploy
batch`` definition has, and the secret as a reference (``secrets``), never its
value.  Every request must be signed with SigV4 and credentials the emulator
knows (:mod:`.sigv4`), or it is refused with 403 and nothing runs.  Jobs run as local processes, at most
``FNMAP_BATCH_CONCURRENCY`` at once (default: CPU count); see
:mod:`fnmap.emulator.batch_jobs`.
"""

from __future__ import annotations

import functools
import os
import re
import threading

from flask import jsonify, request

from . import sigv4
from .batch_jobs import ARN, TERMINAL, BatchEmulator, BatchJob, BatchRequestError, Child, command_for, detect_gpus
from .routes import add_routes

CONCURRENCY_ENV = "FNMAP_BATCH_CONCURRENCY"
#: Every Batch API path: each request to one must carry a valid SigV4 signature.
API_PATH = re.compile(r"/v1/")


def job_detail(job: BatchJob, child: Child | None) -> dict:
    """A ``JobDetail``: of an array parent when ``child`` is None."""
    out = {
        "jobArn": f"{ARN}:job/{job.id}",
        "jobName": job.name,
        "jobQueue": job.queue,
        "jobDefinition": job.definition["jobDefinitionArn"],
        "parameters": job.parameters,
        "createdAt": job.created,
        "retryStrategy": job.retry,
        "timeout": job.timeout or None,
        "container": {
            "image": job.definition["containerProperties"].get("image"),
            "command": command_for(job.command, job.parameters)[1:],
            "resourceRequirements": job.resources,
        },
    }
    if child is None:  # an array parent
        counts = {s: 0 for s in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", *TERMINAL)}
        for c in job.children:
            counts[c.status] += 1
        starts = [c.started for c in job.children if c.started]
        stops = [c.stopped for c in job.children if c.stopped]
        status = job.status()
        out.update(jobId=job.id, status=status, startedAt=min(starts) if starts else None,
                   stoppedAt=max(stops) if status in TERMINAL and stops else None,
                   arrayProperties={"size": len(job.children), "statusSummary": counts})
        return {k: v for k, v in out.items() if v is not None}
    out.update(jobId=job.child_id(child), status=child.status, statusReason=child.status_reason,
               startedAt=child.started, stoppedAt=child.stopped, attempts=child.attempts)
    out["container"].update(exitCode=child.exit_code, reason=child.reason, logStreamName=child.log)
    out["container"] = {k: v for k, v in out["container"].items() if v is not None}
    if child.index is not None:
        out["arrayProperties"] = {"index": child.index}
    return {k: v for k, v in out.items() if v is not None}


def _summary(detail: dict) -> dict:
    keep = ("jobArn", "jobId", "jobName", "createdAt", "status", "statusReason", "startedAt", "stoppedAt",
            "arrayProperties", "jobDefinition")
    out = {k: detail[k] for k in keep if k in detail}
    box = {k: detail["container"][k] for k in ("exitCode", "reason") if k in detail.get("container", {})}
    if box:
        out["container"] = box
    return out


class _Batch:
    """The :class:`BatchEmulator`, started on the first Batch request: other uses pay nothing."""

    def __init__(self, emulator, concurrency: int):
        self._emulator, self._concurrency = emulator, concurrency
        self._started: BatchEmulator | None = None
        self._lock = threading.Lock()

    def get(self) -> BatchEmulator:
        with self._lock:
            if self._started is None:
                env = dict(getattr(self._emulator.pool, "env", None) or os.environ)
                self._started = BatchEmulator(env, self._concurrency, detect_gpus(env))
            return self._started


def register(app, emulator) -> None:
    """Add the Batch routes to the emulator's app."""
    raw = os.environ.get(CONCURRENCY_ENV) or str(os.cpu_count() or 2)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{CONCURRENCY_ENV}={raw!r} (from the environment) must be a whole number >= 1")
    sigv4.require_signatures(app, sigv4.known_credentials(app, emulator), API_PATH, "batch")
    add_routes(app, ROUTES, _Batch(emulator, int(raw)))


def _operation(handler):
    """A route answering ``handler(batch, request body)`` as JSON, a BatchRequestError as Batch's 400."""

    def view(state: _Batch):
        try:
            return jsonify(handler(state.get(), request.get_json(force=True, silent=True) or {}))
        except BatchRequestError as e:
            response = jsonify({"message": str(e)})
            response.status_code = 400
            response.headers["x-amzn-ErrorType"] = "ClientException"
            return response

    view.__name__ = f"batch_{handler.__name__}"
    return view


def submit_job(batch, body):
    job = batch.submit(body)
    return {"jobArn": f"{ARN}:job/{job.id}", "jobName": job.name, "jobId": job.id}


def describe_jobs(batch, body):
    ids = body.get("jobs") or []
    if len(ids) > 100:
        raise BatchRequestError("at most 100 jobs can be described at once")
    return {"jobs": [job_detail(*found) for found in map(batch.find, ids) if found is not None]}


def _listed(batch, body) -> list[dict]:
    if body.get("arrayJobId"):
        found = batch.find(body["arrayJobId"])
        if found is None or not found[0].array:
            raise BatchRequestError(f"{body['arrayJobId']} is not an array job")
        return [job_detail(found[0], c) for c in found[0].children]
    if body.get("jobQueue"):
        return [job_detail(j, None if j.array else j.children[0])
                for j in list(batch.jobs.values()) if j.queue == body["jobQueue"]]
    raise BatchRequestError("jobQueue or arrayJobId must be provided")


def list_jobs(batch, body):
    status = body.get("jobStatus") or "RUNNING"
    rows = [_summary(r) for r in _listed(batch, body) if r["status"] == status]
    start, size = int(body.get("nextToken") or 0), int(body.get("maxResults") or 100)
    page = {"jobSummaryList": rows[start : start + size]}
    if start + size < len(rows):
        page["nextToken"] = str(start + size)
    return page


def _stop(batch, body, running_too: bool):
    if not body.get("jobId") or not body.get("reason"):
        raise BatchRequestError("jobId and reason must be provided")
    batch.terminate(body["jobId"], body["reason"], running_too)
    return {}


def terminate_job(batch, body):
    return _stop(batch, body, running_too=True)


def cancel_job(batch, body):
    return _stop(batch, body, running_too=False)


def describe_job_definitions(batch, body):
    found = [d for revisions in batch.definitions.values() for d in revisions]
    if body.get("jobDefinitionName"):
        found = [d for d in found if d["jobDefinitionName"] == body["jobDefinitionName"]]
    if body.get("jobDefinitions"):
        wanted = set(body["jobDefinitions"])
        found = [d for d in found
                 if d["jobDefinitionArn"] in wanted or f"{d['jobDefinitionName']}:{d['revision']}" in wanted]
    if body.get("status"):
        found = [d for d in found if d["status"] == body["status"]]
    return {"jobDefinitions": found}


def batch_unsupported(state: _Batch, operation: str):
    """Any other Batch API operation (compute environments, job queues...): 501 naming it, so that a
    caller (``fnmap deploy batch``) can tell "not served here" from "not found"."""
    name = _operation_names().get(f"/v1/{operation}", f"POST /v1/{operation}")
    response = jsonify({"message": (
        f"the fnmap emulator does not support the Batch operation {name}; it serves "
        f"{', '.join(_operation_names()[path] for _m, path, _h in ROUTES if path in _operation_names())}, with "
        "the job definition fnmap built in and any job queue name. Use AWS itself for the rest")})
    response.status_code = 501
    response.headers["x-amzn-ErrorType"] = "NotImplemented"
    return response


@functools.lru_cache(maxsize=1)
def _operation_names() -> dict[str, str]:
    """Batch's request paths and their operation names (``/v1/submitjob``: ``SubmitJob``), from botocore."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("batch")
    return {model.operation_model(name).http["requestUri"]: name for name in model.operation_names}


def register_job_definition(batch, body):
    d = batch.register_definition(body)
    return {"jobDefinitionName": d["jobDefinitionName"], "jobDefinitionArn": d["jobDefinitionArn"],
            "revision": d["revision"]}


#: The Batch API's routes (botocore's paths: every operation a POST with a JSON body).
ROUTES = [
    ("POST", "/v1/submitjob", _operation(submit_job)),
    ("POST", "/v1/describejobs", _operation(describe_jobs)),
    ("POST", "/v1/listjobs", _operation(list_jobs)),
    ("POST", "/v1/terminatejob", _operation(terminate_job)),
    ("POST", "/v1/canceljob", _operation(cancel_job)),
    ("POST", "/v1/registerjobdefinition", _operation(register_job_definition)),
    ("POST", "/v1/describejobdefinitions", _operation(describe_job_definitions)),
    ("POST", "/v1/<operation>", batch_unsupported),
]
