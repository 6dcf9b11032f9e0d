"""Memory steps on Lambda: one function per step, so a retry can climb.

Lambda sets memory per function, for every call of it: changing the function's
``MemorySize`` (``UpdateFunctionConfiguration``) under a running job would change
it for every call, and a job's retries would race each other's changes.  So a
job's first ``memory`` step runs on the function itself (as ``memory=N`` does:
at most its ``MemorySize``), and each higher step ``M`` on its own function
``NAME-Mmb``, deployed once with ``fnmap deploy aws deploy --name NAME-Mmb
--memory M``.  Before a job with steps sends anything, each step's function is
looked up: a missing one, or one with less memory than its step, refuses the
job with the command that fixes it.
"""

from __future__ import annotations


def step_function(base: str, memory: int) -> str:
    """The function that runs calls climbed to ``memory`` MB."""
    return f"{base}-{memory}mb"


def function_for(base: str, steps: tuple, memory: int | None) -> str:
    """The function an attempt at ``memory`` MB (of the job's ``steps``) is sent to."""
    if len(steps) > 1 and memory is not None and memory != steps[0]:
        return step_function(base, memory)
    return base


def steps_problem(base: str, steps: tuple, memory_of) -> str | None:
    """Why the higher ``steps`` cannot run (None when each has its function with enough memory).

    ``memory_of(name)`` is the function's ``MemorySize``, or None when it does not exist.
    """
    problems = []
    for memory in steps[1:]:
        name = step_function(base, memory)
        found = memory_of(name)
        if found is None or found < memory:
            have = "does not exist" if found is None else f"has {found} MB"
            problems.append(f"Lambda function {name!r} {have}: `fnmap deploy aws deploy --name {name} "
                            f"--memory {memory}`")
    if not problems:
        return None
    listed = ", ".join(map(str, steps))
    return (f"memory=[{listed}]: a call killed for memory climbs to the next step's own function "
            f"(Lambda sets memory per function), and " + "; ".join(problems)
            + " (once per step); or ask for one memory")
