"""What the dashboard's pages show, as plain data: a job list row, a job page, a call's output.

Plain functions over the records :mod:`fnmap.observe` reads (no HTTP, no Flask), so each page's
content is testable without a server.  Everything here is data for ``textContent``: the front end
never interprets a stored string as HTML.

A job of 100,000 calls has 100,000 bars or more; a browser draws that many, but the page would
carry megabytes and the eye sees nothing more.  :func:`timeline` keeps the bars that are not a
plain success (failures, retries, copies, stops, calls in flight: what a person looks for) and an
even sample of the successes, :data:`MAX_BARS` in all, and says so on the page.  Past half of
:data:`MAX_BARS` the other bars are sampled too, never the failures: every one is kept.
"""

from __future__ import annotations

import math
import time

from ..observe import report

#: Most bars one timeline carries to the browser.
MAX_BARS = 20_000
#: Most points of the progress curve.
MAX_POINTS = 300
#: Most failed calls listed on a job page (with their tracebacks); the rest are counted.
MAX_FAILURES = 100
#: Most characters of one attempt's captured output sent to the page.
MAX_LOG_CHARS = 1 << 20
#: Kinds of timeline bar, in the order of the legend; a bar carries its kind's index.
BAR_KINDS = ("ok", "failed", "retried", "copy", "stopped", "running")
_BAR_KIND = {name: i for i, name in enumerate(BAR_KINDS)}
#: Attempt outcomes that mean another attempt (or the job's end) stopped this one.
_STOPPED = ("cancelled", "superseded")


def job_row(summary: dict) -> dict:
    """One line of the front page, from a job's index summary (:func:`fnmap.observe.history.list_jobs`)."""
    client = summary.get("client") or {}
    usd = (summary.get("cost") or {}).get("usd")
    return {
        "job_id": summary["job_id"],
        **{name: summary.get(name) for name in ("status", "function", "kind", "backend", "created", "wall_seconds",
                                                "origin")},
        **{name: summary.get(name) or 0 for name in ("calls", "items", "failed_items", "retries", "cache_hits")},
        "states": summary.get("states") or {"done": summary.get("calls_done") or 0},
        "usd": usd,
        "usd_text": "-" if usd is None else report.usd(usd),
        "host": client.get("host"),
        "pid": client.get("pid"),
    }


def job_page(record: dict, now: float | None = None) -> dict:
    """Everything a job's page shows, from its record (:func:`fnmap.observe.records.load`)."""
    now = time.time() if now is None else now
    s = record["summary"]
    return {
        "summary": s,
        "options": record.get("options") or {},
        "cost_text": report.cost_text(s.get("cost") or {})
        + (f"; cost cap {report.cap_text(record)}" if record.get("cost_cap") else ""),
        "commands": commands(record),
        "notes": _notes(record),
        "progress": progress(record, now),
        "timeline": timeline(record, now),
        "failures": failures(record["calls"]),
    }


def commands(record: dict) -> list[dict]:
    """The commands that act on the job, to copy: each with what it does."""
    short = record["job_id"][:12]
    status = record["summary"]["status"]
    out = [{"command": f"fnmap job {short}", "does": "the summary in a terminal"},
           {"command": f"fnmap logs {short}", "does": "every call's captured output"}]
    if status == "running":
        out.append({"command": f"fnmap cancel {short}", "does": "ask the client running it to stop"})
    elif redrive := report.redrive_command(record):
        out.append({"command": redrive[0], "does": redrive[1]})
    return out


def _notes(record: dict) -> list[str]:
    s, notes = record["summary"], []
    if s.get("status") == "running" and record.get("rebuilt"):  # the reader's notes are about a stopped job
        return [f"running: {s.get('calls_done', 0)} of {s.get('calls', 0)} calls have reported; this page is "
                "rebuilt from the workers' status records, so a call shows once it reports"]
    if s.get("error"):
        notes.append(f"stopped before any call ran: {s['error']}")
    if s.get("raised"):
        notes.append(f"{s['raised'].get('error')} reached the job's caller, which stopped the calls still out")
    if s.get("abandoned"):
        notes.append(f"abandoned: {s['abandoned']}")
    cap = record.get("cost_cap") or {}
    if cap.get("reached") and not cap.get("refused"):  # a refused job's error says so already
        notes.append(f"cost cap {report.cap_text(record)}")
    if s.get("cache_hits"):
        notes.append(report.cache_text(record))
    if s.get("items_unreported"):
        notes.append(f"{s['items_unreported']} items have no result: their calls never ran or never reported")
    if record.get("rebuilt"):
        notes.append(record["rebuilt"])
    return notes


def progress(record: dict, now: float) -> dict:
    """Items done over time: ``points`` as ``[seconds since created, items done]``, at most
    :data:`MAX_POINTS` of them, and the job's total items."""
    created = record["created"]
    ends = sorted((c["ended"], c["items"]) for c in record["calls"]
                  if report.ended(c) and c.get("ended") is not None)
    points, done = [[0.0, 0]], 0
    step = max(1, math.ceil(len(ends) / MAX_POINTS))
    for i, (ended, items) in enumerate(ends):
        done += items
        if (i + 1) % step == 0 or i == len(ends) - 1:
            points.append([round(ended - created, 3), done])
    if record["summary"]["status"] == "running":
        points.append([round(now - created, 3), done])
    return {"points": points, "items": record["summary"].get("items") or 0}


def attempt_kind(call: dict, attempt: dict, later: bool) -> str:
    """How one attempt shows on the timeline (:data:`BAR_KINDS`); ``later``: another attempt followed it."""
    outcome = attempt.get("outcome")
    if attempt.get("ended") is None or outcome is None:
        return "running"
    if outcome in _STOPPED:
        return "stopped"
    if attempt["attempt"] in (call.get("copies") or ()):
        return "copy"
    if outcome == "ok":
        return "ok"
    if outcome == "error" or not later:
        return "failed"  # its items raised, or a fault with no attempt after it
    return "retried"


def timeline(record: dict, now: float) -> dict:
    """One bar per attempt, ``[call, start, end, kind]`` (the call's number, seconds since the job
    was created, the kind's index in :data:`BAR_KINDS`); sampled past :data:`MAX_BARS`."""
    plain: list[tuple] = []  # (call, sent, ended) of calls answered by their one attempt
    notable: list[tuple] = []  # (call, sent, ended, kind index) of every other attempt
    for call in record["calls"]:
        attempts = call["attempts"]
        if len(attempts) == 1 and attempts[0]["outcome"] == "ok" and not call.get("copies"):
            only = attempts[0]  # most calls of a big job: no need to ask what kind of bar it is
            if only["sent"] is not None and only["ended"] is not None:
                plain.append((call["call"], only["sent"], only["ended"]))
                continue
        for i, attempt in enumerate(attempts):
            if attempt.get("sent") is None:
                continue
            kind = attempt_kind(call, attempt, later=i < len(attempts) - 1)
            end = attempt["ended"] if attempt.get("ended") is not None else now
            notable.append((call["call"], attempt["sent"], end, _BAR_KIND[kind]))
    total = len(plain) + len(notable)
    if total > MAX_BARS:  # every failure, an even sample of the other notable bars, then of the plain ones
        failed = [bar for bar in notable if bar[3] == _BAR_KIND["failed"]]
        other = [bar for bar in notable if bar[3] != _BAR_KIND["failed"]]
        room = MAX_BARS // 2 - len(failed)
        notable = failed + (other[:: math.ceil(len(other) / room)] if room > 0 and other else [])
        plain = plain[:: math.ceil(len(plain) / max(1, MAX_BARS - len(notable)))]
    created = record["created"]
    bars = sorted([c, round(sent - created, 3), round(end - created, 3), kind]
                  for c, sent, end, kind in (*((c, s, e, 0) for c, s, e in plain), *notable))
    # A running job's record holds the calls that reported so far: draw the rows and the time of the whole job.
    numbers = [c["call"] for c in record["calls"]] + [max(0, (record["summary"].get("calls") or 0) - 1)]
    end = max((b[2] for b in bars), default=0.0)
    if record["summary"].get("status") == "running":
        end = max(end, round(now - created, 3))
    return {"kinds": list(BAR_KINDS), "last_call": max(numbers),
            "bars": bars, "total": total, "end": end}


def failures(calls: list[dict]) -> dict:
    """The failed calls, first :data:`MAX_FAILURES`, each with its error and remote traceback."""
    failed = report.failed_calls(calls)
    shown = [{
        "call": c["call"],
        "items": report.item_range(c),
        "status": c["status"],
        "error": c.get("error"),
        "failed_items": c.get("failed_items"),
        "traceback": c.get("traceback"),
        "log_tail": c.get("log_tail"),
    } for c in failed[:MAX_FAILURES]]
    return {"total": len(failed), "calls": shown}


def call_output(call: int, reports: list[dict], found: list[tuple[int, int, str]]) -> dict:
    """A call's captured output per attempt (``found``: :func:`fnmap.observe.logs.read_logs`), each
    text cut to :data:`MAX_LOG_CHARS`, and what its status records say (``reports``:
    :func:`fnmap.observe.records.call_reports`): the attempts that reported, the items that failed in
    the last.  Its traceback is on the job's page (:func:`failures`)."""
    return {
        "call": call,
        "reported": [r["attempt"] for r in reports],
        "failed_items": reports[-1].get("failed_items") if reports else None,
        "attempts": [{"attempt": a, "text": _cut(text)} for c, a, text in found if c == call],
    }


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_LOG_CHARS:
        return text
    return text[:MAX_LOG_CHARS] + f"\n... ({len(text) - MAX_LOG_CHARS} more characters: fnmap logs)"
