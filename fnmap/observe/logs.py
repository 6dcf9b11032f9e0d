"""The captured stdout and stderr of a job's calls, one object per attempt (:func:`fnmap.runtime.keys.log_key`)."""

from __future__ import annotations

from ..runtime import keys


def logs_text(store, job_id: str, call: int | None = None) -> str:
    """Every call's (or call ``call``'s) captured output, by attempt, under a header each."""
    return "".join(f"--- call {c} attempt {a} ---\n{text}" + ("" if text.endswith("\n") else "\n")
                   for c, a, text in read_logs(store, job_id, call))


def read_logs(store, job_id: str, call: int | None = None) -> list[tuple[int, int, str]]:
    """Captured output as ``(call, attempt, text)``, by call then attempt."""
    prefix = keys.call_logs_prefix(job_id, call) if call is not None else keys.logs_prefix(job_id)
    found = sorted((*keys.call_attempt_of(key), key) for key in store.list(prefix))
    return [(c, a, store.get(k).decode("utf-8", errors="replace")) for c, a, k in found]
