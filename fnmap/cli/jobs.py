"""``fnmap jobs``, ``fnmap job ID``, ``fnmap logs ID``, ``fnmap gc``: look at jobs after the fact.

They read the records jobs leave in storage (:mod:`fnmap.observe.records`, the index of
:mod:`fnmap.observe.history`), so they
work from any machine that can reach the storage: ``--storage URL``, else the
configured storage (``FNMAP_STORAGE``, ``fnmap.toml``, the default folder).
A job id may be shortened to any unique prefix, as with git.
"""

from __future__ import annotations

import functools
import json
import sys
import time

from ..errors import StorageError
from ..observe import report

_STORAGE_HELP = "storage URL to read (default: the configured storage, FNMAP_STORAGE or fnmap.toml)"


def register(sub) -> None:
    p = sub.add_parser("jobs", help="list recent jobs", description="List recent jobs, newest first.")
    p.add_argument("--limit", type=int, default=20, help="how many jobs to show (default 20; 0 for all)")
    p.add_argument("--json", action="store_true", help="print the jobs' summaries as a JSON list")
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    p.set_defaults(run=_storage_errors(run_jobs))

    p = sub.add_parser(
        "job",
        help="show one job: calls, failures, retries, durations, throughput, cost",
        description="Summarize one job: calls, failures, retries, durations p50/p95/max, throughput and "
        "estimated cost; --json prints the whole record (every call's times and stats).",
    )
    p.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    p.add_argument("--json", action="store_true", help="print the job record as JSON")
    p.add_argument("--plot", metavar="PATH", help="also save a timeline and duration histogram (PNG, SVG, PDF)")
    p.add_argument("--watch", action="store_true",
                   help="follow a running job: one progress line a second until it ends (Ctrl-C stops watching)")
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    price = p.add_argument_group("cost estimate", "price the job as if it had run with other settings")
    price.add_argument("--memory", type=int, metavar="MB", help="Lambda memory per call")
    price.add_argument("--region", help="AWS region of the price table, e.g. eu-west-1")
    price.add_argument("--instance-type", metavar="TYPE", help="Batch instance type, e.g. g5.xlarge")
    p.set_defaults(run=_storage_errors(run_job))

    _register_cancel_logs_gc(sub)


def _register_cancel_logs_gc(sub) -> None:
    p = sub.add_parser(
        "cancel",
        help="stop a running job from any process or machine that reaches its storage",
        description="Ask the client running a job to cancel it: calls not started are cancelled, "
        "no more retries or copies are sent, the platform stops what it can, and the map in that "
        "client raises CancelledError. Exits 0 once asked (or if the job has ended already, saying so).",
    )
    p.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    p.add_argument("--wait", action="store_true", help="wait until the job has stopped")
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    p.set_defaults(run=_storage_errors(run_cancel))

    p = sub.add_parser("logs", help="print the captured output of a job's calls",
                       description="Print the stdout and stderr captured from a job's calls, per attempt.")
    p.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    p.add_argument("--call", type=int, metavar="N", help="only call N (see `fnmap job ID` for call numbers)")
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    p.set_defaults(run=_storage_errors(run_logs))

    p = sub.add_parser(
        "gc",
        help="delete old jobs' records, logs, inputs and results from storage",
        description="Delete every object of the jobs created longer ago than --older-than (records, "
        "logs, results: results stay in storage after a map returns, so fnmap.job(ID) can read them "
        "again, until gc removes them), then the shared function pickles and content-addressed "
        "inputs that no job left in storage uses. Reports objects and bytes; --dry-run deletes nothing.",
    )
    p.add_argument("--older-than", default="7d", metavar="AGE", help="age like 90s, 30m, 12h, 7d or 2w (default 7d)")
    p.add_argument("--dry-run", action="store_true", help="only report what would be deleted")
    p.add_argument("--cache", action="store_true", help="also delete result-cache entries older than --older-than "
                   "(left alone otherwise; `fnmap cache clear` deletes them too)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    p.set_defaults(run=_storage_errors(run_gc))


class StorageUnreadable(StorageError):
    """The storage could not be read for a reason its store did not name (the stores raise
    :class:`StorageError` themselves for a missing bucket, no credentials, an endpoint down)."""


def _storage_errors(run):
    """Report a boto3/botocore failure as one line naming the storage, like every other error."""

    @functools.wraps(run)
    def wrapper(args):
        try:
            return run(args)
        except Exception as e:
            if not type(e).__module__.startswith(("botocore", "boto3", "s3transfer")):
                raise
            where = args.storage or "the configured storage"
            raise StorageUnreadable(f"cannot read {where}: {type(e).__name__}: {e}") from e

    return wrapper


def _store(args):
    from ..config import resolve
    from ..storage import open_store

    if args.storage:
        return open_store(args.storage, f"--storage {args.storage!r}", create=False)
    config = resolve()
    return open_store(config.storage_url, config.storage_origin, create=False)  # reading creates nothing


# -- fnmap jobs ----------------------------------------------------------------


def run_jobs(args) -> int:
    from ..observe import history

    if args.limit < 0:
        raise SystemExit(f"fnmap jobs: --limit={args.limit} must be 0 (all) or more")
    store = _store(args)
    jobs = history.list_jobs(store, args.limit or None)
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print(f"no jobs in {store.url}", file=sys.stderr)
        return 0
    # A column for the cost cap only where a listed job has one: most lists have none.
    capped = any(s.get("cost_cap") for s in jobs)
    rows = [("JOB", "CREATED", "FUNCTION", "KIND", "BACKEND", "STATUS", "CALLS", "RETRIES", "WALL")
            + (("SPENT/CAP",) if capped else ())]
    for s in jobs:
        rows.append((s["job_id"][:12], _time(s["created"]), _short(s.get("function") or "-", 28), s.get("kind") or "-",
                     s.get("backend") or "-", s["status"], report.states_text(s), str(s["retries"]),
                     _seconds(s.get("wall_seconds"))) + ((report.spent_of_cap(s.get("cost_cap")),) if capped else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


# -- fnmap job ID ----------------------------------------------------------------


def run_job(args) -> int:
    from ..cost.pricing import job_cost
    from ..observe import records

    store = _store(args)
    if args.watch:
        return watch(store, args.job_id)
    record = records.load(store, args.job_id)
    asked = {"memory": args.memory, "region": args.region, "instance_type": args.instance_type}
    asked = {k: v for k, v in asked.items() if v is not None}
    if asked:
        record.setdefault("options", {}).update(asked)
        record["summary"]["cost"] = job_cost(record)
    if args.plot:
        from ..observe.plot import plot_record

        plot_record(record, args.plot)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(format_summary(record))
        if args.plot:
            print(f"plot     {args.plot}")
    return 0


def watch(store, job_id: str, period: float = 1.0) -> int:
    """``fnmap job ID --watch``: a progress line per ``period`` until the job ends, then its summary."""
    from ..observe import history, records

    job_id = history.resolve_id(store, job_id)
    while True:
        record = records.load(store, job_id)
        s = record["summary"]
        rate = s["throughput"]["calls_per_second"]
        print(f"{_time(time.time())}  {s['status']:<10} {s['calls_done']}/{s['calls']} calls done  "
              f"({report.states_text(s)})  retries {s['retries']}"
              + (f"  {rate:.1f} calls/s" if rate else ""), flush=True)
        if s["status"] in report.FINAL:
            print(format_summary(record))
            return 0 if s["status"] == "succeeded" else 1
        time.sleep(period)


def run_cancel(args) -> int:
    from ..attach import AttachedJob
    from ..lease import client_runs
    from ..observe import history, records
    from ..runtime.cancel import request_cancel

    store = _store(args)
    job_id = history.resolve_id(store, args.job_id)
    record = records.load(store, job_id)
    status = record["summary"]["status"]
    if not client_runs(record["summary"]):
        print(f"job {job_id} has ended already ({status}): nothing to cancel"
              + (f"; {report.redrive_advice(record)}" if status == "abandoned" else ""))
        return 0
    request_cancel(store, job_id)
    print(f"asked the client running job {job_id} to cancel it")
    if args.wait:
        job = AttachedJob(store, job_id)
        job.wait()
        print(f"job {job_id} stopped: {job.status}")
    return 0


def _memory_climbs(calls: list[dict]) -> list[str]:
    """One line per call (at most 5) whose attempts ran at different ``memory`` steps."""
    climbed = [c for c in calls if len({a.get("memory") for a in c["attempts"]} - {None}) > 1]
    lines = [f"memory   call {c['call']}: " + " -> ".join(f"{a.get('memory') or '?'} MB {a['outcome'] or 'running'}"
                                                     for a in c["attempts"]) for c in climbed[:5]]
    if len(climbed) > 5:
        lines.append(f"memory   ... and {len(climbed) - 5} more calls climbed (--json)")
    return lines


def format_summary(record: dict) -> str:
    """The human-readable summary ``fnmap job ID`` prints."""
    s = record["summary"]
    d, lat, tp = s["duration_seconds"], s["latency_seconds"], s["throughput"]
    lines = [
        f"job      {s['job_id']}  {s.get('kind') or '?'} on {s.get('backend') or '?'}  {s['status']}",
        f"function {s.get('function') or '-'}   from {s.get('origin') or '-'}",
        f"storage  {s.get('storage')}",
        f"created  {_time(s['created'])}   wall {_seconds(s['wall_seconds'])}",
        f"calls    {s['calls']} ({s['items']} items)   {_states_line(s)}   "
        f"retried {s['calls_retried']} ({s['retries']} retries)",
        f"workers  {s['workers']}   cold starts {s['cold_starts']}",
        f"duration p50 {_seconds(d['p50'])}   p95 {_seconds(d['p95'])}   max {_seconds(d['max'])}"
        "   (run time on the worker)",
        f"latency  p50 {_seconds(lat['p50'])}   p95 {_seconds(lat['p95'])}   max {_seconds(lat['max'])}"
        "   (submitted until the result came back)",
        f"rate     {_rate(tp['items_per_second'])} items/s   {_rate(tp['calls_per_second'])} calls/s",
        f"data     in {_bytes(s['bytes_in'])}   out {_bytes(s['bytes_out'])}   peak memory "
        + (f"{s['peak_memory_mb']:.0f} MB" if s.get("peak_memory_mb") else "-"),
        f"cost     {report.cost_text(s['cost'])}",
    ]
    if s.get("cache_hits"):
        lines.append(f"cache    {report.cache_text(record)}")
    if record.get("cost_cap"):
        lines.append(f"cost cap {report.cap_text(record)}")
    lines.extend(_memory_climbs(record["calls"]))
    if s.get("error"):
        lines.append(f"error    {s['error']} (before any call ran)")
    if s.get("raised"):
        lines.append(f"raised   {s['raised']['error']} (reached the job's caller, which stopped the calls still out)")
    if s["status"] == "abandoned":
        lines.append("note     the client that started this job is gone before it finished: "
                     + (s.get("abandoned") or "killed or crashed") + f"; {report.redrive_advice(record)}")
    if s["status"] == "failed" and s.get("failed_items"):
        lines.append(f"note     {report.redrive_advice(record)}")
    if s.get("items_unreported"):
        lines.append(f"no result {s['items_unreported']} items: their calls never ran or never reported "
                     "(fnmap.job(ID).results() has an exception in their place)")
    if record.get("rebuilt"):
        lines.append(f"note     {record['rebuilt']}")
    lines.extend(_failures(record))
    return "\n".join(lines)


def _failures(record: dict) -> list[str]:
    """The failed calls of ``fnmap job ID``: ten at most, the first traceback, where to read more."""
    s, lines = record["summary"], []
    failed = report.failed_calls(record["calls"])
    if failed:
        lines.append("failures:")
        for c in failed[:10]:
            lines.append(f"  call {c['call']} (item {report.item_range(c)}): {c['status']}: {c.get('error') or '?'}")
        first_traceback = next((c for c in failed if c.get("traceback")), None)
        if first_traceback:
            lines.append(f"traceback of call {first_traceback['call']} (the others: fnmap logs ID --call N):")
            lines.extend("  " + line for line in first_traceback["traceback"].rstrip().splitlines())
        if len(failed) > 10:
            lines.append(f"  ... and {len(failed) - 10} more (fnmap job {s['job_id'][:12]} --json)")
        lines.append(f"  output of a call: fnmap logs {s['job_id'][:12]} --call N")
    return lines


# -- fnmap logs ID ---------------------------------------------------------------


def run_logs(args) -> int:
    from ..observe import records
    from ..observe.logs import read_logs

    store = _store(args)
    record = records.load(store, args.job_id)
    job_id = record["job_id"]
    calls = {c["call"] for c in record["calls"]}
    if args.call is not None and args.call not in calls and "rebuilt" not in record:
        raise SystemExit(f"fnmap logs: job {job_id} has no call {args.call}; its calls are 0..{len(calls) - 1}")
    found = read_logs(store, job_id, args.call)
    tracebacks = {c["call"]: c["traceback"] for c in record["calls"]
                  if c.get("traceback") and (args.call is None or c["call"] == args.call)}
    if not found and not tracebacks:
        which = f"call {args.call} of job {job_id}" if args.call is not None else f"job {job_id}"
        print(f"{which} printed nothing (no output was captured)", file=sys.stderr)
        return 0
    for call in sorted({c for c, _, _ in found} | set(tracebacks)):
        for _, attempt, text in (entry for entry in found if entry[0] == call):
            sys.stdout.write(f"--- call {call} attempt {attempt} ---\n{text}")
            if not text.endswith("\n"):
                sys.stdout.write("\n")
        if call in tracebacks:
            sys.stdout.write(f"--- call {call} traceback ---\n{tracebacks[call].rstrip()}\n")
    return 0


# -- fnmap gc --------------------------------------------------------------------


def run_gc(args) -> int:
    from ..observe import gc

    try:
        age = gc.parse_age(args.older_than)
    except ValueError as e:
        raise SystemExit(f"fnmap gc: --older-than: {e}") from None
    store = _store(args)
    found = gc.collect_garbage(store, age, dry_run=args.dry_run)
    found["cache"] = _gc_cache(store, age, args.cache and not args.dry_run)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(found['deleted_jobs'])} job(s) older than {args.older_than} and "
          f"{len(found['deleted_shared'])} shared object(s) no kept job uses: {found['deleted_keys']} objects, "
          f"{_bytes(found['deleted_bytes'])}; kept {found['kept_jobs']} job(s), {_bytes(found['kept_bytes'])}")
    if args.dry_run:  # where the bytes are: each job's records, logs, inputs and results
        sizes = {**found["kept_job_bytes"], **found["deleted_job_bytes"]}
        largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
        if largest:
            print("largest jobs in storage:")
        for job_id, size in largest:
            fate = "would delete" if job_id in found["deleted_job_bytes"] else "kept"
            print(f"  {job_id[:12]}  {_bytes(size):>9}  {fate}")
    if found["kept_running_jobs"]:
        print(f"kept {len(found['kept_running_jobs'])} old job(s) that may still run (a live lease, or "
              "no final record and a client not known to be gone): " + ", ".join(found["kept_running_jobs"][:5]))
    if found["deleted_temporary"]:
        print(f"{verb} {len(found['deleted_temporary'])} temporary file(s) of killed writers, "
              f"{_bytes(found['deleted_temporary_bytes'])}")
    if found["kept_shared_because_running"]:
        print("kept every shared function and input: a kept job is still running")
    cache = found["cache"]
    if args.cache and not args.dry_run:
        print(f"deleted {cache['entries']} result-cache entries older than {args.older_than}, {_bytes(cache['bytes'])}")
    elif cache["entries"]:
        print(f"left alone the result cache: {cache['entries']} entries, {_bytes(cache['bytes'])} "
              "(`fnmap gc --cache` or `fnmap cache clear` deletes them)")
    if found["undated_jobs"]:
        print(f"left alone {len(found['undated_jobs'])} job(s) of unknown age (no record, no status): "
              + ", ".join(found["undated_jobs"][:5]))
    return 0


def _gc_cache(store, age: float, delete: bool) -> dict:
    """The result cache as ``fnmap gc`` leaves it: its entries and bytes, or with ``--cache`` those
    older than ``age`` deleted."""
    from ..cache.store import clear, listing

    if delete:
        return clear(store, older_than=age)
    rows = listing(store)
    return {"entries": sum(r["entries"] for r in rows), "bytes": sum(r["bytes"] for r in rows), "deleted": False}


# -- formatting ------------------------------------------------------------------


def _states_line(s: dict) -> str:
    """``fnmap job``'s calls per state, every state shown, failed with its items."""
    states = s.get("states") or {"done": s["calls_done"], "failed": s["calls_failed"]}
    shown = [name for name in report.CALL_STATES
             if (name in states or name != "done") and (name != "retried" or states.get(name))]
    return "   ".join(f"{name} {states.get(name, 0)}" + (f" ({s['failed_items']} items)" if name == "failed" else "")
                       for name in shown)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}"


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
