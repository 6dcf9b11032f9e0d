"""The warning a blocking front end gives when it is called from a coroutine on a running loop.

``fnmap.map(...)`` inside ``async def`` stalls the whole event loop until the map ends: every other
task of the loop (a web service's requests, a heartbeat) waits.  The call still works (fnmap's
blocking forms never need the caller's loop), but it warns once per line, at the user's line
(``warnings.warn_explicit``, as Modal does), naming the ``.aio`` twin to await instead.  A
notebook cell's own code is not a coroutine (its top level may ``await``, and a blocking call
there blocks only that cell), so it is not warned about.  ``blocking_warning=False`` or
``FNMAP_BLOCKING_WARNING=0`` silences it, as does ``warnings.filterwarnings`` with
:class:`BlockingCallWarning`.
"""

from __future__ import annotations

import inspect
import sys
import warnings

#: How far up the stack a coroutine calling a blocking form (through sync helpers) is looked for.
_DEPTH = 40
_COROUTINE_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class BlockingCallWarning(RuntimeWarning):
    """A blocking fnmap call was made from a coroutine, stalling its event loop."""


def warn_if_in_coroutine(what: str, rewrite: str, options: dict | None = None) -> None:
    """Warn at the user's line if this thread runs an event loop and the blocking call ``what``
    (``"fnmap.map(...)"``) was made from a coroutine; ``rewrite`` is the line to write instead."""
    if not _loop_running():  # no loop: nothing to stall
        return
    user = _user_frame()
    if user is None or not _in_coroutine(user) or not _enabled(options or {}):
        return
    module_globals = user.f_globals
    warnings.warn_explicit(
        f"{what} blocks this event loop until it ends (every other task of the loop waits): "
        f"await its async form instead, `{rewrite}`. Silence this with blocking_warning=False or "
        "FNMAP_BLOCKING_WARNING=0.",
        BlockingCallWarning, user.f_code.co_filename, user.f_lineno,
        module=module_globals.get("__name__", "<unknown>"),
        registry=module_globals.setdefault("__warningregistry__", {}), module_globals=module_globals,
    )


def warn_if_you_wait(what: str, rewrite: str, enabled: bool = True) -> None:
    """:func:`warn_if_in_coroutine` for a wait that fnmap's front ends and the standard library make
    too (a job's ``results()``, an Executor future's ``result()``): only when the line calling the
    method that waits (``sys._getframe(2)``) is neither fnmap's (``fnmap.map``'s own wait on its job:
    it warned already) nor ``concurrent.futures``' or ``asyncio``'s (a future that is done waits for
    nothing there).  ``enabled``: the ``blocking_warning`` option of the job waited on."""
    if not enabled or not _loop_running():  # the common case, first: a thread with no event loop
        return
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") == "fnmap.twins":  # a with_aio method's call
        frame = frame.f_back
    if frame is None or _is_fnmap(frame) or frame.f_globals.get("__name__", "").startswith(_WAITERS):
        return
    warn_if_in_coroutine(what, rewrite)


def _loop_running() -> bool:
    """Whether this thread runs an asyncio event loop (asyncio not imported: none does)."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and asyncio.events._get_running_loop() is not None


#: Modules whose calls of ``Future.result()`` are not yours to rewrite.
_WAITERS = ("concurrent.futures", "asyncio")


def _user_frame():
    """The innermost frame outside fnmap: the line that called the blocking form."""
    frame = sys._getframe(1)
    while frame is not None and _is_fnmap(frame):
        frame = frame.f_back
    return frame


def _is_fnmap(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == "fnmap" or name.startswith("fnmap.")


def _in_coroutine(frame) -> bool:
    """Whether ``frame`` runs in a coroutine: it or a caller is one, before a module's top level
    (a script, or a notebook cell: a cell that awaits is compiled as a coroutine named ``<module>``)."""
    for _ in range(_DEPTH):
        if frame is None or frame.f_code.co_name == "<module>":
            return False
        if frame.f_code.co_flags & _COROUTINE_CODE:
            return True
        frame = frame.f_back
    return False


def _enabled(options: dict) -> bool:
    """Whether the call's options (its other keywords, ``return_exceptions``..., left out) warn."""
    from .config import OPTIONS, resolve

    try:
        return bool(resolve(**{k: v for k, v in options.items() if k in OPTIONS}).blocking_warning)
    except Exception:  # a bad option: the call itself raises it, with its message
        return False
