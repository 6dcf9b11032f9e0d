"""Progress bars for long jobs (tqdm: the widget in Jupyter, text in a terminal).

The bar counts items; its postfix shows calls done out of all calls, calls
whose items failed, and calls being retried right now (a retry or a
speculative copy in flight).  With no terminal and no notebook there is no bar
unless ``progress=True`` asks for one.
"""

from __future__ import annotations

import sys
import time

from ..locks import YieldingLock

#: Jobs with fewer items than this show no bar unless ``progress=True``.
MIN_ITEMS_FOR_AUTO = 100
#: Least seconds between two drawings of the bar (tqdm's own default refresh interval).
RENDER_SECONDS = 0.1


def in_kernel() -> bool:
    """True inside a Jupyter kernel (not merely in a process that imported ipykernel, as any
    jupyter_client that looks up kernel specs does)."""
    return kernel_shell() is not None


def kernel_shell():
    """The IPython shell of the Jupyter kernel this process is, or None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell if getattr(shell, "kernel", None) is not None else None


def _interactive() -> bool:
    if in_kernel():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _have_widgets() -> bool:
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


class Progress:
    """Items and calls done, failed and being retried; updated from dispatch threads."""

    def __init__(self, total: int, description: str, calls: int | None = None, file=None):
        if in_kernel() and _have_widgets():
            from tqdm.notebook import tqdm
        else:  # a terminal, or a notebook without ipywidgets: text (tqdm.auto would warn)
            from tqdm import tqdm
        self.failed = 0
        self.calls = calls
        self.calls_done = 0
        self.calls_failed = 0
        #: Items answered from the result cache (no call sent for them).
        self.cached = 0
        self._retrying: set[int] = set()
        self._lock = YieldingLock()
        #: Items done since the bar was last drawn, and when that was: the bar is drawn at most
        #: every RENDER_SECONDS, since tqdm's bookkeeping on every call more than doubled the
        #: client's CPU per call.
        self._unshown = 0
        self._shown_at = 0.0
        self._closed = False
        self._bar = tqdm(
            total=total, desc=description, unit="item", leave=True, dynamic_ncols=True, file=file
        )

    def update(self, n: int, failed: int = 0, call_id: int | None = None, cached: bool = False) -> None:
        """``n`` items of one call are done (``cached``: answered by the result cache), ``failed`` of
        them failed (nothing once the bar is closed: a job its caller gave up still settles, and its
        bar would be drawn again below whatever the caller printed next, a notebook's next cell)."""
        with self._lock:
            if self._closed:
                return
            self.calls_done += 1
            self.failed += failed
            self.cached += n if cached else 0
            if failed:
                self.calls_failed += 1
            if self._retrying:
                self._retrying.discard(call_id)
            self._unshown += n
            self._show(force=False)

    def retrying(self, call_id: int) -> None:
        """Call ``call_id`` is being sent again."""
        with self._lock:
            if self._closed:
                return
            self._retrying.add(call_id)
            self._show(force=False)

    def _show(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._shown_at < RENDER_SECONDS:
            return
        self._shown_at = now
        fields = {"calls": f"{self.calls_done}/{self.calls}" if self.calls else self.calls_done}
        if self.cached:
            fields["cached"] = self.cached
        if self.failed:
            fields["failed"] = self.failed
        if self._retrying:
            fields["retrying"] = len(self._retrying)
        self._bar.set_postfix(fields, refresh=False)
        self._bar.update(self._unshown)
        self._unshown = 0

    def refresh(self) -> None:
        """Draw the bar now with everything counted so far."""
        with self._lock:
            if self._closed:
                return
            self._show(force=True)
            self._bar.refresh()

    def close(self) -> None:
        """Draw the bar a last time and end its line; once (the job's last call and the caller
        that returns its results may both close it: the caller waits for the last draw)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._show(force=True)
            self._bar.close()


def make_progress(
    setting: bool | None, total: int, description: str, calls: int | None = None
) -> Progress | None:
    """A bar when asked (``True``), or by default for long jobs in a terminal or notebook."""
    if setting is False or total == 0:
        return None
    if setting is None and (total < MIN_ITEMS_FOR_AUTO or not _interactive()):
        return None
    return Progress(total, description, calls)
