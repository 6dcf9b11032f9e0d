"""The ``memory`` limit of a call or a container, enforced on this machine as Lambda and Batch do.

A process's peak resident memory is read from ``/proc/PID/status`` (``VmHWM``); writing ``5`` to
``/proc/PID/clear_refs`` resets that peak, so a warm worker's figure is the current call's own
(see :mod:`fnmap.runtime.peakmem`).  :class:`MemoryWatch` samples the peak while the process
runs and kills the process once it is over the limit, and says so; a spike shorter than the
sampling period is still seen afterwards, when the peak is read once more (a warm worker that
answered) or taken from ``wait4``'s ``ru_maxrss`` (a container that exited).  Where ``/proc``
is missing (not Linux), limits are not enforced.
"""

from __future__ import annotations

import os
import signal
import threading

#: Seconds between two looks at a watched process's peak memory.
SAMPLE_SECONDS = 0.02


def peak_kb(pid: int) -> int | None:
    """Peak resident memory of ``pid`` in KiB since its last reset (None when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak(pid: int) -> bool:
    """Start ``pid``'s peak afresh from its current resident memory; False where /proc refuses."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryWatch:
    """Kill ``pid`` (SIGKILL) once its peak resident memory passes ``limit_mb``, as a platform does.

    ``exceeded`` tells afterwards whether it was over; :meth:`check` looks once more (a spike
    between two samples) and :meth:`stop` ends the watch.
    """

    def __init__(self, pid: int, limit_mb: int):
        self.pid, self.limit_kb = pid, limit_mb * 1024
        self.exceeded = False
        self.peak_kb = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fnmap-memory-watch", daemon=True)
        self._thread.start()

    def check(self, peak: int | None = None) -> bool:
        """Whether the process went over the limit (``peak`` in KiB when known otherwise)."""
        peak = peak_kb(self.pid) if peak is None else peak
        if peak is not None:
            self.peak_kb = max(self.peak_kb, peak)
        if self.peak_kb > self.limit_kb:
            self.exceeded = True
        return self.exceeded

    def _watch(self) -> None:
        while not self._done.wait(SAMPLE_SECONDS):
            if self.check():
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def message(self, what: str) -> str:
        return (f"{what} used {self.peak_kb // 1024} MB, over its memory limit of "
                f"{self.limit_kb // 1024} MB, and was killed")
