"""The local emulator: plays the cloud on one machine.

``fnmap emulator`` serves the same WSGI app as ``handlers/http.py`` with a real
WSGI server (:mod:`.httpserver`, a thread per keep-alive connection), but runs
each invocation in a pool of warm worker processes so a crash, kill or hang
fails only its own call.
"""

import os


def default_workers() -> int:
    """Worker processes of an emulator when none is asked for: 2 x CPU cores, at least 4."""
    return max(4, 2 * (os.cpu_count() or 2))
