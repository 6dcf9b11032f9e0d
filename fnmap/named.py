"""Named jobs: ``fnmap.map(f, items, job_name="nightly-2026-12-04")``.

A name is an idempotency key for a whole map, as an execution name is for Lambda's durable
functions.  The first map with a name claims it (``keys.job_name_key``, written first-writer-wins)
with the job id it will run under, the identity of its function (:func:`function_identity`: its
code, closure and globals, the same after a kernel restart) and the SHA-256 of its items' pickle.
A map under a name that exists, with the same items, finishes that job rather than running anew:
its results if it succeeded, the job itself if a live client still runs it, else a redrive
(:mod:`fnmap.redrive`) of the calls with no result and, under new call ids, of those whose items
failed, with the function and items this run holds for whatever storage lacks; a job its cost
estimate refused at its start (nothing ran, nothing stored) is started again under its id.  The function may
differ only to run again the items of a job that failed (a bug fixed); the name then accepts it
too.  Other items, or another function for a job with no failed items, are refused, saying which
differs.  :func:`claim` says which of these holds; the caller (:mod:`fnmap.api`) starts the map
when it is to run anew.

Clients that run one named job at the same moment, on any machines, start (or redrive) it once:
each run of the job under its id (the first, and each start again or redrive) is claimed
first-writer-wins before it starts (``keys.job_start_key``, numbered by the runs the job's record
counts), and a client that finds the run claimed by a live client waits until that run has
started and follows it.  A claim is held as a lease is (:func:`fnmap.lease.live`): a client that
stopped before it started the run, or took longer than the ``lease`` option to, is passed over.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from . import lease
from .attach import AttachedJob
from .chunk_pickle import dump_chunk
from .errors import ConfigError, KeyNotFound
from .observe.records import JobNotFound
from .redrive import Held, clear_last_run, redrive, refused_at_start
from .runtime import keys
from .runtime.serialization import pickle_function
from .runtime.setup import with_initializer

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class JobNameTaken(ConfigError):
    """``job_name`` names a job of another function or other items."""


@dataclass(frozen=True)
class Claim:
    """What a job name stands for now."""

    #: The id of the job the name stands for.
    job_id: str
    #: That job as it stands (its results if it succeeded or a live client runs it, else its
    #: redrive), or None: this map is to start it under ``job_id`` (the name was claimed now, or
    #: the process that claimed it stopped before the job started, or its estimate refused it).
    job: Any = None
    #: The summary of the job's earlier run when the map starts again under ``job_id`` (refused at
    #: its start by its cost estimate): who started it, and from where, stay the job's.
    first_run: dict | None = None


def check_name(name) -> None:
    """Raise if ``name`` cannot name a job (before anything starts or an item is read)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"job_name={name!r} is not a job name: use up to 200 letters, digits, '.', '_' "
                          "and '-', starting with a letter or digit, e.g. job_name='nightly-2026-12-04'")


def claim(client, config, name: str, func, items: list, mode: str = "one") -> Claim:
    """Claim ``name`` for ``func`` over ``items``, or find the job it names as it stands; refused
    (:class:`JobNameTaken`) if that job ran other items, or another function (unless it is run again
    for the job's failed items)."""
    check_name(name)
    identity = {
        "function": function_identity(with_initializer(func, config)),
        "function_name": getattr(func, "__qualname__", None) or type(func).__name__,
        "inputs": _items_digest(mode, items),
        "items": len(items),
    }
    key = keys.job_name_key(name)
    claimed = {"job_id": keys.new_job_id(), **identity, "created": time.time()}
    with client.storage_errors(f"claim the job name {name!r}"):
        won = client.store.put_if_absent(key, json.dumps(claimed).encode())
        named = claimed if won else json.loads(client.store.get(key))
    differs = _differs(named, identity)
    if named.get("inputs") != identity["inputs"]:
        raise _taken(name, named, differs)
    job_id, held = named["job_id"], Held(func, mode, items)
    found = _start_run(client, config, job_id, None, held) if won else None
    while found is None:  # as it stands, until this process runs it, or another does and is followed
        job = _as_it_stands(client, job_id, changed=bool(differs))
        if job is False:  # unless another client took this function for the job's failed items meanwhile
            with client.storage_errors(f"read the job name {name!r}"):
                named = json.loads(client.store.get(key))
            differs = _differs(named, identity)
            if differs:
                raise _taken(name, named, differs)
        elif isinstance(job, AttachedJob):
            found = Claim(job_id, job)
        else:
            if differs:  # a function run again over the job's failed items: the name accepts it from now on
                named["functions"] = [*named.get("functions", []), identity["function"]]
                with client.storage_errors(f"update the job name {name!r}"):
                    client.store.put(key, json.dumps(named).encode())
                differs = []
            found = _start_run(client, config, job_id, job, held)
    return found


def function_identity(func) -> str:
    """The SHA-256 of ``func``'s pickle with what differs from process to process and not in what
    it computes taken out: a notebook cell's code names the kernel's own file
    (``/tmp/ipykernel_<pid>/<cell hash>.py``), so the same cell run after a kernel restart is the
    same function."""
    data = pickle_function(func)[1]
    return hashlib.sha256(_KERNEL_FILE.sub(lambda m: b"\x8c\x00" + m.group(1), data)).hexdigest()


#: A notebook cell's file name in a pickle (a short string: its length byte, then the name up to the
#: kernel's pid).
_KERNEL_FILE = re.compile(rb"\x8c.([^\x8c]{0,200}?ipykernel_)\d+", re.DOTALL)


def _items_digest(mode: str, items: list) -> str:
    digest = hashlib.sha256()
    for part in dump_chunk((mode, items))[0]:
        digest.update(part)
    return digest.hexdigest()


def _functions(named: dict) -> list:
    """The function identities a name accepts: the first run's, and each that ran its failed items again."""
    return [named.get("function"), *named.get("functions", [])]


def _differs(named: dict, identity: dict) -> list:
    """What differs between the work a name ran and ``identity``, in words (empty: the same)."""
    differs = []
    if identity["function"] not in _functions(named):
        if named.get("function_name") == identity["function_name"]:
            differs.append(f"function {identity['function_name']} has changed (its code, closure or globals)")
        else:
            differs.append(f"function is {identity['function_name']}, not {named.get('function_name')}")
    if named.get("inputs") != identity["inputs"]:
        if named.get("items") != identity["items"]:
            differs.append(f"items are {identity['items']}, not {named.get('items')}")
        else:
            differs.append(f"{identity['items']} items differ in value")
    return differs


def _taken(name: str, named: dict, differs: list) -> JobNameTaken:
    return JobNameTaken(
        f"job_name={name!r} names job {named.get('job_id')}, which ran other work: the "
        + " and the ".join(differs) + ". A name re-attaches only to the same items and function (a changed "
        "function is taken only to run again the items of a job that failed); choose another job_name "
        f"(e.g. {name + '-2'!r}), or leave job_name out to run anew")


def _as_it_stands(client, job_id: str, changed: bool):
    """The named job as it stands: its handle if it succeeded or a live client runs it; its summary
    if it is to run again (its client stopped, its items failed, or its cost estimate refused it at
    its start); None if there is no job yet (the process that claimed the name has not started it,
    or stopped first); False if ``changed`` (another function) and the job has no failed items to run again."""
    try:
        attached = AttachedJob(client.store, job_id, secret=client.secret.decode())
    except JobNotFound:
        return None
    summary = attached.summary()
    if lease.client_runs(summary) or lease.live(lease.read(client.store, job_id)):
        return False if changed else attached
    if summary["status"] == "succeeded":
        return False if changed else attached
    if changed and not summary.get("failed_items"):
        return False
    return summary


def _runs(summary: dict | None) -> int:
    """How many runs of the job under its id have started, as ``summary`` tells (None: no job yet):
    its first, and each start again or redrive, which adds itself to its ``redriven``."""
    return 0 if summary is None else 1 + len(summary.get("redriven") or ())


def _start_run(client, config, job_id: str, summary: dict | None, held: Held) -> Claim:
    """Run the job again from where ``summary`` leaves it (None: start it), if this process is the
    first to claim that run (``keys.job_start_key``, first-writer-wins, as a lease that lasts
    ``config.lease``): started now under its id, its estimate checked against this ``max_cost`` if
    that refused it, else redriven.  If another client claimed it first, that client's run once it
    has started, to follow; a claim whose client stopped before it started the run is passed over."""
    run = _runs(summary)
    for attempt in itertools.count():
        key = keys.job_start_key(job_id, run, attempt)
        now = time.time()
        mine = {"holder": lease.holder(), "renewed": now, "expires": now + float(config.lease)}
        with client.storage_errors(f"claim the start of job {job_id}"):
            if client.store.put_if_absent(key, json.dumps(mine).encode()):
                break
        followed = _follow(client, job_id, run, key)
        if followed is not None:
            return followed
    try:
        if summary is None:
            return Claim(job_id)
        if refused_at_start(summary):  # this map starts it, its estimate checked against this max_cost
            clear_last_run(client.store, job_id)
            return Claim(job_id, first_run=summary)
        return Claim(job_id, redrive(client.store, job_id, config=config, failed=True, held=held))
    except BaseException:
        with contextlib.suppress(Exception):  # nothing started: the next client claims the run (else it expires)
            client.store.delete([key])
        raise


def _follow(client, job_id: str, run: int, key: str) -> Claim | None:
    """The job once run ``run``, claimed at ``key`` by another client, has started: that client's
    run, which this map waits for; None if the client stopped (or its claim expired) first."""
    delay = 0.1
    while True:
        with client.storage_errors(f"read the start of job {job_id}"):
            live = lease.live(_read(client.store, key))  # read first: a client gone then starts nothing after
            try:
                attached = AttachedJob(client.store, job_id, secret=client.secret.decode())
                if _runs(attached.summary()) > run:
                    return Claim(job_id, attached)
            except JobNotFound:
                pass
        if not live:
            return None
        time.sleep(delay)
        delay = min(1.0, delay * 1.5)


def _read(store, key: str) -> dict | None:
    """The JSON object at ``key``, or None if there is none (a claim deleted by its client)."""
    try:
        return json.loads(store.get(key))
    except KeyNotFound:
        return None
