"""The cancel channel: ``fnmap cancel`` (or ``fnmap.job(ID).cancel()``) in any process asks the
client running a job to stop it, through one small object at :func:`fnmap.runtime.keys.cancel_key`.

It lives beside the key layout, not with the job records, so the control path (the client polling
for a request) imports nothing from :mod:`fnmap.observe`.
"""

from __future__ import annotations

import json
import time

from ..errors import FnmapError
from . import keys


def request_cancel(store, job_id: str, reason: str = "fnmap cancel") -> None:
    """Ask the client running ``job_id`` (in any process, on any machine) to cancel it."""
    store.put(keys.cancel_key(job_id), json.dumps({"reason": reason, "at": time.time()}).encode())


def cancel_requested(store, job_id: str) -> str | None:
    """Why ``job_id`` was asked to stop (see :func:`request_cancel`), or None."""
    try:
        return json.loads(store.get(keys.cancel_key(job_id))).get("reason") or "fnmap cancel"
    except (FnmapError, ValueError):  # KeyNotFound: nobody asked; a partial object: ask again later
        return None
