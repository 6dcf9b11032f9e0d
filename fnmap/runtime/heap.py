"""Keep a worker process's freed memory for its next call (glibc only).

glibc returns the top of the heap to the system once more than twice the largest block it freed
recently is free there, so a worker that reads a 1 MB input per call gave the pages back after
each call and faulted them in again for the next: a third of a worker's CPU on 1 MB inputs
(``perf``: page faults, ``brk`` and the copy into fresh pages).  Fixed thresholds keep blocks up
to :data:`HEAP_BLOCKS` bytes on the heap and up to :data:`KEPT_FREE` bytes of it free between
calls; larger blocks are mapped and unmapped as before.  What is kept counts in the process's
resident memory, so both are small beside a call's memory limit (128 MB at least).
"""

from __future__ import annotations

import ctypes
import sys

#: Blocks up to this size come from the heap (glibc's ``M_MMAP_THRESHOLD``).
HEAP_BLOCKS = 4 << 20
#: Free bytes at the top of the heap kept rather than returned (glibc's ``M_TRIM_THRESHOLD``).
KEPT_FREE = 16 << 20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Set the thresholds in this process; False where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on
    except (OSError, AttributeError):  # musl has no mallopt
        return False
    # Both, and the mmap threshold first: setting either turns off glibc's own adjustment of both.
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS)) and bool(mallopt(_M_TRIM_THRESHOLD, KEPT_FREE))
