"""The error a failed call is recorded and reported with: its first failing item's, from the
outcomes a worker sent back.  Used by the scheduler (control path) and kept out of
:mod:`fnmap.observe`, which only reads what the scheduler recorded."""

from __future__ import annotations

from .outcome import each, failure, succeeded

_TIMEOUT_ERROR = "fnmap.errors.TimeoutError"


def call_error(outcomes) -> tuple[str, str, str]:
    """``(status, "Type: message", remote traceback)`` of the first failing item of a call's outcomes,
    its traceback with the source lines this process can add (:func:`add_local_source_lines`)."""
    from .serialization import add_local_source_lines

    status, message, tb = remote_error(outcomes)
    return status, message, add_local_source_lines(tb)


def remote_error(outcomes) -> tuple[str, str, str]:
    """``(status, "Type: message", traceback)`` of the first failing item of a call's outcomes, as
    the worker saw it (what its status record keeps); ``("ok", "", "")`` when none failed."""
    for outcome in each(outcomes):
        if not succeeded(outcome):
            _data, tb, names = failure(outcome)
            lines = [line for line in tb.strip().splitlines() if line.strip()]
            message = lines[-1] if lines else names[0]
            return ("timeout" if _TIMEOUT_ERROR in names else "error"), message, tb
    return "ok", "", ""
