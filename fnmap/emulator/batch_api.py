"""AWS Batch, emulated: enough of its REST API for the ``batch`` backend and ``boto3.client("batch")``.

Point boto3 here with ``AWS_ENDPOINT_URL_BATCH=http://127.0.0.1:PORT``.  Routes
(``POST``, JSON, as the real service): ``/v1/submitjob``, ``/v1/describejobs``,
``/v1/listjobs``, ``/v1/terminatejob``, ``/v1/canceljob``,
``/v1/registerjobdefinition``, ``/v1/describejobdefinitions``.  Any job queue
name is accepted (the emulator is one local queue); job definition ``fnmap``
(revision 1) is registered from the start with the command the ``fnmap deploy
batch`` definition has.

Each child of an array job runs as a local process: the definition's command
(``python`` becomes this interpreter) with ``Ref::`` parameters substituted,
``AWS_BATCH_JOB_ARRAY_INDEX`` and the other ``AWS_BATCH_*`` variables set, so
the same ``handlers/container.py`` entrypoint runs as in the cloud.  At most
``FNMAP_BATCH_CONCURRENCY`` children (default: CPU count) run at once.  GPUs
found by ``nvidia-smi -L`` are handed out round-robin through
``CUDA_VISIBLE_DEVICES`` to children that ask for GPUs; children that do not,
and every child on a machine without GPUs, get ``CUDA_VISIBLE_DEVICES=""``.
The attempt timeout and the retry strategy (``evaluateOnExit`` globs included)
are honoured; a child's output goes to a log file named by ``logStreamName``,
and the last line of a failed child's output becomes its ``container.reason``.
"""

from __future__ import annotations

import atexit
import fnmatch
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from flask import jsonify, request

from ..container import COMMAND, MAX_ARRAY_SIZE

CONCURRENCY_ENV = "FNMAP_BATCH_CONCURRENCY"
_ARN = "arn:aws:batch:us-east-1:000000000000"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_TERMINAL = ("SUCCEEDED", "FAILED")
_TIMED_OUT = "Job attempt duration exceeded timeout"


class BatchApiError(Exception):
    """Answered as AWS Batch's ``ClientException`` (HTTP 400)."""


def parse_gpu_list(text: str) -> list[str]:
    """GPU indices from ``nvidia-smi -L`` output (``GPU 0: NVIDIA H200 (UUID: ...)``)."""
    return re.findall(r"^GPU (\d+):", text, flags=re.MULTILINE)


def detect_gpus(environ=os.environ) -> list[str]:
    """The GPUs this machine has, limited to ``CUDA_VISIBLE_DEVICES`` when that is set; [] without any."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = parse_gpu_list(out.stdout) if out.returncode == 0 else []
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        allowed = [v.strip() for v in visible.split(",") if v.strip()]
        gpus = [g for g in gpus if g in allowed]
    return gpus


def assign_gpus(slot: int, wanted: int, gpus: list[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the ``slot``-th child launched: ``wanted`` GPUs, round-robin.

    No GPUs wanted, or none on this machine: ``""`` (the child sees none and runs on the CPU).
    """
    if wanted <= 0 or not gpus:
        return ""
    if wanted > len(gpus):
        raise ValueError(f"the job asks for {wanted} GPUs per child but this machine has {len(gpus)}")
    start = slot * wanted
    return ",".join(gpus[(start + j) % len(gpus)] for j in range(wanted))


def command_for(command: list[str], parameters: dict) -> list[str]:
    """Substitute ``Ref::name`` parameters; the image's ``python`` is this interpreter."""
    out = [str(parameters.get(a[5:], a)) if a.startswith("Ref::") else a for a in command]
    if out and out[0] in ("python", "python3"):
        out[0] = sys.executable
    return out


def retry_action(rules: list[dict], exit_code: int | None, status_reason: str, reason: str) -> str:
    """``RETRY`` or ``EXIT`` for a failed attempt, by the first matching ``evaluateOnExit`` rule."""
    if not rules:
        return "RETRY"
    for rule in rules:
        checks = [(rule.get("onExitCode"), "" if exit_code is None else str(exit_code)),
                  (rule.get("onStatusReason"), status_reason or ""), (rule.get("onReason"), reason or "")]
        if all(pattern is None or fnmatch.fnmatchcase(value, pattern) for pattern, value in checks):
            return str(rule.get("action", "EXIT")).upper()
    return "EXIT"


class _Child:
    __slots__ = ("index", "status", "status_reason", "started", "stopped", "exit_code", "reason",
                 "log", "attempts", "proc", "terminate")

    def __init__(self, index: int | None):
        self.index = index
        self.status = "RUNNABLE"
        self.status_reason = self.reason = None
        self.started = self.stopped = self.exit_code = self.log = self.proc = self.terminate = None
        self.attempts: list[dict] = []


class _Job:
    def __init__(self, spec: dict, definition: dict):
        self.id = str(uuid.uuid4())
        self.name, self.queue, self.definition = spec["jobName"], spec["jobQueue"], definition
        self.created = _now_ms()
        self.parameters = {**definition.get("parameters", {}), **(spec.get("parameters") or {})}
        props, overrides = definition["containerProperties"], spec.get("containerOverrides") or {}
        self.command = overrides.get("command") or props["command"]
        self.environment = {e["name"]: e["value"] for e in props.get("environment", [])}
        self.environment.update({e["name"]: e["value"] for e in overrides.get("environment", [])})
        needs = {r["type"]: r["value"] for r in props.get("resourceRequirements", [])}
        needs.update({r["type"]: r["value"] for r in overrides.get("resourceRequirements", [])})
        self.resources = [{"type": k, "value": v} for k, v in needs.items()]
        self.gpus = int(needs.get("GPU", 0))
        self.retry = spec.get("retryStrategy") or definition.get("retryStrategy") or {"attempts": 1}
        self.timeout = spec.get("timeout") or definition.get("timeout") or {}
        size = (spec.get("arrayProperties") or {}).get("size")
        self.array = size is not None
        self.children = [_Child(i) for i in range(size)] if self.array else [_Child(None)]

    def child_id(self, child: _Child) -> str:
        return self.id if child.index is None else f"{self.id}:{child.index}"

    def status(self) -> str:
        states = [c.status for c in self.children]
        if all(s in _TERMINAL for s in states):
            return "FAILED" if "FAILED" in states else "SUCCEEDED"
        return "RUNNING" if "RUNNING" in states or any(s in _TERMINAL for s in states) else "RUNNABLE"


class BatchEmulator:
    """The jobs, job definitions and runner threads behind the routes."""

    def __init__(self, env: dict, concurrency: int, gpus: list[str]):
        self.env, self.gpus, self.concurrency = env, gpus, concurrency
        self.jobs: dict[str, _Job] = {}
        self.definitions: dict[str, list[dict]] = {}
        self.logs = tempfile.mkdtemp(prefix="fnmap-batch-logs-")
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._launched = 0
        self._closed = False
        self.register_definition({
            "jobDefinitionName": "fnmap", "type": "container",
            "containerProperties": {"image": "fnmap-gpu (emulated: this machine's Python)", "command": COMMAND,
                                    "resourceRequirements": [{"type": "VCPU", "value": "1"},
                                                             {"type": "MEMORY", "value": "2048"}]},
        })
        for _ in range(concurrency):
            threading.Thread(target=self._runner, name="fnmap-batch-runner", daemon=True).start()
        atexit.register(self.close)

    # -- job definitions ---------------------------------------------------------

    def register_definition(self, spec: dict) -> dict:
        name = spec.get("jobDefinitionName") or ""
        if not _NAME.match(name):
            raise BatchApiError(f"jobDefinitionName {name!r} must be 1-128 letters, digits, - or _")
        if spec.get("type") != "container" or not (spec.get("containerProperties") or {}).get("command"):
            raise BatchApiError("the emulator runs container job definitions with a command only")
        with self._lock:
            revisions = self.definitions.setdefault(name, [])
            definition = {**spec, "revision": len(revisions) + 1, "status": "ACTIVE",
                          "jobDefinitionArn": f"{_ARN}:job-definition/{name}:{len(revisions) + 1}"}
            revisions.append(definition)
        return definition

    def find_definition(self, ref: str) -> dict:
        name, _, revision = ref.rsplit("/", 1)[-1].partition(":")
        active = [d for d in self.definitions.get(name, []) if d["status"] == "ACTIVE"]
        if revision:
            active = [d for d in active if str(d["revision"]) == revision]
        if not active:
            known = ", ".join(sorted(self.definitions)) or "none"
            raise BatchApiError(f"Job definition {ref} does not exist (the emulator knows: {known})")
        return active[-1]

    # -- jobs --------------------------------------------------------------------

    def submit(self, spec: dict) -> _Job:
        for key in ("jobName", "jobQueue", "jobDefinition"):
            if not spec.get(key):
                raise BatchApiError(f"{key} must be provided")
        if not _NAME.match(spec["jobName"]):
            raise BatchApiError(f"jobName {spec['jobName']!r} must be 1-128 letters, digits, - or _")
        size = (spec.get("arrayProperties") or {}).get("size")
        if size is not None and not (isinstance(size, int) and 2 <= size <= MAX_ARRAY_SIZE):
            raise BatchApiError(f"array size {size!r} must be between 2 and {MAX_ARRAY_SIZE}")
        if (spec.get("timeout") or {}).get("attemptDurationSeconds", 60) < 60:
            raise BatchApiError("timeout.attemptDurationSeconds must be at least 60")
        job = _Job(spec, self.find_definition(spec["jobDefinition"]))
        if not 1 <= int(job.retry.get("attempts", 1)) <= 10:
            raise BatchApiError("retryStrategy.attempts must be between 1 and 10")
        with self._lock:
            self.jobs[job.id] = job
        for child in job.children:
            self._queue.put((job, child))
        return job

    def find(self, job_id: str) -> tuple[_Job, _Child | None] | None:
        parent, _, index = job_id.partition(":")
        job = self.jobs.get(parent)
        if job is None:
            return None
        if not index:
            return job, None if job.array else job.children[0]
        if not job.array or not index.isdigit() or int(index) >= len(job.children):
            return None
        return job, job.children[int(index)]

    def terminate(self, job_id: str, reason: str, running_too: bool) -> None:
        found = self.find(job_id)
        if found is None:
            raise BatchApiError(f"Job {job_id} does not exist")
        job, child = found
        for c in ([child] if child is not None else job.children):
            with self._lock:
                if c.status in _TERMINAL or (c.status == "RUNNING" and not running_too):
                    continue
                c.terminate = reason
                if c.status == "RUNNABLE":
                    c.status, c.status_reason, c.stopped = "FAILED", reason, _now_ms()
                elif c.proc is not None:
                    c.proc.kill()

    # -- running -----------------------------------------------------------------

    def _runner(self) -> None:
        while not self._closed:
            job, child = self._queue.get()
            if child.status == "RUNNABLE" and not self._closed:
                self._run(job, child)

    def _run(self, job: _Job, child: _Child) -> None:
        with self._lock:
            slot, self._launched = self._launched, self._launched + 1
            child.status, child.started = "RUNNING", _now_ms()
        child.log = os.path.join(self.logs, job.child_id(child).replace(":", "-") + ".log")
        try:
            gpus = assign_gpus(slot, job.gpus, self.gpus)
        except ValueError as e:
            return self._finish(child, "FAILED", f"CannotStartContainerError: {e}", None, None)
        env = {**self.env, **job.environment, "CUDA_VISIBLE_DEVICES": gpus, "AWS_BATCH_JOB_ID": job.child_id(child),
               "AWS_BATCH_JQ_NAME": job.queue, "AWS_BATCH_CE_NAME": "fnmap-emulator"}
        if child.index is not None:
            env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(child.index)
        attempts, limit = int(job.retry.get("attempts", 1)), job.timeout.get("attemptDurationSeconds")
        for attempt in range(1, attempts + 1):
            env["AWS_BATCH_JOB_ATTEMPT"] = str(attempt)
            code, status_reason, reason = self._attempt(job, child, env, limit)
            child.attempts.append({"startedAt": child.started, "stoppedAt": _now_ms(), "statusReason": status_reason,
                                   "container": {"exitCode": code, "reason": reason, "logStreamName": child.log}})
            if code == 0:
                return self._finish(child, "SUCCEEDED", "Essential container in task exited", code, reason)
            last = child.terminate or attempt == attempts
            if last or retry_action(job.retry.get("evaluateOnExit", []), code, status_reason, reason) != "RETRY":
                return self._finish(child, "FAILED", child.terminate or status_reason, code, reason)

    def _attempt(self, job: _Job, child: _Child, env: dict, limit: int | None):
        command = command_for(job.command, job.parameters)
        with open(child.log, "ab") as log:
            try:
                proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            except OSError as e:
                return None, f"CannotStartContainerError: {e}", str(e)[:255]
            with self._lock:
                child.proc = proc
            try:
                code, status_reason = proc.wait(timeout=limit), "Essential container in task exited"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code, status_reason = None, _TIMED_OUT
            with self._lock:
                child.proc = None
        if code is not None and code < 0:  # killed by a signal: what a container runtime reports
            code = 128 - code
        return code, status_reason, (_last_line(child.log) if code != 0 else None)

    def _finish(self, child: _Child, status: str, status_reason: str | None, code, reason) -> None:
        with self._lock:
            child.status, child.status_reason, child.stopped = status, status_reason, _now_ms()
            child.exit_code, child.reason = code, reason

    def close(self) -> None:
        """Stop launching children, kill the running ones and remove their logs."""
        self._closed = True
        with self._lock:
            procs = [c.proc for j in self.jobs.values() for c in j.children if c.proc is not None]
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()
        shutil.rmtree(self.logs, ignore_errors=True)

    # -- answers -----------------------------------------------------------------

    def detail(self, job: _Job, child: _Child | None) -> dict:
        out = {
            "jobArn": f"{_ARN}:job/{job.id}", "jobName": job.name, "jobQueue": job.queue,
            "jobDefinition": job.definition["jobDefinitionArn"], "parameters": job.parameters,
            "createdAt": job.created, "retryStrategy": job.retry, "timeout": job.timeout or None,
            "container": {"image": job.definition["containerProperties"].get("image"),
                          "command": command_for(job.command, job.parameters)[1:],
                          "resourceRequirements": job.resources},
        }
        if child is None:  # an array parent
            counts = {s: 0 for s in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", *_TERMINAL)}
            for c in job.children:
                counts[c.status] += 1
            starts = [c.started for c in job.children if c.started]
            stops = [c.stopped for c in job.children if c.stopped]
            status = job.status()
            out.update(jobId=job.id, status=status, startedAt=min(starts) if starts else None,
                       stoppedAt=max(stops) if status in _TERMINAL and stops else None,
                       arrayProperties={"size": len(job.children), "statusSummary": counts})
            return {k: v for k, v in out.items() if v is not None}
        out.update(jobId=job.child_id(child), status=child.status, statusReason=child.status_reason,
                   startedAt=child.started, stoppedAt=child.stopped, attempts=child.attempts)
        out["container"].update(exitCode=child.exit_code, reason=child.reason, logStreamName=child.log)
        out["container"] = {k: v for k, v in out["container"].items() if v is not None}
        if child.index is not None:
            out["arrayProperties"] = {"index": child.index}
        return {k: v for k, v in out.items() if v is not None}


def _now_ms() -> int:
    return int(time.time() * 1000)


def _last_line(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1][:255] if lines else None


def _summary(detail: dict) -> dict:
    keep = ("jobArn", "jobId", "jobName", "createdAt", "status", "statusReason", "startedAt", "stoppedAt",
            "arrayProperties", "jobDefinition")
    out = {k: detail[k] for k in keep if k in detail}
    box = {k: detail["container"][k] for k in ("exitCode", "reason") if k in detail.get("container", {})}
    if box:
        out["container"] = box
    return out


def register(app, emulator) -> None:
    """Add the Batch routes to the emulator's app."""
    raw = os.environ.get(CONCURRENCY_ENV) or str(os.cpu_count() or 2)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{CONCURRENCY_ENV}={raw!r} (from the environment) must be a whole number >= 1")
    started: list[BatchEmulator] = []
    lock = threading.Lock()

    def get() -> BatchEmulator:  # started on the first Batch request: other uses pay nothing
        with lock:
            if not started:
                env = dict(getattr(emulator.pool, "env", None) or os.environ)
                started.append(BatchEmulator(env, int(raw), detect_gpus(env)))
            return started[0]

    def route(name, handler):
        def view():
            try:
                return jsonify(handler(get(), request.get_json(force=True, silent=True) or {}))
            except BatchApiError as e:
                response = jsonify({"message": str(e)})
                response.status_code = 400
                response.headers["x-amzn-ErrorType"] = "ClientException"
                return response

        app.add_url_rule(f"/v1/{name}", f"batch_{name}", view, methods=["POST"])

    def submit(batch, body):
        job = batch.submit(body)
        return {"jobArn": f"{_ARN}:job/{job.id}", "jobName": job.name, "jobId": job.id}

    def describe(batch, body):
        ids = body.get("jobs") or []
        if len(ids) > 100:
            raise BatchApiError("at most 100 jobs can be described at once")
        return {"jobs": [batch.detail(*found) for found in map(batch.find, ids) if found is not None]}

    def list_jobs(batch, body):
        if body.get("arrayJobId"):
            found = batch.find(body["arrayJobId"])
            if found is None or not found[0].array:
                raise BatchApiError(f"{body['arrayJobId']} is not an array job")
            rows = [batch.detail(found[0], c) for c in found[0].children]
        elif body.get("jobQueue"):
            rows = [batch.detail(j, None if j.array else j.children[0])
                    for j in list(batch.jobs.values()) if j.queue == body["jobQueue"]]
        else:
            raise BatchApiError("jobQueue or arrayJobId must be provided")
        status = body.get("jobStatus") or "RUNNING"
        rows = [_summary(r) for r in rows if r["status"] == status]
        start, size = int(body.get("nextToken") or 0), int(body.get("maxResults") or 100)
        page = {"jobSummaryList": rows[start:start + size]}
        if start + size < len(rows):
            page["nextToken"] = str(start + size)
        return page

    def stop(running_too):
        def handler(batch, body):
            if not body.get("jobId") or not body.get("reason"):
                raise BatchApiError("jobId and reason must be provided")
            batch.terminate(body["jobId"], body["reason"], running_too)
            return {}

        return handler

    def definitions(batch, body):
        found = [d for revisions in batch.definitions.values() for d in revisions]
        if body.get("jobDefinitionName"):
            found = [d for d in found if d["jobDefinitionName"] == body["jobDefinitionName"]]
        if body.get("jobDefinitions"):
            wanted = set(body["jobDefinitions"])
            found = [d for d in found if d["jobDefinitionArn"] in wanted
                     or f"{d['jobDefinitionName']}:{d['revision']}" in wanted]
        if body.get("status"):
            found = [d for d in found if d["status"] == body["status"]]
        return {"jobDefinitions": found}

    def register_definition(batch, body):
        d = batch.register_definition(body)
        return {"jobDefinitionName": d["jobDefinitionName"], "jobDefinitionArn": d["jobDefinitionArn"],
                "revision": d["revision"]}

    route("submitjob", submit)
    route("describejobs", describe)
    route("listjobs", list_jobs)
    route("terminatejob", stop(running_too=True))
    route("canceljob", stop(running_too=False))
    route("registerjobdefinition", register_definition)
    route("describejobdefinitions", definitions)
