"""Container jobs on this machine: the state and the runner behind the emulated AWS Batch API.

Each child of an array job runs as a local process: the job definition's
command (``python`` becomes this interpreter) with ``Ref::`` parameters
substituted and ``AWS_BATCH_JOB_ARRAY_INDEX`` and the other ``AWS_BATCH_*``
variables set, so the same ``handlers/container.py`` entrypoint runs as in the
cloud.  At most ``concurrency`` children run at once.  The GPUs found by
``nvidia-smi -L`` are lent, not shared (:class:`Devices`): a child asking for
``n`` GPUs waits, RUNNABLE, until ``n`` are free and then sees only those in
``CUDA_VISIBLE_DEVICES``, so at most ``GPUs // n`` such children run at once;
a job asking for more GPUs per child than the machine has is refused at
submission (``ClientException``).  Children that ask for no GPU, and every
child on a machine without GPUs (the CPU rehearsal), get
``CUDA_VISIBLE_DEVICES=""``.  Memory (``MEMORY``, MiB) is enforced: a child
whose resident memory goes past it is killed and fails with AWS Batch's
``OutOfMemoryError: Container killed due to memory usage``.  The attempt timeout
and the retry strategy (``evaluateOnExit`` globs included) are honoured; a
child's output goes to a log file named by ``logStreamName``, and the last
line of a failed child's output becomes its ``container.reason``.  A job
definition's ``secrets`` (``{name, valueFrom}``) are resolved from the emulated
Secrets Manager when a child starts (the built-in definition's ``FNMAP_SECRET``
is one), so no answer of the API carries the value.
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

from ..runtime.container import COMMAND, MAX_ARRAY_SIZE
from ..runtime.signing import SECRET_ENV
from .batch_devices import Devices, detect_gpus, visible_gpus
from .memlimit import MemoryWatch

#: detect_gpus and visible_gpus: what the Batch API and tests reach here.
__all__ = ["BatchEmulator", "BatchRequestError", "Devices", "detect_gpus", "visible_gpus"]

ARN = "arn:aws:batch:us-east-1:000000000000"
#: Where the built-in job definition's ``secrets`` take ``FNMAP_SECRET`` from (an emulated Secrets
#: Manager secret): DescribeJobDefinitions shows this reference, never the value.
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:000000000000:secret:fnmap-emulator-secret"
TERMINAL = ("SUCCEEDED", "FAILED")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_TIMED_OUT = "Job attempt duration exceeded timeout"
_OUT_OF_MEMORY = "OutOfMemoryError: Container killed due to memory usage"


class BatchRequestError(Exception):
    """Answered as AWS Batch's ``ClientException`` (HTTP 400)."""


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


class Child:
    __slots__ = ("index", "status", "status_reason", "started", "stopped", "exit_code", "reason", "log", "attempts",
                 "proc", "terminate")

    def __init__(self, index: int | None):
        self.index = index
        self.status = "RUNNABLE"
        self.status_reason = self.reason = None
        self.started = self.stopped = self.exit_code = self.log = self.proc = self.terminate = None
        self.attempts: list[dict] = []


class BatchJob:
    """One job submitted to the emulated AWS Batch: its definition, overrides and array children."""

    def __init__(self, spec: dict, definition: dict):
        self.id = str(uuid.uuid4())
        self.name, self.queue, self.definition = spec["jobName"], spec["jobQueue"], definition
        self.created = _now_ms()
        self.parameters = {**definition.get("parameters", {}), **(spec.get("parameters") or {})}
        props, overrides = definition["containerProperties"], spec.get("containerOverrides") or {}
        self.command = overrides.get("command") or props["command"]
        self.environment = {e["name"]: e["value"] for e in props.get("environment", [])}
        self.environment.update({e["name"]: e["value"] for e in overrides.get("environment", [])})
        #: ``{variable: valueFrom}``: resolved when a child starts, as Batch's ``secrets`` are.
        self.secrets = {s["name"]: s["valueFrom"] for s in props.get("secrets", [])}
        needs = {r["type"]: r["value"] for r in props.get("resourceRequirements", [])}
        needs.update({r["type"]: r["value"] for r in overrides.get("resourceRequirements", [])})
        self.resources = [{"type": k, "value": v} for k, v in needs.items()]
        self.gpus = int(needs.get("GPU", 0))
        memory = str(needs.get("MEMORY", ""))
        self.memory_mb = int(memory) if memory.isdigit() and int(memory) > 0 else None
        self.retry = spec.get("retryStrategy") or definition.get("retryStrategy") or {"attempts": 1}
        self.timeout = spec.get("timeout") or definition.get("timeout") or {}
        size = (spec.get("arrayProperties") or {}).get("size")
        self.array = size is not None
        self.children = [Child(i) for i in range(size)] if self.array else [Child(None)]

    def child_id(self, child: Child) -> str:
        return self.id if child.index is None else f"{self.id}:{child.index}"

    def status(self) -> str:
        states = [c.status for c in self.children]
        if all(s in TERMINAL for s in states):
            return "FAILED" if "FAILED" in states else "SUCCEEDED"
        return "RUNNING" if "RUNNING" in states or any(s in TERMINAL for s in states) else "RUNNABLE"


class BatchEmulator:
    """The jobs, job definitions and runner threads behind the routes."""

    def __init__(self, env: dict, concurrency: int, gpus: list[str]):
        # A child sees the machine's environment and what its job definition sets, not the emulator's
        # secret: a job definition that `fnmap deploy batch` registered without it must fail here as it
        # would on AWS.  The emulator's own definition ("fnmap") names the secret in its ``secrets``.
        self.env = {k: v for k, v in env.items() if k != SECRET_ENV}
        self.devices, self.concurrency = Devices(gpus), concurrency
        secret = env.get(SECRET_ENV)
        #: The emulated Secrets Manager: ``valueFrom`` -> value, for the job definitions' ``secrets``.
        self.secret_values = {SECRET_ARN: secret} if secret else {}
        self.jobs: dict[str, BatchJob] = {}
        self.definitions: dict[str, list[dict]] = {}
        self.logs = tempfile.mkdtemp(prefix="fnmap-batch-logs-")
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self.register_definition({"jobDefinitionName": "fnmap", "type": "container", "containerProperties": {
            "image": "fnmap-gpu (emulated: this machine's Python)", "command": COMMAND,
            "secrets": [{"name": SECRET_ENV, "valueFrom": SECRET_ARN}] if secret else [],
            "resourceRequirements": [{"type": "VCPU", "value": "1"}, {"type": "MEMORY", "value": "2048"}]}})
        for _ in range(concurrency):
            threading.Thread(target=self._runner, name="fnmap-batch-runner", daemon=True).start()
        atexit.register(self.close)

    # -- job definitions ---------------------------------------------------------

    def register_definition(self, spec: dict) -> dict:
        name = spec.get("jobDefinitionName") or ""
        if not _NAME.match(name):
            raise BatchRequestError(f"jobDefinitionName {name!r} must be 1-128 letters, digits, - or _")
        if spec.get("type") != "container" or not (spec.get("containerProperties") or {}).get("command"):
            raise BatchRequestError("the emulator runs container job definitions with a command only")
        for entry in spec["containerProperties"].get("secrets") or []:
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("valueFrom"), str)):
                raise BatchRequestError(f"secrets entry {entry!r} must be {{'name': ..., 'valueFrom': ARN}}")
        with self._lock:
            revisions = self.definitions.setdefault(name, [])
            definition = {
                **spec,
                "revision": len(revisions) + 1,
                "status": "ACTIVE",
                "jobDefinitionArn": f"{ARN}:job-definition/{name}:{len(revisions) + 1}",
            }
            revisions.append(definition)
        return definition

    def find_definition(self, ref: str) -> dict:
        name, _, revision = ref.rsplit("/", 1)[-1].partition(":")
        active = [d for d in self.definitions.get(name, []) if d["status"] == "ACTIVE"]
        if revision:
            active = [d for d in active if str(d["revision"]) == revision]
        if not active:
            known = ", ".join(sorted(self.definitions)) or "none"
            raise BatchRequestError(f"Job definition {ref} does not exist (the emulator knows: {known})")
        return active[-1]

    # -- jobs --------------------------------------------------------------------

    def submit(self, spec: dict) -> BatchJob:
        for key in ("jobName", "jobQueue", "jobDefinition"):
            if not spec.get(key):
                raise BatchRequestError(f"{key} must be provided")
        if not _NAME.match(spec["jobName"]):
            raise BatchRequestError(f"jobName {spec['jobName']!r} must be 1-128 letters, digits, - or _")
        size = (spec.get("arrayProperties") or {}).get("size")
        if size is not None and not (isinstance(size, int) and 2 <= size <= MAX_ARRAY_SIZE):
            raise BatchRequestError(f"array size {size!r} must be between 2 and {MAX_ARRAY_SIZE}")
        if (spec.get("timeout") or {}).get("attemptDurationSeconds", 60) < 60:
            raise BatchRequestError("timeout.attemptDurationSeconds must be at least 60")
        job = BatchJob(spec, self.find_definition(spec["jobDefinition"]))
        if not 1 <= int(job.retry.get("attempts", 1)) <= 10:
            raise BatchRequestError("retryStrategy.attempts must be between 1 and 10")
        refusal = self.devices.refusal(job.gpus)
        if refusal:  # refused now: queued, it would wait for devices that never come
            raise BatchRequestError(refusal)
        with self._lock:
            self.jobs[job.id] = job
        for child in job.children:
            self._queue.put((job, child))
        return job

    def find(self, job_id: str) -> tuple[BatchJob, Child | None] | None:
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
            raise BatchRequestError(f"Job {job_id} does not exist")
        job, child = found
        for c in [child] if child is not None else job.children:
            with self._lock:
                if c.status in TERMINAL or (c.status == "RUNNING" and not running_too):
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

    def _run(self, job: BatchJob, child: Child) -> None:
        """Run one child once its GPUs are free (it stays RUNNABLE meanwhile), then give them back."""
        gpus = self.devices.take(
            job.gpus, lambda: child.status == "RUNNABLE" and not child.terminate and not self._closed)
        if gpus is None:  # terminated, or the emulator closed, while it waited
            return
        try:
            with self._lock:
                if child.status != "RUNNABLE" or child.terminate:
                    return
                child.status, child.started = "RUNNING", _now_ms()
            self._run_attempts(job, child, ",".join(gpus))
        finally:
            self.devices.give_back(gpus)

    def _run_attempts(self, job: BatchJob, child: Child, gpus: str) -> None:
        child.log = os.path.join(self.logs, job.child_id(child).replace(":", "-") + ".log")
        try:
            secrets = self._secrets_of(job)
        except ValueError as e:
            return self._finish(child, "FAILED", str(e), None, None)
        env = {**self.env, **job.environment, **secrets, "CUDA_VISIBLE_DEVICES": gpus,
               "AWS_BATCH_JOB_ID": job.child_id(child), "AWS_BATCH_JQ_NAME": job.queue,
               "AWS_BATCH_CE_NAME": "fnmap-emulator"}
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

    def _secrets_of(self, job: BatchJob) -> dict:
        """The job definition's ``secrets`` resolved, as the container agent does when a child starts."""
        missing = sorted(ref for ref in job.secrets.values() if ref not in self.secret_values)
        if missing:
            raise ValueError(f"ResourceInitializationError: unable to pull secrets: {missing[0]} does not exist "
                             f"(the emulator knows {SECRET_ARN})")
        return {name: self.secret_values[ref] for name, ref in job.secrets.items()}

    def _attempt(self, job: BatchJob, child: Child, env: dict, limit: int | None):
        command = command_for(job.command, job.parameters)
        with open(child.log, "ab") as log:
            try:
                proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            except OSError as e:
                return None, f"CannotStartContainerError: {e}", str(e)[:255]
            with self._lock:
                child.proc = proc
                if child.terminate:  # terminated while it was being started
                    proc.kill()
            watch = MemoryWatch(proc.pid, job.memory_mb) if job.memory_mb else None
            try:
                code, status_reason = _wait(proc, limit, watch), "Essential container in task exited"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code, status_reason = None, _TIMED_OUT
            finally:
                if watch is not None:
                    watch.stop()
            with self._lock:
                child.proc = None
        if code is not None and code < 0:  # killed by a signal: what a container runtime reports
            code = 128 - code
        if watch is not None and watch.exceeded and not child.terminate:
            # What AWS Batch reports for a container over its MEMORY (fnmap's client climbs ``memory``).
            reason = f"{_OUT_OF_MEMORY}: {watch.message('the container')}"
            return code, _OUT_OF_MEMORY, reason[:255]
        return code, status_reason, (_last_line(child.log) if code != 0 else None)

    def _finish(self, child: Child, status: str, status_reason: str | None, code, reason) -> None:
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


def _wait(proc: subprocess.Popen, limit: float | None, watch: MemoryWatch | None) -> int:
    """``proc``'s exit status, within ``limit`` seconds (else ``TimeoutExpired``); with a ``watch``,
    reaped by ``wait4`` so that its peak memory (``ru_maxrss``) is checked against the limit too."""
    if watch is None:
        return proc.wait(timeout=limit)
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere (Popen's own wait)
            return proc.wait()
        if pid:
            watch.check(usage.ru_maxrss)  # KiB on Linux
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, limit)
        time.sleep(0.02)


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
