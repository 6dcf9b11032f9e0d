"""The second architectural rule, checked: the scheduler alone writes the run state.

A job's run state (:class:`fnmap.run.JobRun`), its calls' (:class:`fnmap.run.CallRun`) and their
attempts (:class:`fnmap.run.Attempt`) hold what the scheduler decided: counters, flags,
attempts, errors.  Only the scheduler's modules (``OWNERS``) assign them; everyone else reads them
(the user's ``Job``, the record, the feed) or asks the scheduler (``client.new_job(...)``,
``setup_failed``, ``cancel(reason=...)``).  When a front-end wrote a field itself, the rules about
a call were spread over five modules and no file showed who decided what (issue 22).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from fnmap.run import Attempt, CallRun, JobRun

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The modules that own the run state: the scheduler and the two parts it is split into.
OWNERS = {"fnmap/scheduler.py", "fnmap/dispatch.py", "fnmap/monitor.py", "fnmap/run.py"}
#: What the job handle (:class:`fnmap.jobs.Job`) records of how its job ended, written by the handle alone.
HANDLE_FIELDS = {"given_up", "raised"}
#: Every field of the run state, and of the handle's.
FIELDS = set(JobRun.__slots__) | set(CallRun.__slots__) | set(Attempt.__slots__) | HANDLE_FIELDS
#: Fields holding containers or events, and the calls that change them.
CONTAINERS = {"calls", "attempts", "durations", "call_errors", "stopped_attempts", "awaiting", "all_done", "wake"}
MUTATORS = {"append", "extend", "insert", "update", "add", "discard", "remove", "pop", "popitem", "clear",
            "setdefault", "set", "sort"}
#: Objects outside the run state whose attributes share a field's name: (module, receiver).
NOT_RUN_STATE = {
    ("fnmap/dask/__init__.py", "self.stats"),  # the shim's RunStats (calls, attempts of a Dask run)
    ("fnmap/runtime/worker.py", "resp"),  # the worker's CallResponse (its stats)
    ("fnmap/emulator/batch_jobs.py", "child"),  # the Batch emulator's array child (its attempts)
    ("fnmap/emulator/httpserver.py", "victim"),  # a connection's deadline (given up on a silent client)
}


def _writes(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """Every place ``tree`` assigns, deletes or changes a run-state field of another object."""
    found = []

    def check(target: ast.AST, line: int, how: str) -> None:
        if isinstance(target, ast.Subscript):  # job.call_errors[1] = ..., del state.awaiting[n]
            target = target.value
            if not (isinstance(target, ast.Attribute) and target.attr in CONTAINERS):
                return
        if not isinstance(target, ast.Attribute) or target.attr not in FIELDS:
            return
        receiver = ast.unparse(target.value)
        if receiver == "self" or (module, receiver) in NOT_RUN_STATE:  # an object's own attribute
            return
        found.append((line, f"{how} {ast.unparse(target)}"))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                    check(part, node.lineno, "assigns")
        elif isinstance(node, ast.Call):
            _check_call(node, check, found)
    return found


def _check_call(node: ast.Call, check, found: list) -> None:
    """A mutating method called on a run-state container, or ``setattr`` of a run-state field."""
    if isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name in MUTATORS and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in CONTAINERS:
            check(node.func.value, node.lineno, f"calls .{name}() on")
    elif isinstance(node.func, ast.Name) and node.func.id == "setattr" \
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in FIELDS:
        found.append((node.lineno, f"setattr(..., {node.args[1].value!r})"))


def _modules() -> list[pathlib.Path]:
    files = sorted((ROOT / "fnmap").rglob("*.py"))
    assert len(files) > 50, files
    return files


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_scheduler_writes_the_run_state(path):
    module = str(path.relative_to(ROOT))
    if module in OWNERS:
        return
    bad = [f"line {line}: {what}" for line, what in _writes(ast.parse(path.read_text(), module), module)]
    assert not bad, (f"{module} writes the run state, which the scheduler owns ({', '.join(sorted(OWNERS))}); "
                     "ask it instead (client.new_job(...), Scheduler.setup_failed, cancel(reason=...), "
                     f"job.give_up(reason)): {bad}")


@pytest.mark.parametrize("probe", [
    "job.run.cancel_reason = reason",
    "job.run.done_count += 1",
    "state.items_key = key",
    "job.function_name, job.run.setup_error = name, error",
    "job.run.calls.append(state)",
    "job.run.call_errors[1] = ('error', 'x')",
    "del state.awaiting[2]",
    "record.ending: str = 'ok'",
    "self.job.run.wake.set()",
    "setattr(job.run, 'speculate_open', True)",
    "job.given_up = reason",
])
def test_the_rule_sees_every_kind_of_write(probe):
    """The checker itself: each way of writing a field is found, in a module that is not an owner."""
    assert _writes(ast.parse(probe), "fnmap/api.py"), probe


def test_the_rule_leaves_reads_and_own_attributes_alone():
    probe = ("n = job.done_count\nself.calls = 0\nself.stats.calls = 3\nrun.progress.update(1)\n"
             "if state.done:\n    pass\nresults = [s.result for s in job.calls]\n")
    assert _writes(ast.parse(probe), "fnmap/dask/__init__.py") == []


def test_the_job_handle_is_read_only(tmp_path):
    """Outside the scheduler's modules nobody can write through the user's handle either."""
    from fnmap.backends.base import BaseBackend
    from fnmap.config import resolve
    from fnmap.jobs import Job
    from fnmap.scheduler import Scheduler
    from fnmap.storage import open_store

    class Unreachable(BaseBackend):
        name = "scripted"

    sched = Scheduler(Unreachable(), open_store(f"file://{tmp_path}"), b"secret")
    try:
        job = Job(sched, sched.store, resolve(backend="local", storage=sched.store.url, progress=False))
        with pytest.raises(AttributeError):  # the handle shows the run state once, read-only
            job.run = None
        with pytest.raises(AttributeError):  # the run state declares its fields: no new ones appear
            job.run.function_name = "f"
    finally:
        sched.close()
