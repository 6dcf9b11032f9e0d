"""Redrive: run again, from any process with the storage and the secret, the calls of a job that
have no committed result, reusing the function and inputs the job stored.

What a map stores so that it can be redriven (both sealed with the deployment's secret, as results
are, so a redrive unpickles nothing it did not write), through the :class:`StorageRecorder` its front-end
hands the client with the job (a job of a kind that is not recorded, :mod:`fnmap.kinds`, gets none):

* before a batch of calls is sent, what they run: per call its id, first item, item count,
  function key, stored-input key or inline input (``keys.call_inputs_key``; one PUT per batch: a
  map with ``chunksize`` writes one, an automatically chunked map one per batch of calls its
  feed makes); a call is never sent before its inputs are stored;
* an automatically chunked map's items, at its start (``keys.job_items_key``; the pickle made to
  check every item pickles, stored instead of dropped): the items in no call yet when the client
  stopped are only there.

A redrive sends every call of the job again under its own id and with its own inputs.  Exactly
once holds because a result is committed first-writer-wins (``put_if_absent``): a call committed
already is answered from storage by the worker without running, and of a call that still runs
elsewhere (the stopped client's attempt) and this redrive's, the first to commit is the result.
Items in no call get new calls.  Jobs of ``fnmap.Executor`` and the Dask shim store nothing and
cannot be redriven.
"""

from __future__ import annotations

import math
import pickle
import types
import warnings
from typing import NamedTuple

from . import lease
from .client import get_client
from .config import resolve
from .errors import RedriveError
from .jobs import ResultSlot
from .kinds import KINDS, not_recorded
from .observe import records
from .observe.progress import make_progress
from .observe.report import usd
from .policy import chunks
from .runtime import keys, signing
from .runtime.serialization import loads, parts_size

#: An automatically chunked map stores its items for a redrive only up to this many bytes: larger
#: items would be stored twice (their calls store them too) and copied once more in memory.  A
#: redrive of such a map runs the calls it stored; items in no call yet are refused, saying so.
ITEMS_STORE_LIMIT = 16 << 20


class CallRecord(NamedTuple):
    """What one call runs, as stored before it is sent: enough to send it again under its own id."""

    call_id: int
    first_index: int
    n_items: int
    func_key: str
    #: Where its input is stored, or None: it travels inline, as ``payload``.
    items_key: str | None
    payload: bytes


class StorageRecorder:
    """Stores what a job's calls run, and an automatically chunked map's items, in the job's storage
    sealed with the deployment's secret: the :class:`fnmap.client.Recorder` that the front-ends
    hand the client for the jobs of a recorded kind (:mod:`fnmap.kinds`)."""

    def __init__(self, store, secret: bytes):
        self.store = store
        self.secret = secret

    def record_items(self, job, mode: str, parts: list) -> None:
        """Store the pickle of every item of ``job`` (``parts``), unless it is over ``ITEMS_STORE_LIMIT``:
        large items are stored by their calls, content-addressed, not a second time here."""
        if parts_size(parts) > ITEMS_STORE_LIMIT:
            return
        key = keys.job_items_key(job.id)
        self.store.put(key, signing.seal(self.secret, key, b"".join(parts)))

    def redrive(self, job, **options):
        """Run the calls of ``job`` that have no committed result (:func:`redrive`); the running job."""
        return redrive(job.store, job.id, **options)

    def record_calls(self, job, states: list) -> None:
        """Store what these calls of ``job`` run, before they are sent (one PUT); a failure is
        warned about, and the job runs on: only a later redrive of these calls is refused."""
        if not states:
            return
        entries = [CallRecord(s.call_id, s.first_index, s.n_items, s.func_key, s.items_key, bytes(s.payload or b""))
                   for s in states]
        try:
            _put_record(self.store, self.secret, keys.call_inputs_key(job.id, states[0].call_id), entries)
        except Exception as e:
            warnings.warn(f"fnmap: could not store the inputs of job {job.id} for a redrive: {e}",
                          RuntimeWarning, stacklevel=3)


def _get_sealed(store, secret: bytes, key: str):
    return loads(signing.unseal(secret, key, store.get(key)))


def _put_record(store, secret: bytes, key: str, entries: list) -> None:
    """Store ``entries`` (call records) at ``key``, as plain tuples: unpickling them needs no class."""
    data = pickle.dumps([tuple(entry) for entry in entries], protocol=5)
    store.put(key, signing.seal(secret, key, data))


def _records(store, job_id: str, secret: bytes):
    """``(key, entries)`` of each record :meth:`StorageRecorder.record_calls` stored for the job (one per
    batch sent), its entries as :class:`CallRecord`."""
    for key in store.list(keys.call_inputs_prefix(job_id)):
        yield key, [CallRecord(*entry) for entry in _get_sealed(store, secret, key)]


def stored_calls(store, job_id: str, secret: bytes) -> dict[int, CallRecord]:
    """Call id -> the :class:`CallRecord` of every call the job stored before sending it."""
    return {entry.call_id: entry for _, entries in _records(store, job_id, secret) for entry in entries}


def redrive(store, job_id: str, config=None, **options):
    """Run the calls of job ``job_id`` that have no committed result; the running
    :class:`fnmap.jobs.Job` (its ``results()`` are every item's, in order)."""
    config = config or resolve(**options)
    client = get_client(config)
    if client.store.url != store.url:
        raise RedriveError(f"job {job_id} is in {store.url} but the configured storage is {client.store.url}: "
                           f"pass storage={store.url!r}")
    summary = records.load(store, job_id)["summary"]  # judged: abandoned at once if its client is gone
    if lease.client_runs(summary):
        held = lease.read(store, job_id)
        who = (held or {}).get("holder") or summary.get("client") or {}
        raise RedriveError(f"job {job_id} is still running in {who.get('host')} pid {who.get('pid')} (its lease was "
                           "renewed in time): wait for it (fnmap.job(ID).wait()), or stop it with `fnmap cancel`")
    if summary["status"] == "succeeded":
        raise RedriveError(f"job {job_id} succeeded: every call has its result, nothing to redrive "
                           "(fnmap.job(ID).results() reads them)")
    if (summary.get("cost_cap") or {}).get("refused"):
        refused = summary["cost_cap"]["refused"]
        raise RedriveError(f"job {job_id} was refused before any call ran: its estimate {usd(refused['usd'])} was "
                           f"above max_cost=${summary['cost_cap']['max_cost']:g}, so its items were never stored; "
                           "run the map again with a larger max_cost")
    kind = summary.get("kind") or "map"
    if not KINDS[kind].recorded:
        raise RedriveError(not_recorded(job_id, kind))
    ordered, rest = _plan(store, job_id, client.secret, summary.get("items") or 0)
    # A stale cancel request would stop this run at once; the stale final record would stand while it runs.
    store.delete([keys.cancel_key(job_id), keys.job_record_key(job_id)])
    function = types.SimpleNamespace(__qualname__=summary.get("function") or "redrive")  # its name in `fnmap jobs`
    job = client.new_job(config, kind, function=function, job_id=job_id,
                         created=summary["created"], recorder=StorageRecorder(client.store, client.secret))
    return _submit(client, job, (ordered, rest), config)


def _plan(store, job_id: str, secret: bytes, n_items: int) -> tuple[list, object]:
    """The job's stored calls in id order, and its items in no call as ``(mode, first, items)`` (or None)."""
    try:
        calls = stored_calls(store, job_id, secret)
    except signing.UnauthenticatedObject as e:
        raise RedriveError(f"the stored inputs of job {job_id} do not hold for this secret ({e}): "
                           "redrive with the deployment's secret (FNMAP_SECRET)") from e
    if not calls:
        raise RedriveError(f"job {job_id} stored no inputs to redrive: only maps (fnmap.map, starmap, imap, "
                           "map_reduce) store them, Executor and Dask jobs do not")
    unknown = sorted(set(range(max(calls) + 1)) - set(calls))
    if unknown:
        raise RedriveError(f"calls {unknown[:10]} of job {job_id} have no stored inputs (the storage refused "
                           "them when they were sent): the job cannot be redriven; run the map again")
    ordered = [calls[i] for i in range(len(calls))]
    first = max(c.first_index + c.n_items for c in ordered)
    try:
        mode, items = _get_sealed(store, secret, keys.job_items_key(job_id))
    except (OSError, LookupError):  # KeyNotFound: chunksize was set (every call was made up front), or too large
        if first < n_items:
            raise RedriveError(
                f"job {job_id} has {n_items} items but its stored calls hold {first}; the rest were in no call "
                f"when its client stopped, and its items were over {ITEMS_STORE_LIMIT >> 20} MiB, so not stored "
                "for a redrive: run the map again (or pass chunksize= so every call is stored at the start)"
            ) from None
        return ordered, None
    return ordered, ((mode, first, items[first:]) if first < len(items) else None)


def _submit(client, job, plan: tuple, config):
    ordered, rest = plan
    states = [client.add_stored_call(job, call_id, first, n_items, func_key, items_key, payload,
                                     ResultSlot())
              for call_id, first, n_items, func_key, items_key, payload in ordered]
    total = sum(s.n_items for s in states)
    if rest is not None:
        mode, first, items = rest
        size = config.chunksize or max(1, math.ceil(len(items) / (4 * client.max_workers)))
        func_key = ordered[0].func_key
        for chunk in chunks(items, size):
            states.append(client.add_call(job, func_key, (mode, chunk), first, len(chunk), ResultSlot()))
            first += len(chunk)
        total = first
    client.show_progress(job, make_progress(config.progress, total, f"fnmap redrive {job.id[:12]}"))
    client.seal(job)
    client.submit(job, states)
    return job
