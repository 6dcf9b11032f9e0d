"""Job records: what every job leaves in storage so that it can be inspected later, from anywhere.

A job writes two objects, both JSON, both through the job's own store:

* ``jobs/<job_id>/job.json``, the record: the job's options, and per call
  the times it was submitted, started (by the worker), loaded, finished and
  written, the client's view of every attempt, the worker id, cold or warm
  start, bytes in and out, peak memory, its status and error, and a summary
  (:func:`summarize`).  It is written once, when the last call finishes and
  before its result reaches the caller, so a ``fnmap.map`` that has returned
  has its record in storage.
* ``index/jobs/<created>-<job_id>.json``, the summary only, written when a map
  job starts (status ``running``) and again at the end, so ``fnmap jobs``
  lists recent jobs with one LIST and a few small GETs.

Readers (:func:`load`) fill in what the client did not see, such as the
worker's stats of calls whose results were gathered from storage, from the
status record each worker writes per attempt; a job whose client died before
writing its record is rebuilt from those status records alone.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import FnmapError
from ..runtime import keys
from ..runtime import outcome as _outcome
from . import cost

FORMAT = 1
#: Call statuses that mean the call has not finished.
UNFINISHED = ("pending", "running")
#: Worker stats copied from the counted attempt into the call's entry.
_STATS_FIELDS = (
    "worker",
    "cold",
    "started",
    "loaded",
    "finished",
    "written",
    "bytes_in",
    "bytes_out",
    "peak_memory_kb",
    "log_tail",
)
_TIMEOUT_ERROR = "fnmap.errors.TimeoutError"
#: Status of a job whose client process is gone before the job finished (killed, crashed).
ABANDONED = "abandoned"


class JobNotFound(FnmapError, LookupError):
    """No job with this id (or id prefix) has a record or status records in the store."""


# -- writing -------------------------------------------------------------------


def build(job) -> dict:
    """The record of a :class:`fnmap.jobs.Job`, finished or not, as plain JSON-ready data."""
    with job._lock:
        calls = [_call_entry(s, job.call_errors.get(s.call_id)) for s in job.calls]
        finished = job.finished if job.done_count == len(job.calls) and job.sealed else None
    cfg = job.config
    record = {
        "format": FORMAT,
        "job_id": job.id,
        "kind": job.kind,
        **_identity(job),
        "backend": cfg.backend,
        "storage": job.store.url,
        "created": job.created,
        "finished": finished,
        "options": {
            "chunksize": cfg.chunksize or "auto",
            "timeout": cfg.timeout,
            "retries": cfg.retries,
            "memory": cfg.memory,
            "gpu": cfg.gpu,
            "region": cfg.region,
            "retry_on": list(job.retry_on_names),
            "instance_type": getattr(cfg, "instance_type", None),
        },
        "calls": calls,
    }
    record["summary"] = summarize(record)
    return record


def _call_entry(state, error: tuple[str, str] | None) -> dict:
    stats = state.stats or {}
    attempts = [
        {"attempt": a.number, "sent": a.sent, "ended": a.ended, "outcome": a.outcome,
         **({"memory": a.memory} if a.memory else {})}
        for a in state.attempts
    ]
    if state.done:
        if error is not None:
            status = error[0]
        elif not attempts or state.cancelled:
            status = "cancelled"
        else:
            status = "ok"
    else:
        status = "running" if state.in_flight else "pending"
    ended = max((a["ended"] for a in attempts if a["ended"] is not None), default=None)
    entry = {
        "call": state.call_id,
        "first_item": state.first_index,
        "items": state.n_items,
        "status": status,
        "error": error[1] if error else None,
        # The remote traceback of a failed call (absent for platform faults, which have none).
        "traceback": error[2] if error and len(error) > 2 and error[2] else None,
        "submitted": attempts[0]["sent"] if attempts else None,
        "ended": ended,
        "attempt": stats.get("attempt"),
        "attempts": attempts,
        "failed_items": _failed_items(status, stats, state.n_items),
    }
    if len(attempts) > 1:  # the attempts that were speculative copies (sent while another was out), not retries
        entry["copies"] = [a.number for a in state.attempts if a.copy] or None
    for name in _STATS_FIELDS:
        entry[name] = stats.get(name)
    return entry


def _failed_items(status: str, stats: dict, n_items: int) -> int:
    if status in ("ok", "cancelled", *UNFINISHED):
        return 0
    if status in ("error", "timeout") and stats.get("failed_items") is not None:
        return stats["failed_items"]
    return n_items


def call_error(outcomes: list) -> tuple[str, str, str]:
    """``(status, "Type: message", remote traceback)`` of the first failing item of a call's outcomes."""
    from ..runtime.serialization import add_local_source_lines

    for outcome in outcomes:
        if not _outcome.succeeded(outcome):
            _data, tb, names = _outcome.failure(outcome)
            lines = [line for line in tb.strip().splitlines() if line.strip()]
            message = lines[-1] if lines else names[0]
            return ("timeout" if _TIMEOUT_ERROR in names else "error"), message, add_local_source_lines(tb)
    return "ok", "", ""


def _identity(job) -> dict:
    """What tells one job from another later: its function, where it was started, by which process,
    and the error that stopped it before any call ran; and the shared objects (function pickles,
    content-addressed inputs) it uses, which ``fnmap gc`` keeps while the job is kept."""
    with job._lock:
        shared = {s.func_key for s in job.calls} | {s.items_key for s in job.calls if s.items_key}
    return {
        "function": job.function_name,
        "origin": _origin(),
        "client": _client_process(),
        "error": job.setup_error,
        "shared": sorted(k for k in shared if k.startswith(keys.SHARED_PREFIXES)),
    }


def _origin() -> str | None:
    """The notebook or script this process runs: Jupyter's session name, else ``__main__``'s file."""
    import os
    import sys

    if os.environ.get("JPY_SESSION_NAME"):
        return os.environ["JPY_SESSION_NAME"]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file:
        return os.path.abspath(main_file)
    from .progress import in_kernel

    return "notebook" if in_kernel() else "interactive"


_CLIENT: dict | None = None


def _client_process() -> dict:
    """This client's host, pid and process start time: a reader on the same host can tell whether
    the client that started a job is still alive (:func:`client_gone`)."""
    global _CLIENT
    import os
    import socket

    if _CLIENT is None or _CLIENT["pid"] != os.getpid():  # recomputed in a forked child
        _CLIENT = {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}
    return _CLIENT


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), so a reused pid is not
    mistaken for the client; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def client_gone(client: dict | None) -> bool:
    """True when ``client`` (from a record) ran on this host and that process no longer exists."""
    import os
    import socket

    if not client or client.get("host") != socket.gethostname() or not client.get("pid"):
        return False  # another machine's client: nothing to check it against
    try:
        os.kill(client["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return client.get("start") is not None and _process_start(client["pid"]) != client["start"]


def write(store, record: dict) -> None:
    """Store the record (its calls compact, see :func:`compact_calls`) and its index entry."""
    stored = dict(record, calls=compact_calls(record["calls"]))
    store.put(keys.job_record_key(record["job_id"]), json.dumps(stored, separators=(",", ":")).encode())
    write_index(store, record["summary"])


#: Fields of a call entry that are times (stored to the millisecond).
_TIME_FIELDS = ("submitted", "ended", "started", "loaded", "finished", "written")
#: Fields of a call entry that :func:`expand_calls` derives from its attempts.
_DERIVED = ("submitted", "ended")
#: Fields of a call entry that :func:`expand_calls` fills back in (None when absent).
_CALL_FIELDS = ("error", "traceback", "submitted", "ended", "attempt", *_STATS_FIELDS)


def compact_calls(calls: list[dict]) -> list[dict]:
    """Call entries as stored: empty fields left out, times to the millisecond, each attempt as
    ``[attempt, sent, ended, outcome]`` (and the memory, when set), ``submitted`` and ``ended``
    left to be derived from the attempts.  A 100,000-call record was 48 MB at about 500 bytes a
    call (issue 24); automatic chunking makes far fewer calls, and each now takes about half."""
    out = []
    for call in calls:
        entry = {k: _ms(v) if k in _TIME_FIELDS else v for k, v in call.items()
                 if v is not None and k not in _DERIVED}
        entry["attempts"] = [[a["attempt"], _ms(a["sent"]), _ms(a["ended"]), a["outcome"],
                              *([a["memory"]] if a.get("memory") else [])]
                             for a in call["attempts"]]
        out.append(entry)
    return out


def expand_calls(calls: list[dict]) -> list[dict]:
    """The call entries of a stored record as :func:`build` makes them (inverse of :func:`compact_calls`)."""
    for call in calls:
        for name in _CALL_FIELDS:
            call.setdefault(name, None)
        call["attempts"] = attempts = [
            a if isinstance(a, dict) else _attempt_entry(a) for a in call.get("attempts", [])]
        if call["submitted"] is None and attempts:
            call["submitted"] = attempts[0]["sent"]
        if call["ended"] is None:
            call["ended"] = max((a["ended"] for a in attempts if a["ended"] is not None), default=None)
    return calls


def _attempt_entry(stored: list) -> dict:
    """A stored ``[attempt, sent, ended, outcome]`` (``, memory]`` when the job had memory steps) as a dict."""
    entry = dict(zip(("attempt", "sent", "ended", "outcome"), stored[:4], strict=True))
    if len(stored) > 4:
        entry["memory"] = stored[4]
    return entry


def _ms(value):
    return round(value, 3) if isinstance(value, float) else value


def started_summary(job) -> dict:
    """The index entry of a job that has just started: its summary with no call done yet.

    Built without the per-call record, so starting a job costs one small PUT whatever its size.
    """
    cfg = job.config
    with job._lock:
        calls, items = len(job.calls), sum(s.n_items for s in job.calls)
    record = {
        "job_id": job.id,
        "kind": job.kind,
        **_identity(job),
        "backend": cfg.backend,
        "storage": job.store.url,
        "created": job.created,
        "finished": None,
        "options": {},
        "calls": [],
    }
    summary = summarize(record)
    summary.update(status="running", calls=calls, items=items)
    return summary


def write_index(store, summary: dict) -> None:
    store.put(
        keys.job_index_key(summary["job_id"], summary["created"]), json.dumps(summary).encode()
    )


# -- summary -------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100), as numpy's default."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _spread(values: list[float]) -> dict:
    return {
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values) if values else None,
        "count": len(values),
    }


def _retries(call: dict) -> int:
    """Attempts of a call after its first that were retries (speculative copies are not)."""
    n = len(call["attempts"])
    return 0 if n < 2 else max(0, n - 1 - len(call.get("copies") or ()))


def run_seconds(call: dict) -> float | None:
    """How long the worker ran the call (load, items), or None when it never reported."""
    if call.get("started") is None or call.get("finished") is None:
        return None
    return call["finished"] - call["started"]


def summarize(record: dict) -> dict:
    """Counts, durations p50/p95/max, throughput and estimated cost of a record."""
    calls = record["calls"]
    done = [c for c in calls if c["status"] not in UNFINISHED]
    failed = [c for c in done if c["status"] not in ("ok", "cancelled")]
    durations = [d for d in (run_seconds(c) for c in done) if d is not None]
    latencies = [
        c["ended"] - c["submitted"]
        for c in done
        if c.get("ended") is not None and c.get("submitted") is not None
    ]
    end = record.get("finished") or max((c["ended"] for c in done if c.get("ended")), default=None)
    wall = end - record["created"] if end else None
    items = sum(c["items"] for c in calls)
    items_done = sum(c["items"] for c in done)
    if record.get("error"):  # stopped before any call ran, e.g. an item that does not pickle
        status = "failed"
    elif len(done) < len(calls):
        status = "running" if record.get("finished") is None else "incomplete"
    elif any(c["status"] == "cancelled" for c in calls):
        status = "cancelled"
    else:
        status = "failed" if failed else "succeeded"
    peaks = [c["peak_memory_kb"] for c in done if c.get("peak_memory_kb")]
    summary = {
        "job_id": record["job_id"],
        "kind": record.get("kind"),
        "shared": record.get("shared") or [],
        "function": record.get("function"),
        "origin": record.get("origin"),
        "client": record.get("client"),
        "error": record.get("error"),
        "backend": record.get("backend"),
        "storage": record.get("storage"),
        "status": status,
        "created": record["created"],
        "finished": record.get("finished"),
        "wall_seconds": wall,
        "calls": len(calls),
        "calls_done": len(done),
        "calls_failed": len(failed),
        "items": items,
        "failed_items": sum(c["failed_items"] for c in done),
        "retries": sum(_retries(c) for c in calls),
        "calls_retried": sum(1 for c in calls if _retries(c)),
        "cold_starts": sum(1 for c in done if c.get("cold")),
        "workers": len({c["worker"] for c in done if c.get("worker")}),
        "duration_seconds": _spread(durations),
        "latency_seconds": _spread(latencies),
        "throughput": {
            "items_per_second": items_done / wall if wall else None,
            "calls_per_second": len(done) / wall if wall else None,
        },
        "bytes_in": sum(c.get("bytes_in") or 0 for c in done),
        "bytes_out": sum(c.get("bytes_out") or 0 for c in done),
        "peak_memory_mb": max(peaks) / 1024 if peaks else None,
        "cost": cost.estimate(record),
    }
    return summary


# -- reading -------------------------------------------------------------------


def list_jobs(store, limit: int | None = 20) -> list[dict]:
    """Summaries of the most recent jobs, newest first."""
    entries = store.list(keys.job_index_prefix())
    entries.reverse()  # keys sort by creation time
    if limit is not None:
        entries = entries[:limit]
    out = []
    for key in entries:
        try:
            summary = json.loads(store.get(key))
        except (
            FnmapError,
            ValueError,
        ):  # deleted meanwhile (gc) or a partial object from a dead writer
            continue
        if summary.get("status") == "running":
            _refresh_running(store, summary)
        out.append(summary)
    return out


def _refresh_running(store, summary: dict) -> None:
    """A running job's index entry says what it was at the start: count its calls done from the
    workers' status records (as ``fnmap job`` does), and call it abandoned if its client is gone."""
    done = {_status_call(k)[0] for k in store.list(keys.status_prefix(summary["job_id"]))}
    summary["calls_done"] = max(summary.get("calls_done") or 0, len(done))
    if client_gone(summary.get("client")):
        summary["status"] = ABANDONED


def resolve_id(store, job_id: str) -> str:
    """The full id of a job given its id or a unique prefix of it."""
    job_id = job_id.strip().lower()
    if not job_id or any(ch not in "0123456789abcdef" for ch in job_id):
        raise JobNotFound(f"{job_id!r} is not a job id: ids are hexadecimal (see `fnmap jobs`)")
    if len(job_id) == 32:
        return job_id
    matches = sorted(
        {
            _index_job_id(k)
            for k in store.list(keys.job_index_prefix())
            if _index_job_id(k).startswith(job_id)
        }
    )
    if not matches:
        raise JobNotFound(f"no job id starts with {job_id!r} in {store.url} (see `fnmap jobs`)")
    if len(matches) > 1:
        raise JobNotFound(
            f"job id prefix {job_id!r} is ambiguous: {', '.join(matches[:5])}; give more digits"
        )
    return matches[0]


def _index_job_id(key: str) -> str:
    return key.rsplit("/", 1)[1].split("-", 1)[1].removesuffix(".json")


def _index_created(key: str) -> float:
    return float(key.rsplit("/", 1)[1].split("-", 1)[0]) / 1000  # see keys.job_index_key


def load(store, job_id: str) -> dict:
    """A job's record (``job_id`` may be a unique prefix), completed from status records."""
    job_id = resolve_id(store, job_id)
    try:
        record = json.loads(store.get(keys.job_record_key(job_id)))
    except FnmapError:  # KeyNotFound: the client has not written it (running, or died)
        record = None
    if record is not None:
        expand_calls(record["calls"])
    status_keys = store.list(keys.status_prefix(job_id))
    if record is None:
        started = _started_entry(store, job_id)
        if not status_keys and started is None:
            raise JobNotFound(f"job {job_id} has no record and no status records in {store.url}")
        return _rebuild(store, job_id, status_keys, started)
    missing = {
        c["call"]
        for c in record["calls"]
        if c["status"] not in UNFINISHED and c.get("started") is None
    }
    wanted = [k for k in status_keys if _status_call(k)[0] in missing]
    if wanted:
        by_call = {}
        for stats in _get_json_many(store, wanted):
            by_call.setdefault(stats["call_id"], []).append(stats)
        for call in record["calls"]:
            found = by_call.get(call["call"])
            if found:
                _apply_stats(call, max(found, key=lambda s: s["attempt"]))
        record["summary"] = summarize(record)
    return record


def _status_call(key: str) -> tuple[int, int]:
    name = key.rsplit("/", 1)[1]  # "<call>.<attempt>.json"
    call, attempt, _ = name.split(".")
    return int(call), int(attempt)


def _apply_stats(call: dict, stats: dict) -> None:
    call["attempt"] = stats.get("attempt")
    for name in _STATS_FIELDS:
        call[name] = stats.get(name)
    if call["status"] in ("error", "timeout") and stats.get("failed_items") is not None:
        call["failed_items"] = stats["failed_items"]


def _get_json_many(store, keys_: list[str]) -> list[dict]:
    def get(key):
        try:
            return json.loads(store.get(key))
        except (FnmapError, ValueError):
            return None

    if not keys_:
        return []
    with ThreadPoolExecutor(min(16, len(keys_))) as pool:
        return [s for s in pool.map(get, keys_) if s is not None]


def _started_entry(store, job_id: str) -> dict | None:
    """The index entry a job wrote when it started, if any."""
    for key in store.list(keys.job_index_prefix()):
        if _index_job_id(key) == job_id:
            try:
                return json.loads(store.get(key))
            except (FnmapError, ValueError):
                return None
    return None


def _rebuild(store, job_id: str, status_keys: list[str], started: dict | None) -> dict:
    """A record from the workers' status records (the client has not written one, or never will)."""
    by_call: dict[int, list[dict]] = {}
    for stats in _get_json_many(store, status_keys):
        by_call.setdefault(stats["call_id"], []).append(stats)
    calls = []
    for call_id in sorted(by_call):
        attempts = sorted(by_call[call_id], key=lambda s: s["attempt"])
        last = attempts[-1]
        failed = last.get("failed_items") or 0
        call = {
            "call": call_id,
            "first_item": None,
            "items": last.get("items", 0),
            "status": "error" if failed else "ok",
            "error": None,
            "submitted": None,
            "ended": last.get("written"),
            "attempts": [
                {
                    "attempt": s["attempt"],
                    "sent": s.get("started"),
                    "ended": s.get("written"),
                    "outcome": "error" if s.get("failed_items") else "ok",
                }
                for s in attempts
            ],
            "failed_items": failed,
        }
        _apply_stats(call, last)
        calls.append(call)
    started = started or {}
    created = started.get("created") or min(
        (c["started"] for c in calls if c.get("started")), default=time.time()
    )
    record = {
        "format": FORMAT,
        "job_id": job_id,
        "kind": started.get("kind"),
        "backend": started.get("backend"),
        "storage": store.url,
        "created": created,
        "finished": None,
        "options": {},
        "calls": calls,
        "rebuilt": "the job wrote no record (still running, or its client stopped): rebuilt from "
        "the workers' status records; calls that never reported are missing",
    }
    for field in ("function", "origin", "client"):
        record[field] = started.get(field)
    summary = record["summary"] = summarize(record)
    # A job that wrote its start entry is running, unless its client is gone.
    summary["status"] = (ABANDONED if client_gone(started.get("client")) else "running") if started else "unknown"
    summary["calls"] = max(summary["calls"], started.get("calls") or 0)
    summary["items"] = max(summary["items"], started.get("items") or 0)
    return record


def request_cancel(store, job_id: str, reason: str = "fnmap cancel") -> None:
    """Ask the client running ``job_id`` (in any process, on any machine) to cancel it."""
    store.put(keys.cancel_key(job_id), json.dumps({"reason": reason, "at": time.time()}).encode())


def cancel_requested(store, job_id: str) -> str | None:
    """Why ``job_id`` was asked to stop (see :func:`request_cancel`), or None."""
    try:
        return json.loads(store.get(keys.cancel_key(job_id))).get("reason") or "fnmap cancel"
    except (FnmapError, ValueError):  # KeyNotFound: nobody asked; a partial object: ask again later
        return None


def logs_text(store, job_id: str, call: int | None = None) -> str:
    """Every call's (or call ``call``'s) captured output, by attempt, under a header each."""
    return "".join(f"--- call {c} attempt {a} ---\n{text}" + ("" if text.endswith("\n") else "\n")
                   for c, a, text in read_logs(store, job_id, call))


def read_logs(store, job_id: str, call: int | None = None) -> list[tuple[int, int, str]]:
    """Captured output as ``(call, attempt, text)``, by call then attempt."""
    prefix = keys.call_logs_prefix(job_id, call) if call is not None else keys.logs_prefix(job_id)
    found = []
    for key in store.list(prefix):
        call_id, attempt, _ = key.rsplit("/", 1)[1].split(".")
        found.append((int(call_id), int(attempt), key))
    found.sort()
    return [(c, a, store.get(k).decode("utf-8", errors="replace")) for c, a, k in found]


# -- cleaning ------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """Seconds in an age like ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    try:
        value = float(text[:-1]) if unit else None
    except ValueError:
        value = None
    if unit is None or value is None or value < 0:
        raise ValueError(
            f"{text!r} is not an age: use a number and a unit s, m, h, d or w, e.g. 12h or 7d"
        )
    return value * unit


def collect_garbage(
    store, older_than: float, dry_run: bool = False, now: float | None = None
) -> dict:
    """Delete every object of the jobs created over ``older_than`` seconds ago (and their index
    entries), then the shared objects (function pickles, content-addressed inputs) that no job
    left in storage uses; report what went, in objects and bytes.

    Jobs with no index entry (their client died) are dated by their newest status record; a job
    with neither is left alone and reported.  A shared object is kept if a kept job's record or
    index entry names it, if it was written after the cutoff (a job being submitted right now), or
    while a kept job has no final record yet (it runs, and may use any of them).
    """
    now = time.time() if now is None else now
    cutoff = now - older_than
    index = {_index_job_id(k): k for k in store.list(keys.job_index_prefix())}
    objects = store.list_details("jobs/")
    by_job: dict[str, list[tuple[str, int]]] = {}
    for key, size, _modified in objects:
        if key.count("/") >= 2:
            by_job.setdefault(key.split("/", 2)[1], []).append((key, size))
    old, kept, undated = [], [], []
    for job_id in sorted(set(by_job) | set(index)):
        if job_id in index:
            created = _index_created(index[job_id])
        else:
            stats = _get_json_many(store, store.list(keys.status_prefix(job_id))[-64:] or [])
            created = max((s.get("written") or 0 for s in stats), default=None)
        if created is None:
            undated.append(job_id)
        elif created < cutoff:
            old.append(job_id)
        else:
            kept.append(job_id)
    deleted_keys = deleted_bytes = 0
    sizes = {}
    for job_id in old:
        doomed = [key for key, _ in by_job.get(job_id, [])]
        size = sum(size for _, size in by_job.get(job_id, []))
        if job_id in index:
            doomed.append(index[job_id])
        sizes[job_id] = size
        deleted_keys += len(doomed)
        deleted_bytes += size
        if not dry_run:
            store.delete(doomed)
    in_use, running = _shared_in_use(store, kept + undated, index)
    shared_doomed = []
    for prefix in keys.SHARED_PREFIXES:
        for key, size, modified in store.list_details(prefix):
            if key not in in_use and modified < cutoff and not running:
                shared_doomed.append((key, size))
    if shared_doomed and not dry_run:
        store.delete([key for key, _ in shared_doomed])
    return {
        "deleted_jobs": old,
        "deleted_job_bytes": sizes,
        "deleted_keys": deleted_keys + len(shared_doomed),
        "deleted_bytes": deleted_bytes + sum(size for _, size in shared_doomed),
        "deleted_shared": [key for key, _ in shared_doomed],
        "deleted_shared_bytes": sum(size for _, size in shared_doomed),
        "kept_jobs": len(kept),
        "kept_bytes": sum(size for job_id in kept for _, size in by_job.get(job_id, [])),
        # what each job left in storage takes (results stay until gc: fnmap.job(ID) reads them again)
        "kept_job_bytes": {job_id: sum(size for _, size in by_job.get(job_id, [])) for job_id in kept},
        "kept_shared_because_running": running,
        "undated_jobs": undated,
        "dry_run": dry_run,
        "older_than_seconds": older_than,
    }


def _shared_in_use(store, job_ids: list[str], index: dict[str, str]) -> tuple[set[str], bool]:
    """The shared objects the given jobs name, and whether one of them has no final record yet."""
    in_use: set[str] = set()
    running = False
    for job_id in job_ids:
        try:
            record = json.loads(store.get(keys.job_record_key(job_id)))
        except (FnmapError, ValueError):
            record = None
        if record is None:
            started = None
            if job_id in index:
                try:
                    started = json.loads(store.get(index[job_id]))
                except (FnmapError, ValueError):
                    started = None
            if started is None or not client_gone(started.get("client")):
                running = True  # it may still submit calls that use any shared object
            in_use.update((started or {}).get("shared") or [])
            continue
        in_use.update(record.get("shared") or [])
    return in_use, running
