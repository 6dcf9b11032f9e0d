"""Functions the streaming, async and timeout tests map: naps, one that leaves a mark, one that fails."""

from __future__ import annotations

import time


def nap_then_mark(args):
    """Sleep ``seconds``, then create the file at ``path``: a test sees whether a call ended."""
    seconds, path = args
    time.sleep(seconds)
    with open(path, "w"):
        pass
    return seconds


def nap(seconds):
    """Sleep ``seconds``; return them."""
    time.sleep(seconds)
    return seconds


def fails_on_two(x):
    """``x``, but a ValueError for 2: an item's failure among successes."""
    if x == 2:
        raise ValueError("two")
    return x
