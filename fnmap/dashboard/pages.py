"""A job's page as JSON, made from its record, in a process of its own when the job is big.

Reading a 100,000-call record is ``json.loads`` of about 32 MB, a second or two during which
CPython's parser holds the GIL: made in the server's process, it would stall every other answer
(the page's own scripts, its summary, the front page's polls, a Prometheus scrape).  So the
dashboard's server makes job pages in one worker process (:class:`JobPages` with ``isolated``),
started and warmed with the dashboard, which sends back the page's JSON (a few hundred KB at
most: :mod:`.views` bounds it).  Also:

* the page is started as soon as its HTML is asked for (:meth:`JobPages.prefetch`), while the
  browser loads the scripts that will ask for it;
* a page asked for while it is being made waits for that one;
* an ended job's page is kept for :data:`.listing.RECHECK_SECONDS`, a few pages at most.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..errors import FnmapError
from ..observe import records
from ..observe.report import FINAL
from . import views
from .listing import RECHECK_SECONDS


class PageFailed(FnmapError, RuntimeError):
    """The process making job pages died (killed, out of memory); the next page starts another."""


def make_page(store, job_id: str) -> tuple[bytes, bool]:
    """``(the page's JSON, whether the job has ended)`` of ``job_id`` (or a unique prefix) in ``store``."""
    record = records.load(store, job_id)
    body = json.dumps(views.job_page(record), separators=(",", ":")).encode()
    return body, record["summary"]["status"] in FINAL


def call_page(store, job_id: str, call: int) -> bytes:
    """A call's captured output and status records as JSON (:func:`.views.call_output`): what that
    call left in storage, without reading the job's record."""
    from ..observe.logs import read_logs

    job_id = records.resolve_id(store, job_id)
    found = read_logs(store, job_id, call)
    return json.dumps(views.call_output(call, records.call_reports(store, job_id, call), found),
                      separators=(",", ":")).encode()


def _in_worker(make, url: str, *args):
    from ..storage import open_store

    return make(open_store(url, "the dashboard's storage", create=False), *args)


def _ready() -> bool:
    """Run once in a fresh worker, so the first page does not wait for its imports."""
    return True


class JobPages:
    """Job pages of ``store``; with ``isolated``, made in one worker process (see the module)."""

    KEEP = 8

    def __init__(self, store, isolated: bool = False, recheck: float = RECHECK_SECONDS):
        self.store = store
        self.recheck = recheck
        self._kept: dict[str, tuple[float, bytes]] = {}
        self._making: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._isolated = isolated
        self._pool: ProcessPoolExecutor | None = None
        if isolated:
            self._start_pool()

    def _start_pool(self) -> ProcessPoolExecutor:
        # spawn: a fork of the threaded server could copy a lock held by one of its threads
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        pool.submit(_ready)  # imports now, while nobody waits
        self._pool = pool
        return pool

    def prefetch(self, job_id: str) -> None:
        """Start making ``job_id``'s page in the background (its errors are the API's to report)."""
        threading.Thread(target=self._quietly, args=(job_id,), daemon=True, name="fnmap-dashboard-prefetch").start()

    def _quietly(self, job_id: str) -> None:
        with contextlib.suppress(Exception):
            self.page(job_id)

    def page(self, job_id: str) -> bytes:
        """The page's JSON: kept, being made (then waited for), or made now."""
        with self._lock:
            kept = self._kept.get(job_id)
            if kept is not None and time.monotonic() - kept[0] < self.recheck:
                return kept[1]
            making = self._making.get(job_id)
            mine = making is None
            if mine:
                making = self._making[job_id] = Future()
        if not mine:
            return making.result()
        try:
            body, ended = self._make(job_id)
        except BaseException as e:
            making.set_exception(e)
            raise
        finally:
            with self._lock:
                self._making.pop(job_id, None)
        if ended:
            with self._lock:
                self._kept[job_id] = (time.monotonic(), body)
                while len(self._kept) > self.KEEP:
                    self._kept.pop(next(iter(self._kept)))
        making.set_result(body)
        return body

    def call(self, job_id: str, call: int) -> bytes:
        """A call's output and status records as JSON."""
        return self._run(call_page, job_id, call)

    def _make(self, job_id: str) -> tuple[bytes, bool]:
        return self._run(make_page, job_id)

    def _run(self, make, job_id: str, *args):
        if not self._isolated:
            return make(self.store, job_id, *args)
        pool = self._pool or self._start_pool()
        try:
            return pool.submit(_in_worker, make, self.store.url, job_id, *args).result()
        except BrokenProcessPool as e:
            self._pool = None
            raise PageFailed(f"the process making job {job_id}'s page stopped ({e}); reload to try again") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
