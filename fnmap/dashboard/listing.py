"""The front page's list of every job in storage, kept fresh at the cost of a poll.

``fnmap jobs`` reads the index (:mod:`fnmap.observe.history`) once: one LIST and a GET per job.
The front page asks every two seconds, for every job in storage (1,000 of them must list within
2 s), so :class:`JobList` keeps what it read: an entry whose job has ended changes only when a
redrive runs it again, so it is read again after :data:`RECHECK_SECONDS`; a running job's entry is
read and judged (:func:`fnmap.observe.history.judge_entry`: calls done, abandoned or not) at every
poll; new entries are read as they appear, 16 at a time.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..observe import history
from ..observe.report import FINAL
from ..runtime import keys
from .views import job_row

#: Seconds an ended job's entry is shown as read before it is read again.
RECHECK_SECONDS = 30.0
#: Index entries read at once.
READERS = 16


class JobList:
    """Every job's front-page row (:func:`fnmap.dashboard.views.job_row`), newest first."""

    def __init__(self, store, recheck: float = RECHECK_SECONDS):
        self.store = store
        self.recheck = recheck
        #: index key -> (monotonic time read, the entry as judged then); ended jobs only.
        self._ended: dict[str, tuple[float, dict]] = {}
        self._lock = threading.Lock()

    def summaries(self) -> list[dict]:
        """Every job's index summary as it stands now, newest first."""
        with self._lock:  # two tabs polling at once read storage once each, not interleaved
            entries = self.store.list(keys.job_index_prefix())
            entries.reverse()  # keys sort by creation time
            now = time.monotonic()
            cached = {k: self._ended[k] for k in entries if k in self._ended and now - self._ended[k][0] < self.recheck}
            wanted = [k for k in entries if k not in cached]
            fresh = dict(zip(wanted, self._read(wanted), strict=True))
            self._ended = dict(cached)
            for key, summary in fresh.items():
                if summary is not None and summary.get("status") in FINAL:
                    self._ended[key] = (now, summary)
            out = []
            for key in entries:
                summary = cached[key][1] if key in cached else fresh.get(key)
                if summary is not None:  # deleted meanwhile (gc), a partial object, or not a job's entry
                    out.append(summary)
            return out

    def rows(self) -> list[dict]:
        return [job_row(s) for s in self.summaries()]

    def _read(self, wanted: list[str]) -> list[dict | None]:
        if not wanted:
            return []
        with ThreadPoolExecutor(min(READERS, len(wanted))) as pool:
            return list(pool.map(self._read_one, wanted))

    def _read_one(self, key: str) -> dict | None:
        summary = history.read_entry(self.store, key)
        return None if summary is None else history.judge_entry(self.store, summary)
