"""Redrive: run again, from any process with the storage and the secret, the calls of a job that
have no committed result, reusing the function and inputs the job stored.

What a map stores so that it can be redriven (both sealed with the deployment's secret, as results
are, so a redrive unpickles nothing it did not write), through the
:class:`fnmap.recorder.StorageRecorder` its front-end hands the client with the job (a job of a kind
that is not recorded, :mod:`fnmap.kinds`, gets none):

* before a batch of calls is sent, what they run: per call its id, first item, item count,
  function key, stored-input key or inline input (``keys.call_inputs_key``; one PUT per batch: a
  map with ``chunksize`` writes one, an automatically chunked map one per batch of calls its
  feed makes); a call is never sent before its inputs are stored;
* a call the result cache answered (never sent, no input): its id, items and where their values
  came from, before its result is committed (one PUT each, :meth:`fnmap.client.Client.add_cached_call`):
  a redrive answers it from that result, and never gives its id to other items;
* an automatically chunked map's items, at its start (``keys.job_items_key``; the pickle made to
  check every item pickles, stored instead of dropped): the items in no call yet when the client
  stopped are only there.

A redrive sends every call of the job again under its own id and with its own inputs.  Exactly
once holds because a result is committed first-writer-wins (``put_if_absent``): a call committed
already is answered from storage by the worker without running, and of a call that still runs
elsewhere (the stopped client's attempt) and this redrive's, the first to commit is the result.
Items in no stored call get new calls: from the items a map run again holds (a named map,
:class:`Held`), else from the items the job stored.  ``failed=True`` also runs again, each under a
new call id over the same items, the calls whose items failed: their entries in the record stay
as they ran, and the later call's outcomes stand for those items (:func:`fnmap.observe.report.retried`).
A map run again with ``cache=`` stores cache entries for the items it runs, as a fresh run does.
Jobs of ``fnmap.Executor`` and the Dask shim store nothing and cannot be redriven.
"""

from __future__ import annotations

import math
import types
from typing import NamedTuple

from . import lease, recorder
from .client import get_client
from .config import resolve
from .errors import RedriveError
from .jobs import ResultSlot
from .kinds import KINDS, not_recorded
from .observe import records, report
from .observe.progress import make_progress
from .observe.report import usd
from .policy import chunks
from .recorder import CallRecord, StorageRecorder
from .runtime import keys, signing
from .runtime.outcome import open_committed
from .runtime.serialization import loads


def _get_sealed(store, secret: bytes, key: str):
    return loads(signing.unseal(secret, key, store.get(key)))


def _records(store, job_id: str, secret: bytes):
    """``(key, entries)`` of each record :meth:`StorageRecorder.record_calls` stored for the job (one per
    batch sent), its entries as :class:`CallRecord`."""
    for key in store.list(keys.call_inputs_prefix(job_id)):
        yield key, [CallRecord(*entry) for entry in _get_sealed(store, secret, key)]


def stored_calls(store, job_id: str, secret: bytes) -> dict[int, CallRecord]:
    """Call id -> the :class:`CallRecord` of every call the job stored before sending it."""
    return {entry.call_id: entry for _, entries in _records(store, job_id, secret) for entry in entries}


class Held(NamedTuple):
    """What a map run again holds (a named map, :mod:`fnmap.named`): its function and items, run
    for whatever the job's storage lacks (items in no stored call, inputs deleted as they committed)."""

    func: object
    #: How each item is passed (``fnmap.runtime.wire``: one argument, or a tuple of them).
    mode: str
    items: list


def redrive(store, job_id: str, config=None, *, failed: bool = False, held: Held | None = None, **options):
    """Run the calls of job ``job_id`` that have no committed result (``failed``: and, under new
    call ids, those whose items failed); the running :class:`fnmap.jobs.Job` (its ``results()``
    are every item's, in order).  ``held``: the function and items of a map run again."""
    config = config or resolve(**options)
    client = get_client(config)
    if client.store.url != store.url:
        raise RedriveError(f"job {job_id} is in {store.url} but the configured storage is {client.store.url}: "
                           f"pass storage={store.url!r}")
    record = records.load(store, job_id)  # judged: abandoned at once if its client is gone
    summary = record["summary"]
    _check_redrivable(store, job_id, record, failed)
    kind = summary.get("kind") or "map"
    stored = _stored_calls(store, job_id, client.secret)
    n_items = len(held.items) if held is not None else summary.get("items") or 0
    plan = _plan(store, job_id, client.secret, n_items, stored, held)
    retry = _retry_inputs(store, job_id, client.secret, _failed_calls(record, stored), held) if failed else []
    clear_last_run(store, job_id)
    function = held.func if held is not None else types.SimpleNamespace(__qualname__=summary.get("function")
                                                                        or "redrive")  # its name in `fnmap jobs`
    job = client.new_job(config, kind, function=function, job_id=job_id, created=summary["created"],
                         recorder=StorageRecorder(client.store, client.secret, redrive_job), first_run=summary)
    try:
        func_key = client.upload_function(held.func, job) if held is not None else None
        if held is not None and config.cache is not None:  # what it runs is cached, as a fresh run's is
            client.use_cache(job, held.func)
            job.cache.key_items(held.mode, held.items)
    except BaseException as e:
        client.setup_failed(job, e)
        raise
    return _submit(client, job, plan, retry, config, func_key, _attempts_seen(store, job_id, record))


def clear_last_run(store, job_id: str) -> None:
    """Before a job runs again under its own id: a stale cancel request would stop the run at once,
    the last run's final record would stand while it runs, and the lease of its killed client would
    call it abandoned until its own lease is written."""
    store.delete([keys.cancel_key(job_id), keys.job_record_key(job_id), keys.lease_key(job_id)])


def refused_at_start(summary: dict) -> bool:
    """Whether the job was refused at its start by its cost estimate: nothing ran, nothing was stored."""
    return bool((summary.get("cost_cap") or {}).get("refused"))


def _attempts_seen(store, job_id: str, record: dict) -> dict[int, int]:
    """Call id -> the highest attempt number any earlier run of the job used (the record's
    attempts, the workers' status records): a redrive numbers its attempts after them, so neither a
    status record nor a stop the platform remembers (an attempt stopped before it arrived) of an
    earlier attempt applies to a new one.  A killed client's attempts answered from a committed
    result or stopped leave neither: a stop of one of those that stops a new attempt is sent again
    (``Scheduler._judge``)."""
    seen: dict[int, int] = {}
    for call in record["calls"]:
        numbers = [a["attempt"] for a in call["attempts"] if a.get("attempt")]
        if numbers:
            seen[call["call"]] = max(numbers)
    for key in store.list(keys.status_prefix(job_id)):
        call_id, attempt = keys.call_attempt_of(key)
        seen[call_id] = max(seen.get(call_id, 0), attempt)
    return seen


def _check_redrivable(store, job_id: str, record: dict, failed: bool) -> None:
    """Raise :class:`RedriveError` saying why the job cannot be redriven now, if it cannot."""
    summary = record["summary"]
    if lease.client_runs(summary):
        held = lease.read(store, job_id)
        who = (held or {}).get("holder") or summary.get("client") or {}
        raise RedriveError(f"job {job_id} is still running in {who.get('host')} pid {who.get('pid')} (its lease was "
                           "renewed in time): wait for it (fnmap.job(ID).wait()), or stop it with `fnmap cancel`")
    kind = summary.get("kind") or "map"
    if not KINDS[kind].recorded:
        raise RedriveError(not_recorded(job_id, kind))
    if summary["status"] == "succeeded":
        raise RedriveError(f"job {job_id} succeeded: every call has its result, nothing to redrive "
                           "(fnmap.job(ID).results() reads them)")
    if summary["status"] == "failed" and not failed and not report.items_left(record):
        raise RedriveError(f"job {job_id} failed and every call has its result (or its error): nothing is left "
                           f"to redrive; `fnmap redrive {job_id[:12]} --failed` runs the calls whose items failed "
                           "again (fnmap.job(ID).redrive(failed=True))")
    if refused_at_start(summary):
        refused = summary["cost_cap"]["refused"]
        raise RedriveError(f"job {job_id} was refused before any call ran: its estimate {usd(refused['usd'])} was "
                           f"above max_cost=${summary['cost_cap']['max_cost']:g}, so its items were never stored; "
                           "run the map again with a larger max_cost")


def _stored_calls(store, job_id: str, secret: bytes) -> dict:
    try:
        return stored_calls(store, job_id, secret)
    except signing.UnauthenticatedObject as e:
        raise RedriveError(f"the stored inputs of job {job_id} do not hold for this secret ({e}): "
                           "redrive with the deployment's secret (FNMAP_SECRET)") from e


def _failed_calls(record: dict, stored: dict) -> list:
    """The stored calls whose items failed (an error committed as their result) and that no later
    call ran again: what ``failed=True`` runs again, each under a new call id."""
    again = report.retried_calls(record["calls"])
    return [stored[c["call"]] for c in record["calls"]
            if c["call"] in stored and c["call"] not in again
            and (c["status"] == "error" or (c["status"] == "ok" and c.get("failed_items")))]


def _retry_inputs(store, job_id: str, secret: bytes, calls: list, held: Held | None) -> list:
    """``(call, chunk)`` per call to run again: ``chunk`` is ``(mode, items)``, or None where the
    call's inline input is reused (a stored input is deleted when its call commits)."""
    if not calls or held is not None:
        return [(c, None if c.items_key is None else (held.mode, held.items[c.first_index:c.first_index + c.n_items]))
                for c in calls]
    if all(c.items_key is None for c in calls):
        return [(c, None) for c in calls]
    try:
        mode, items = _get_sealed(store, secret, keys.job_items_key(job_id))
    except (OSError, LookupError):
        deleted = [c.call_id for c in calls if c.items_key is not None]
        raise RedriveError(f"calls {deleted[:10]} of job {job_id} failed, and their inputs were deleted when their "
                           "errors were committed: run the map again with the same job_name (it holds the items), "
                           "or without one to run them all anew") from None
    return [(c, None if c.items_key is None else (mode, items[c.first_index:c.first_index + c.n_items]))
            for c in calls]


def _retry_call(client, job, call: CallRecord, chunk, func_key: str):
    """A new call of ``job`` over the items of ``call``, whose items failed: run again."""
    if chunk is None:
        return client.add_stored_call(job, len(job.run.calls), call.first_index, call.n_items, func_key, None,
                                      call.payload, ResultSlot())
    return client.add_call(job, func_key, chunk, call.first_index, call.n_items, ResultSlot())


def _plan(store, job_id: str, secret: bytes, n_items: int, calls: dict, held: Held | None) -> tuple:
    """The job's stored calls in id order, its items in no stored call as ``(mode, first, items)``
    runs (from ``held``, else from the items the job stored at its start), and what answers each
    call the cache answered (:func:`_cache_answers`).  A call id with a committed result but no
    record (its record was refused) is refused: a new call under it would be answered with it."""
    committed = {keys.call_id_from_key(k) for k in store.list(keys.results_prefix(job_id))}
    unknown = sorted((set(range(max(calls) + 1)) if calls else set()) - set(calls) | committed - set(calls))
    if unknown:
        raise RedriveError(f"calls {unknown[:10]} of job {job_id} have no stored inputs (the storage refused "
                           "them when they were sent): the job cannot be redriven; run the map again with "
                           "another job_name, or without one, to run it anew")
    ordered = [calls[i] for i in range(len(calls))]
    answers = _cache_answers(store, job_id, secret, ordered, committed, held)
    gaps = records.uncovered([(c.first_index, c.n_items) for c in ordered], n_items)
    if not gaps:
        return ordered, [], answers
    if held is not None:
        return ordered, [(held.mode, first, held.items[first:first + n]) for first, n in gaps], answers
    if not ordered:
        raise RedriveError(f"job {job_id} stored no calls to redrive: its client stopped before it sent any; run the "
                           "map again with the same job_name (it holds the function and items and finishes this job), "
                           "or without one to run it anew")
    try:
        mode, items = _get_sealed(store, secret, keys.job_items_key(job_id))
    except (OSError, LookupError):  # KeyNotFound: chunksize was set (every call was made up front), or too large
        missing = sum(n for _, n in gaps)
        raise RedriveError(
            f"job {job_id} has {n_items} items but {missing} of them are in no stored call: its client stopped "
            f"before it sent them, and the map stores its items only when automatically chunked and under "
            f"{recorder.ITEMS_STORE_LIMIT >> 20} MiB; run the map again with the same job_name (it holds the items and "
            "finishes this job), or without one to run them all anew") from None
    return ordered, [(mode, first, items[first:first + n]) for first, n in gaps], answers


def _cache_answers(store, job_id: str, secret: bytes, ordered: list, committed: set, held: Held | None) -> dict:
    """Call id -> ``("answered", outcomes)`` for each call the result cache answered (recorded before
    its result was committed), its committed outcomes read back; ``("run", (mode, items))`` for one
    whose client stopped before it committed them: its items run again, from ``held``."""
    answers = {}
    for call in ordered:
        if call.cached is None:
            continue
        if call.call_id in committed:
            key = keys.result_key(job_id, call.call_id)
            answers[call.call_id] = ("answered", open_committed(secret, key, store.get(key)))
        elif held is not None:
            answers[call.call_id] = ("run", (held.mode, held.items[call.first_index:call.first_index + call.n_items]))
        else:
            raise RedriveError(f"call {call.call_id} of job {job_id} was answered by the result cache, but its client "
                               "stopped before it stored the result: run the map again with the same job_name (it "
                               "holds the items and finishes this job)")
    return answers


def _submit(client, job, plan: tuple, retry: list, config, func_key: str | None, seen: dict):
    """Add the stored calls under their own ids (their attempts numbered after ``seen``), then new
    calls for the items in none and for those to run again (``retry``), and send them all."""
    ordered, rest, answers = plan
    states = []
    for call in ordered:
        how, answer = answers.get(call.call_id, (None, None))
        if how == "answered":  # by the result cache, in an earlier run: never sent
            states.append(client.add_answered_call(job, call, answer, ResultSlot()))
        elif how == "run":
            states.append(client.add_call(job, func_key or call.func_key, answer, call.first_index, call.n_items,
                                          ResultSlot()))
        else:
            states.append(client.add_stored_call(job, call.call_id, call.first_index, call.n_items, call.func_key,
                                                 call.items_key, call.payload, ResultSlot(),
                                                 first_attempt=seen.get(call.call_id, 0) + 1))
    func_key = func_key or (ordered[0].func_key if ordered else None)
    for mode, first, items in rest:
        size = config.chunksize or max(1, math.ceil(len(items) / (4 * client.max_workers)))
        for chunk in chunks(items, size):
            states.append(client.add_call(job, func_key, (mode, chunk), first, len(chunk), ResultSlot()))
            first += len(chunk)
    for call, chunk in retry:
        states.append(_retry_call(client, job, call, chunk, func_key or call.func_key))
    total = sum(s.n_items for s in states)
    client.show_progress(job, make_progress(config.progress, total, f"fnmap redrive {job.id[:12]}"))
    client.seal(job)
    client.submit(job, states)
    return job


def redrive_job(job, **options):
    """``job.redrive(**options)`` of a job this process runs: :func:`redrive` of its id in its storage."""
    return redrive(job.store, job.id, **options)
