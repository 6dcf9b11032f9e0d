"""What a recorded job stores before its calls are sent, so that :mod:`fnmap.redrive` can send them
again from any process with the storage and the secret: the writing half, on every map's path
(the reading half, and the redrive itself, load only when a job is redriven or re-attached).
What is stored, and why, is said in :mod:`fnmap.redrive`'s docstring.
"""

from __future__ import annotations

import pickle
import warnings
from typing import NamedTuple

from .runtime import keys, signing
from .runtime.serialization import parts_size

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
    #: A call the result cache answered (never sent, no input): where its items' values came from
    #: (``[[first item, count, job id], ...]``); its result is committed once this is stored.
    cached: list | None = None


class StorageRecorder:
    """Stores what a job's calls run, and an automatically chunked map's items, in the job's storage
    sealed with the deployment's secret: the :class:`fnmap.client.Recorder` that the front-ends
    hand the client for the jobs of a recorded kind (:mod:`fnmap.kinds`)."""

    def __init__(self, store, secret: bytes, redrive):
        self.store = store
        self.secret = secret
        self._redrive = redrive

    def redrive(self, job, **options):
        """Run the calls of ``job`` that have no committed result: the ``redrive`` this recorder was
        given (:func:`fnmap.redrive.redrive_job`, loaded by the front end only when asked); the running job."""
        return self._redrive(job, **options)

    def record_items(self, job, mode: str, parts: list) -> None:
        """Store the pickle of every item of ``job`` (``parts``), unless it is over ``ITEMS_STORE_LIMIT``:
        large items are stored by their calls, content-addressed, not a second time here."""
        if parts_size(parts) > ITEMS_STORE_LIMIT:
            return
        key = keys.job_items_key(job.id)
        self.store.put(key, signing.seal(self.secret, key, b"".join(parts)))

    def record_calls(self, job, states: list) -> None:
        """Store what these calls of ``job`` run, before they are sent (one PUT); a failure is
        warned about, and the job runs on: only a later redrive of these calls is refused."""
        if not states:
            return
        entries = [CallRecord(s.call_id, s.first_index, s.n_items, s.func_key, s.items_key, bytes(s.payload or b""),
                              s.cached) for s in states]
        try:
            _put_record(self.store, self.secret, keys.call_inputs_key(job.id, states[0].call_id), entries)
        except Exception as e:
            warnings.warn(f"fnmap: could not store the inputs of job {job.id} for a redrive: {e}",
                          RuntimeWarning, stacklevel=3)


def _put_record(store, secret: bytes, key: str, entries: list) -> None:
    """Store ``entries`` (call records) at ``key``, as plain tuples: unpickling them needs no class."""
    data = pickle.dumps([tuple(entry) for entry in entries], protocol=5)
    store.put(key, signing.seal(secret, key, data))
