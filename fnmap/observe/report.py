"""What a job's record says to a person, said once for the command line, the dashboard, ``job.plot()`` and
the error messages: the states of a job and its calls, which calls failed, what is left, what to advise,
and how money reads (:func:`usd`).  It imports nothing that reads storage: the records and the lease import it.
"""

from __future__ import annotations

from ..cost.pricing import usd

#: Every status of a job (its summary's ``status``): not ended (``running``; ``unknown``, rebuilt
#: from status records without a start entry), then those it ends in.
JOB_STATUSES = ("running", "unknown", "succeeded", "failed", "cancelled", "capped", "incomplete", "abandoned")
#: Statuses after which nothing about a job changes any more.
FINAL = JOB_STATUSES[JOB_STATUSES.index("succeeded"):]
#: Statuses a lease can turn into ``abandoned``: a job that succeeded did all its work regardless.
JUDGED = tuple(status for status in JOB_STATUSES if status != "succeeded")
#: What a job's calls are counted as (its summary's ``states``), in the order they are shown.
CALL_STATES = ("succeeded", "done", "failed", "retried", "cancelled", "abandoned", "running")
#: Statuses of a call (an entry of a record's ``calls``) that has not ended.  An ended call is
#: ``ok``, ``cancelled`` (stopped, or never sent) or failed (any other: ``error``, ``timeout``, a fault).
UNFINISHED = ("pending", "running")


def ended(call: dict) -> bool:
    """Whether a call of a record has ended (ok, cancelled or failed)."""
    return call.get("status") not in UNFINISHED


def failed(call: dict) -> bool:
    """Whether a call of a record failed: it ended, neither ok nor cancelled."""
    return call.get("status") not in ("ok", "cancelled", *UNFINISHED)


def failed_calls(calls: list[dict]) -> list[dict]:
    """The calls of a record that failed, in order."""
    return [c for c in calls if failed(c)]


def item_range(call: dict) -> str:
    """The items of a call: ``7``, ``0..99``, ``?`` where its record does not say."""
    first = call.get("first_item")
    if first is None:
        return "?"
    return str(first) if call["items"] == 1 else f"{first}..{first + call['items'] - 1}"


def retried(spans) -> set:
    """The ids of the calls that a later call of their job ran again over the same items (``fnmap
    redrive --failed``, a named map run again): those items' outcomes are the later call's, and
    the earlier call's entry stays as it ran.  ``spans``: ``(call_id, first_item, items)`` per call."""
    latest: dict = {}
    earlier = set()
    for call_id, first, n in sorted(spans, key=lambda span: span[0]):
        if (first, n) in latest:
            earlier.add(latest[(first, n)])
        latest[(first, n)] = call_id
    return earlier


def retried_calls(calls: list[dict]) -> set:
    """:func:`retried` over the calls of a record."""
    return retried((c["call"], c["first_item"], c["items"]) for c in calls)


def items_left(record: dict) -> int:
    """Items with no outcome, which a redrive runs: those of calls with no committed result (stopped,
    never run, lost to a platform fault) and those no call reported.  A failed item's error is its
    call's committed result: ``redrive --failed`` runs it again."""
    again = retried_calls(record["calls"])
    no_result = sum(c["items"] for c in record["calls"]
                    if (not ended(c) or c["status"] not in ("ok", "error")) and c["call"] not in again)
    return no_result + (record["summary"].get("items_unreported") or 0)


def redrive_command(record: dict) -> tuple[str, str] | None:
    """The command that runs what a stopped job left, and what it runs; None when nothing is left."""
    left, short = items_left(record), record["job_id"][:12]
    failed_items = record["summary"].get("failed_items")
    if not left and failed_items and record["summary"].get("status") == "failed":
        return f"fnmap redrive {short} --failed", f"runs the {failed_items} failed item(s) again"
    if not left:
        return None
    if record["summary"].get("status") == "capped":  # without a cap of its own a redrive has none
        return f"fnmap redrive {short} --max-cost USD", f"runs the {left} item(s) left under a new cap"
    also = f" (with --failed, and the {failed_items} failed item(s) again)" if failed_items else ""
    return f"fnmap redrive {short}", f"runs the {left} item(s) left{also}"


def redrive_advice(record: dict) -> str:
    """What ``fnmap redrive`` would do for a job that stopped: run the items left, or nothing."""
    found = redrive_command(record)
    if found is None:
        return "every call has its result (or its error): nothing is left to redrive"
    return f"`{found[0]}` {found[1]}"


def states_text(summary: dict) -> str:
    """Calls per state, e.g. ``20 succeeded, 80 cancelled``; ``done/calls`` for a summary written
    before states were counted."""
    states = summary.get("states")
    if not states:
        return f"{summary['calls_done']}/{summary['calls']} done"
    return ", ".join(f"{states[name]} {name}" for name in CALL_STATES if states.get(name)) or "no calls"


def spent_of_cap(cap: dict | None) -> str:
    """A job's cost cap in a list: ``$spent/$cap``, ``-`` without a cap."""
    return f"{usd(cap['spent_usd'])}/{usd(cap['max_cost'])}" if cap else "-"


def cap_text(record: dict) -> str:
    """What is said of a capped job's cost cap (its record's ``cost_cap``): the cap, what was
    spent, and whether the job stopped there and how to finish it."""
    cap, short = record["cost_cap"], record["job_id"][:12]
    head = f"{usd(cap['max_cost'])}: {usd(cap['spent_usd'])} spent"
    if record["summary"]["status"] == "running" and cap.get("in_flight_usd"):
        head += f", {usd(cap['in_flight_usd'])} in flight"
    refused = cap.get("refused")
    if refused:  # nothing was sent, nothing stored to redrive: the map itself must run again
        return (f"{usd(cap['max_cost'])}: refused before any call, its estimate {usd(refused['usd'])} "
                f"({refused['basis']}) is above it ({refused['calls']} calls not run; raise max_cost "
                "and run the map again)")
    if not cap.get("reached"):
        return head + " (not reached)"
    return (head + f", stopped here ({cap.get('calls_not_run', 'some')} calls not run; "
            f"finish with fnmap redrive {short} --max-cost USD)")


def cost_text(cost: dict) -> str:
    """One line for a job's cost (its summary's ``cost``, :func:`fnmap.cost.pricing.job_cost`)."""
    if cost.get("usd") is None:
        return f"unknown ({cost.get('note', 'no estimate')})"
    assumed = cost.get("assumed") or []
    s3 = f"{cost.get('s3_puts', 0)} S3 PUTs + {cost.get('s3_gets', 0)} GETs"
    if cost["model"] == "aws-lambda":
        memory = f"{cost['memory_mb']} MB" + (" (assumed)" if "memory" in assumed else "")
        region = cost["region"] + (" (assumed)" if "region" in assumed else "")
        detail = f"AWS Lambda {region}, {memory}: {cost['gb_seconds']:.3f} GB-s + {cost['requests']} requests + {s3}"
    else:
        instance = cost["instance_type"] + (" (assumed)" if assumed else "")
        detail = f"AWS Batch on {instance}: {cost['instance_seconds']:.0f} instance-seconds + {s3}"
    return f"{usd(cost['usd'])}  {detail} (list prices of {cost.get('prices')})"


def cache_text(record: dict) -> str:
    """What ``fnmap job`` and the dashboard say of a record's result-cache hits (its calls'
    ``cached_from``): how many items, and the jobs whose entries answered them."""
    jobs = sorted({job for c in record["calls"] for _first, _n, job in c.get("cached_from") or ()})
    named = ", ".join(j[:12] for j in jobs[:5]) + (", ..." if len(jobs) > 5 else "")
    s = record["summary"]
    return f"{s['cache_hits']} of {s['items']} items from the result cache (no call sent), written by job(s) {named}"
