"""Running a call's items: the function over each item, under the call's timeout.

A chunk of 100,000 tiny items is as fast as its per-item loop: the plain run (:func:`run_items`)
makes the call and an append per item, nothing else, and the call's outcomes are the plain form
of :mod:`fnmap.runtime.outcome` when every item returned a value.  From an item's failure on, the
rest run one by one with an outcome each (the mixed form).

The timeout: in the main thread (emulator workers, Lambda, containers) a SIGALRM timer raises
:class:`Expired` into the running item; elsewhere (threads) the clock is read between items and
the client's timeout stops the call.  Nothing here imports the client side.
"""

from __future__ import annotations

import signal
import threading
import time
from time import monotonic

from ..errors import TimeoutError as CallTimeout
from .outcome import OK, all_ok, from_exception
from .wire import MODE_ONE


def run_items(func, items: list, mode: str, timeout: float | None, first_index: int):
    """The call's outcomes (:mod:`fnmap.runtime.outcome`): the plain form while every item returns
    a value; from an item's failure on, the mixed form, with that failure at its index.

    Per item the plain run makes the call and an append only: the timer (SIGALRM) stays armed over
    the whole run of items, and the clock is read between items only when the call has a timeout
    (a user ``except BaseException`` that swallows the timer's interrupt stops nothing more)."""
    with Deadline(timeout) as deadline:
        values, stopped = _run_plain(func, items, mode, deadline)
        if stopped is None or len(values) == len(items):  # all ran (the timer may fire after the last)
            return all_ok(values)
        index = len(values)
        outcomes = [(OK, v) for v in values]
        outcomes.append(_failed(timeout, first_index + index, stopped))
        _run_mixed(func, items, index + 1, mode, deadline, first_index, outcomes)
    return outcomes


class _NotStarted(Exception):
    """The clock said the call's timeout had expired before the item started."""


def _run_plain(func, items: list, mode: str, deadline: Deadline) -> tuple[list, BaseException | None]:
    """``(values, None)`` when every item returned a value; else the values of the items before the
    first that did not, and what stopped that one (its exception, the timer's, or :class:`_NotStarted`)."""
    values: list = []
    append = values.append
    end = deadline.end
    try:
        deadline.armed = True
        if end is None and mode == MODE_ONE:
            for item in items:
                append(func(item))
        elif end is None:
            for args, kwargs in items:
                append(func(*args, **kwargs))
        else:
            for item in items:
                if monotonic() >= end:
                    raise _NotStarted
                append(func(item) if mode == MODE_ONE else func(*item[0], **item[1]))
        deadline.armed = False
        return values, None
    except BaseException as e:  # noqa: B036 - SystemExit etc. in user code are outcomes too
        deadline.armed = False
        return values, e


def _failed(timeout: float | None, index: int, exc: BaseException) -> tuple:
    """The outcome of item ``index`` that ``exc`` stopped."""
    if isinstance(exc, (Expired, _NotStarted)):
        exc = timeout_error(timeout, index, started=isinstance(exc, Expired))
    return from_exception(exc)


def _run_mixed(func, items: list, start: int, mode: str, deadline: Deadline, first_index: int,
               outcomes: list) -> None:
    """Run ``items[start:]`` after a failure, one outcome each appended to ``outcomes``."""
    for offset in range(start, len(items)):
        item = items[offset]
        index = first_index + offset
        if deadline.expired():
            outcomes.append(from_exception(timeout_error(deadline.timeout, index, started=False)))
            continue
        try:
            deadline.armed = True
            value = func(item) if mode == MODE_ONE else func(*item[0], **item[1])
            deadline.armed = False
            outcomes.append((OK, value))  # outcome.ok(value), without a call per item
        except Expired:
            deadline.armed = False
            outcomes.append(from_exception(timeout_error(deadline.timeout, index, started=True)))
        except BaseException as e:  # noqa: B036 - SystemExit etc. in user code are outcomes too
            deadline.armed = False
            outcomes.append(from_exception(e))


def timeout_error(timeout: float | None, index: int, started: bool) -> CallTimeout:
    if started:
        return CallTimeout(f"item {index} exceeded the call timeout of {timeout} s and was stopped")
    return CallTimeout(f"item {index} was not started: the call timeout of {timeout} s had expired")


class Expired(BaseException):
    """Raised into user code by the timer; a BaseException so ``except Exception`` cannot swallow it."""


class Deadline:
    """Stops user code after ``timeout`` seconds.

    With the main thread (emulator workers, Lambda, containers) a SIGALRM timer
    raises into the running item, but only while ``armed``: inside user code, and
    over the plain run's loop, whose only bookkeeping is an append (an item the
    timer cuts off before its value was kept reads as stopped by the timeout).
    Elsewhere (threads) the deadline is only checked between items and the
    client's timeout applies.
    The handler is installed once and stays (installing and restoring it cost two
    system calls a call); it is installed again if user code replaced it.
    """

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.end = time.monotonic() + timeout if timeout else None
        self.armed = False
        self._use_signal = bool(
            timeout
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
        )

    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    def __enter__(self):
        global _current_deadline
        if self._use_signal:
            if signal.getsignal(signal.SIGALRM) is not _on_alarm:
                signal.signal(signal.SIGALRM, _on_alarm)
            _current_deadline = self
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        return self

    def __exit__(self, *exc):
        global _current_deadline
        if self._use_signal:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _current_deadline = None
        return False


#: The deadline the main thread's timer runs for (None between calls: a stray SIGALRM is ignored).
_current_deadline: Deadline | None = None


def _on_alarm(signum, frame):
    deadline = _current_deadline
    if deadline is not None and deadline.armed:
        deadline.armed = False
        raise Expired()
