"""What the ``aws`` backend learns about a deployment besides its configuration, read once per
deployment (endpoint, region, function) and process, and cached.

* **Concurrency** (:func:`concurrency`): how many calls the platform runs at once for the function,
  its reserved concurrency (GetFunctionConcurrency) or else the account's unreserved concurrency
  (GetAccountSettings), never more than the account's.  Automatic chunking sizes its first wave
  of one-item calls to it (:class:`fnmap.feed.ChunkFeed`), not to the client's dispatch threads:
  64 one-item calls on a platform that runs 2 at once wait in its queue before anything bigger
  was measured.
* **Lost events** (:func:`event_bounds`): with the function's event invoke config at
  ``MaximumRetryAttempts`` 0 (what ``fnmap deploy aws`` sets), Lambda runs an ``Event`` call at
  most once, and only within ``MaximumEventAgeInSeconds`` of its acceptance, else drops it; so a
  call with no result ``MaximumEventAgeInSeconds`` + the function's ``Timeout`` after it was
  accepted never ran, and never will: it is lost, and sent again.  Without that config (Lambda
  retries an event for up to six hours), the old guess: ``Timeout`` + 120 s.

A lookup the credentials may not make (AccessDenied) or an endpoint that does not serve it
counts as unknown: the backend then works as before.
"""

from __future__ import annotations

import threading

from ..runtime import forks

#: Seconds an asynchronous call may sit in Lambda's queue and run before the client calls it lost,
#: on top of the function's own timeout, when the function's event age is not bounded by fnmap.
ASYNC_GRACE_SECONDS = 120.0

_cache: dict[tuple, object] = {}
_lock = threading.Lock()


@forks.at_fork
def _new_lock() -> None:
    """In a forked child: a fresh lock (a thread of the parent holding it at the fork is gone)."""
    global _lock
    _lock = threading.Lock()


def _cached(client, function_name: str, what: str, read):
    key = (client.meta.endpoint_url, client.meta.region_name, function_name, what)
    with _lock:
        if key in _cache:
            return _cache[key]
    value = read()
    with _lock:
        _cache[key] = value
    return value


def _ask(call, **kwargs) -> dict | None:
    """The answer of a Lambda API read, or None when it is refused, unserved or unreachable."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(**kwargs)
    except (ClientError, BotoCoreError):
        return None


def concurrency(client, function_name: str) -> int | None:
    """Calls the platform runs at once for the function; None when it does not say."""
    def read() -> int | None:
        account = (_ask(client.get_account_settings) or {}).get("AccountLimit") or {}
        reserved = (_ask(client.get_function_concurrency, FunctionName=function_name) or {}).get(
            "ReservedConcurrentExecutions")
        total = account.get("ConcurrentExecutions")
        found = [v for v in (reserved if reserved is not None else account.get("UnreservedConcurrentExecutions"),
                             total) if isinstance(v, int) and v > 0]
        return min(found) if found else None

    return _cached(client, function_name, "concurrency", read)


def event_bounds(client, function_name: str) -> dict:
    """The function's event invoke config (``MaximumRetryAttempts``, ``MaximumEventAgeInSeconds``),
    ``{}`` when it has none or it cannot be read."""
    def read() -> dict:
        answer = _ask(client.get_function_event_invoke_config, FunctionName=function_name) or {}
        return {k: answer[k] for k in ("MaximumRetryAttempts", "MaximumEventAgeInSeconds") if k in answer}

    return _cached(client, function_name, "events", read)


def lost_after(function: dict, bounds: dict) -> float:
    """Seconds after its acceptance that an ``Event`` call with no result is lost (see above)."""
    timeout = float(function.get("Timeout") or 900)
    age = bounds.get("MaximumEventAgeInSeconds")
    if bounds.get("MaximumRetryAttempts") == 0 and isinstance(age, int) and age > 0:
        return age + timeout
    return timeout + ASYNC_GRACE_SECONDS
