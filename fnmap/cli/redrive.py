"""``fnmap redrive ID``: run a job's calls that have no committed result (``--failed``: and those whose
items failed), from this machine."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "redrive",
        help="run the calls of a stopped job that have no result (its client died, or was killed)",
        description="Run again exactly the calls of a job that have no committed result, with the "
        "function and inputs the job stored, from any machine with its storage and secret; a call "
        "still running elsewhere that commits first is the result (exactly once). Refused while a "
        "live client runs the job. Waits, then prints the job's summary; exits 0 if it succeeded. "
        "A job stopped at its cost cap (status capped) is finished with a new cap: --max-cost USD. "
        "A call whose items failed has its result (their errors): --failed runs it again under a new "
        "call id, whose outcomes then stand for those items; the failed call stays in the record as it ran.",
    )
    p.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    p.add_argument("--storage", metavar="URL", help="storage URL (default: the configured storage)")
    p.add_argument("--max-cost", type=float, metavar="USD",
                   help="the redrive's own cost cap in US dollars at list prices: it counts what the redrive "
                   "spends, not what the job spent before (default: the configured max_cost, FNMAP_MAX_COST "
                   "or fnmap.toml, else none; the job's old cap is not carried over)")
    p.add_argument("--failed", action="store_true",
                   help="also run again the calls whose items failed (a bug fixed in a module they import, a "
                   "transient error): their items get the new outcomes, the record keeps the failures")
    p.add_argument("--no-wait", action="store_true", help="start the calls, print the job id, return")
    p.add_argument("--json", action="store_true", help="print the job record as JSON at the end")
    p.set_defaults(run=run_redrive)


def run_redrive(args) -> int:
    from ..config import resolve
    from ..observe import records
    from ..redrive import redrive
    from ..storage import open_store
    from .jobs import format_summary

    if args.max_cost is not None and not 0 < args.max_cost < float("inf"):  # said here: config blames a keyword
        raise SystemExit(f"fnmap redrive: --max-cost {args.max_cost:g} must be a positive number of US dollars, "
                         "e.g. --max-cost 5")
    options = {"storage": args.storage, "max_cost": args.max_cost}
    config = resolve(**{name: value for name, value in options.items() if value is not None})
    store = open_store(config.storage_url, config.storage_origin, create=False)
    job_id = records.resolve_id(store, args.job_id)
    job = redrive(store, job_id, config=config, failed=args.failed)
    print(f"redriving job {job_id}: {len(job.run.calls)} calls", file=sys.stderr, flush=True)
    if args.no_wait:
        return 0
    job.wait()
    record = records.load(store, job_id)
    print(json.dumps(record, indent=2) if args.json else format_summary(record))
    return 0 if record["summary"]["status"] == "succeeded" else 1
