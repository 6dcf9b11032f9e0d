"""Functions the streaming and timeout tests map: a nap that leaves a mark when it ends."""

from __future__ import annotations

import time


def nap_then_mark(args):
    """Sleep ``seconds``, then create the file at ``path``: a test sees whether a call ended."""
    seconds, path = args
    time.sleep(seconds)
    with open(path, "w"):
        pass
    return seconds
