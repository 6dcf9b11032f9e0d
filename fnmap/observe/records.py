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
writing its record is rebuilt from those status records alone, each call at the
items its status record names, the ranges no call reported listed as
``unreported`` (so a re-attach never misaligns).

The other topics of the job records live beside this one: the index, listing
and id prefixes in :mod:`fnmap.observe.history`, the client's identity in
:mod:`fnmap.observe.identity`, captured output in :mod:`fnmap.observe.logs`,
``fnmap gc`` in :mod:`fnmap.observe.gc`; the cancel channel and a call's error,
which the control path uses, in :mod:`fnmap.runtime.cancel` and
:mod:`fnmap.runtime.call_error`.
"""

from __future__ import annotations

import json
import math
import time

from .. import lease
from ..cost.pricing import cache_hits, job_cost
from ..errors import FnmapError
from ..lease import ABANDONED
from ..runtime import keys
from . import identity, report
from .history import JobNotFound, get_json_many, resolve_id, started_entry, write_index
from .logs import logs_text
from .report import UNFINISHED

#: What fnmap.jobs reads from here; the index and logs are re-exported from their modules.
__all__ = ["ABANDONED", "JobNotFound", "build", "load", "logs_text", "resolve_id",
           "started_summary", "summarize", "uncovered", "write", "write_index"]

FORMAT = 1
#: Worker stats copied from the counted attempt into the call's entry.
_STATS_FIELDS = ("worker", "cold", "init_seconds", "started", "loaded", "finished", "written", "bytes_in",
                 "bytes_out", "peak_memory_kb", "log_tail")


# -- writing -------------------------------------------------------------------


def build(job) -> dict:
    """The record of a :class:`fnmap.jobs.Job`, finished or not, as plain JSON-ready data."""
    raised = job.raised
    with job._lock:
        calls = [_call_entry(s, job.run.call_errors.get(s.call_id)) for s in job.run.calls]
        finished = job.run.finished if job.run.done_count == len(job.run.calls) and job.run.sealed else None
    if raised is not None:  # its caller has its exception: what is still out was stopped with the job
        stopped = f"stopped unfinished: the job ended when {raised['error']} reached its caller"
    elif job.given_up is not None:  # its process gave it up at exit
        stopped = f"the job was abandoned ({job.given_up}): stopped unfinished"
    else:
        stopped = None
    if stopped is not None:
        for call in calls:
            if call["status"] in UNFINISHED:
                call.update(status="cancelled", error=stopped)
        finished = finished or time.time()
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
        "raised": raised,
        "options": {
            "chunksize": cfg.chunksize or "auto",
            "timeout": cfg.timeout,
            "retries": cfg.retries,
            "memory": cfg.memory,
            "gpu": cfg.gpu,
            "region": cfg.region,
            "retry_on": list(job.retry_on_names),
            "instance_type": getattr(cfg, "instance_type", None),
            "max_cost": cfg.max_cost,
        },
        "calls": calls,
    }
    if job.run.budget is not None:  # what the cap allowed, what was spent, whether it stopped the job
        with job._lock:
            record["cost_cap"] = cap = job.run.budget.as_record()
        cap["calls_not_run"] = (cap["refused"]["calls"] if cap.get("refused") else  # calls with no result
                                sum(1 for c in calls if c["status"] in ("cancelled", *UNFINISHED)))
    record["summary"] = summarize(record)
    return record


def _call_entry(state, error: tuple[str, str] | None) -> dict:
    stats = state.stats or {}
    attempts = [
        {"attempt": a.number, "sent": a.sent, "ended": a.ended, "outcome": a.ending,
         **({"memory": a.memory} if a.memory else {})}
        for a in state.attempts
    ]
    if state.done:
        if error is not None:
            status = error[0]
        elif state.cached is not None:  # answered by the result cache: done, never sent
            status = "ok"
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
    if state.cached is not None:  # per item, the job whose cache entry answered it: [[first item, count, job]]
        entry["cached_from"] = state.cached
    if state.items_key:  # its input is an object in storage (priced: one PUT, a GET per attempt)
        entry["stored_input"] = True
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


def _identity(job) -> dict:
    """What tells one job from another later: its function, where it was started, by which process,
    and the error that stopped it before any call ran; and the shared objects (function pickles,
    content-addressed inputs) it uses, which ``fnmap gc`` keeps while the job is kept."""
    with job._lock:
        shared = {s.func_key for s in job.run.calls} | {s.items_key for s in job.run.calls if s.items_key}
    return {
        "function": job.function_name,
        **_started(job),
        "client": identity.client_process(),
        "error": job.run.setup_error,
        "shared": sorted(k for k in shared if k.startswith(keys.SHARED_PREFIXES)),
    }


def _started(job) -> dict:
    """Who started the job and from where (``started_by``, ``origin``), kept by every redrive, and
    each redrive's process and script (``redriven``); ``client`` is the process running it now."""
    here = {"client": identity.client_process(), "origin": identity.origin()}
    first = job.first_run
    if first is None:
        return {"origin": here["origin"], "started_by": here["client"]}
    redriven = [*(first.get("redriven") or ()), {**here, "at": job.run_started}]
    return {"origin": first.get("origin"), "started_by": first.get("started_by") or first.get("client"),
            "redriven": redriven}


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
    call; automatic chunking makes far fewer calls, and each now takes about half."""
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
        calls, items = len(job.run.calls), sum(s.n_items for s in job.run.calls)
    feed = job.run.feed
    if feed is not None:  # automatic chunking: calls are made as others end, but every item is known
        items = max(items, feed.total)
    record = {
        "job_id": job.id,
        "kind": job.kind,
        **_identity(job),
        "backend": cfg.backend,
        "storage": job.store.url,
        "created": job.created,
        "finished": None,
        "options": {"max_cost": cfg.max_cost},
        "calls": [],
    }
    if job.run.budget is not None:
        record["cost_cap"] = job.run.budget.as_record()
    summary = summarize(record)
    summary.update(status="running", calls=calls, items=items)
    summary["states"]["running"] = calls
    return summary


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


def _seconds_per_item(done: list[dict]) -> float | None:
    """The worker's seconds per item over the calls that succeeded, for ``fnmap.estimate`` of the
    same function later; None when none reported."""
    timed = [(run_seconds(c), c["items"]) for c in done if c["status"] == "ok"]
    timed = [(seconds, items) for seconds, items in timed if seconds is not None and items]
    if not timed:
        return None
    return sum(seconds for seconds, _ in timed) / sum(items for _, items in timed)


def _retries(call: dict) -> int:
    """Attempts of a call after its first that were retries (speculative copies are not)."""
    n = len(call["attempts"])
    return 0 if n < 2 else max(0, n - 1 - len(call.get("copies") or ()))


def run_seconds(call: dict) -> float | None:
    """How long the worker ran the call (load, items), or None when it never reported."""
    if call.get("started") is None or call.get("finished") is None:
        return None
    return call["finished"] - call["started"]


def _job_status(record: dict, n_done: int, failed: list) -> str:
    """What happened to the job.  One whose exception reached its caller (``raised``) ended then, as
    that exception says: ``failed`` for an item's or a call's failure (the calls it stopped are
    cancelled, not the job), ``cancelled`` for an interrupt or a cancel; ``capped`` for a job its
    ``max_cost`` stopped."""
    calls = record["calls"]
    raised = record.get("raised")
    cap = record.get("cost_cap") or {}
    if cap.get("reached") and (cap.get("refused") or any(c["status"] != "ok" for c in calls)):
        return "capped"  # stopped at its max_cost (or refused before it started)
    if record.get("error"):  # stopped before any call ran, e.g. an item that does not pickle
        return "failed"
    if raised:
        return raised["status"]
    if n_done < len(calls):
        return "running" if record.get("finished") is None else "incomplete"
    if any(c["status"] == "cancelled" for c in calls):
        return "cancelled"
    return "failed" if failed else "succeeded"


def summarize(record: dict) -> dict:
    """Counts, durations p50/p95/max, throughput and estimated cost of a record."""
    calls = record["calls"]
    done = [c for c in calls if c["status"] not in UNFINISHED]
    again = report.retried_calls(calls)
    failed = [c for c in done if c["status"] not in ("ok", "cancelled") and c["call"] not in again]
    durations = [d for d in (run_seconds(c) for c in done) if d is not None]
    latencies = [c["ended"] - c["submitted"] for c in done
                 if c.get("ended") is not None and c.get("submitted") is not None]
    end = record.get("finished") or max((c["ended"] for c in done if c.get("ended")), default=None)
    wall = end - record["created"] if end else None
    items = sum(c["items"] for c in calls)
    items_done = sum(c["items"] for c in done)
    status = _job_status(record, len(done), failed)
    peaks = [c["peak_memory_kb"] for c in done if c.get("peak_memory_kb")]
    cancelled = sum(1 for c in done if c["status"] == "cancelled" and c["call"] not in again)
    summary = {
        "job_id": record["job_id"],
        "kind": record.get("kind"),
        "shared": record.get("shared") or [],
        "function": record.get("function"),
        "origin": record.get("origin"),
        "started_by": record.get("started_by") or record.get("client"),
        "redriven": record.get("redriven"),
        "client": record.get("client"),
        "error": record.get("error"),
        "raised": record.get("raised"),
        "backend": record.get("backend"),
        "storage": record.get("storage"),
        "status": status,
        "created": record["created"],
        "finished": record.get("finished"),
        "wall_seconds": wall,
        "calls": len(calls),
        "calls_done": len(done),
        "calls_failed": len(failed),
        # calls per state: what `fnmap jobs`, `fnmap job` and summary() show (done = all but running)
        "states": {"succeeded": len(done) - len(failed) - cancelled - len(again), "failed": len(failed),
                   "cancelled": cancelled, "retried": len(again), ABANDONED: 0, "running": len(calls) - len(done)},
        "items": items,
        "failed_items": sum(c["failed_items"] for c in done if c["call"] not in again),
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
        "cost": job_cost(record),
        "cost_cap": record.get("cost_cap"),
        "seconds_per_item": _seconds_per_item(done),
        "cache_hits": cache_hits(calls),
    }
    return summary


# -- reading -------------------------------------------------------------------


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
        started = started_entry(store, job_id)
        if not status_keys and started is None:
            raise JobNotFound(f"job {job_id} has no record and no status records in {store.url}")
        return _rebuild(store, job_id, status_keys, started)  # judged: abandoned if its client is gone
    missing = {c["call"] for c in record["calls"] if c["status"] not in UNFINISHED and c.get("started") is None}
    wanted = [k for k in status_keys if keys.call_attempt_of(k)[0] in missing]
    if wanted:
        by_call = {}
        for stats in get_json_many(store, wanted):
            by_call.setdefault(stats["call_id"], []).append(stats)
        for call in record["calls"]:
            found = by_call.get(call["call"])
            if found:  # the attempt that ran it, not a later one answered with its committed result
                ran = [s for s in found if not s.get("already_final")] or found
                _apply_stats(call, max(ran, key=lambda s: s["attempt"]))
        record["summary"] = summarize(record)
    return lease.judge(store, record)  # abandoned if its client is gone


def call_reports(store, job_id: str, call: int) -> list[dict]:
    """The status records of one call of a job (one per attempt that reported), by attempt."""
    return sorted(get_json_many(store, store.list(keys.call_status_prefix(job_id, call))), key=lambda s: s["attempt"])


def _apply_stats(call: dict, stats: dict) -> None:
    call["attempt"] = stats.get("attempt")
    for name in _STATS_FIELDS:
        call[name] = stats.get(name)
    if call["status"] in ("error", "timeout") and stats.get("failed_items") is not None:
        call["failed_items"] = stats["failed_items"]
    error = stats.get("error")  # a failing call's [status, "Type: message", traceback], as its worker saw it
    if error and call["status"] in ("error", "timeout") and not call.get("error"):
        call["error"], call["traceback"] = error[1], error[2] or None


def _rebuild(store, job_id: str, status_keys: list[str], started: dict | None) -> dict:
    """A record from the workers' status records (the client has not written one, or never will).

    Each reported call stands where its items are (``first_item`` from its status record); the item
    ranges no call reported are listed in ``unreported``, so a re-attach keeps every item in place."""
    by_call: dict[int, list[dict]] = {}
    for stats in get_json_many(store, status_keys):
        by_call.setdefault(stats["call_id"], []).append(stats)
    calls = [_rebuilt_call(call_id, by_call[call_id]) for call_id in sorted(by_call)]
    started = started or {}
    created = started.get("created") or min((c["started"] for c in calls if c.get("started")), default=time.time())
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
        "the workers' status records; the items of calls that never reported have no result",
    }
    for field in ("function", "origin", "client", "started_by", "redriven"):
        record[field] = started.get(field)
    summary = record["summary"] = summarize(record)
    # A job that wrote its start entry is running, unless its client is gone.
    summary["status"] = "running" if started else "unknown"
    lease.judge(store, record)
    summary["items"] = max(summary["items"], started.get("items") or 0)
    record["unreported"] = gaps = _unreported(calls, summary["items"])
    summary["items_unreported"] = sum(n for _, n in gaps)
    # Each range of items no call reported is one call at least: with automatic chunking the start
    # entry counts only the first calls, so the calls are at least those reported and those gaps
    # (done never exceeds calls, and running is what is left of them).
    summary["calls"] = max(summary["calls"] + len(gaps), started.get("calls") or 0)
    unfinished = summary["calls"] - summary["calls_done"]
    summary["states"]["running"] = 0 if summary["status"] == ABANDONED else unfinished
    summary["states"][ABANDONED] = unfinished if summary["status"] == ABANDONED else 0
    return record


def _rebuilt_call(call_id: int, reports: list[dict]) -> dict:
    """A call's entry from its attempts' status records (a duplicate's ``already_final`` report aside)."""
    attempts = sorted(reports, key=lambda s: s["attempt"])
    ran = [s for s in attempts if not s.get("already_final")] or attempts
    last = ran[-1]
    failed = last.get("failed_items") or 0
    call = {
        "call": call_id,
        "first_item": last.get("first_item"),
        "items": last.get("items", 0),
        "status": last["error"][0] if failed else "ok",  # a failing call's [status, message, traceback]
        "error": None,
        "traceback": None,
        "submitted": None,
        "ended": last.get("written"),
        "attempts": [{"attempt": s["attempt"], "sent": s.get("started"), "ended": s.get("written"),
                      "outcome": "error" if s.get("failed_items") else "ok"} for s in attempts],
        "failed_items": failed,
    }
    _apply_stats(call, last)
    return call


def _unreported(calls: list[dict], n_items: int) -> list[list[int]]:
    """``[[first_item, items], ...]``: the item ranges of ``0..n_items`` that no call in ``calls``
    reported (each status record names its call's ``first_item``)."""
    return [list(gap) for gap in uncovered([(c["first_item"], c["items"]) for c in calls], n_items)]


def uncovered(spans, n_items: int) -> list[tuple[int, int]]:
    """``[(first_item, items), ...]``: the item ranges of ``0..n_items`` in none of ``spans``
    (``(first_item, items)`` per call): items no call reported, or in no stored call for a redrive."""
    gaps, at = [], 0
    for first, n in sorted(spans):
        if first > at:
            gaps.append((at, first - at))
        at = max(at, first + n)
    if n_items > at:
        gaps.append((at, n_items - at))
    return gaps
