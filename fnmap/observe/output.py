"""Remote ``print()`` output shown by the client after a job (the ``output="after"`` option).

Workers capture each call's output; with ``output="after"`` they send it back with the call's
answer (bounded: :data:`fnmap.runtime.worker.OUTPUT_CHARS`) instead of writing it to the emulator's stderr,
where it cut into the progress bar and other calls' output mid-line.  The client prints it once
the job is over, per call and in call order, on its own stdout (in Jupyter: the running cell).
Nothing is read from storage here: a job of 100,000 calls does not fetch 100,000 log objects;
``fnmap logs JOB`` shows the rest.
"""

from __future__ import annotations

import sys

#: Calls whose output is printed after a job; beyond them one line says how to see the rest.
MAX_CALLS_SHOWN = 50


def show_call_output(job, file=None) -> None:
    """Print the output that came back with ``job``'s calls, each under a short header.

    Calls with a failed item are left out: their output is in the raised exception's notes.
    """
    if job.config.output != "after":
        return
    printed = [s for s in job.run.calls
               if s.stats and "output" in s.stats and not s.stats.get("failed_items")]
    if not printed:
        return
    file = file or sys.stdout
    lines = []
    for state in printed[:MAX_CALLS_SHOWN]:
        text = state.stats["output"]
        cut = state.stats.get("output_chars")
        lines.append(f"--- fnmap: output of {state.describe()} ---")
        lines.append(text.rstrip("\n"))
        if cut:
            lines.append(f"--- ({len(text)} of {cut} characters; all of it: "
                         f"fnmap logs {job.id} --call {state.call_id}) ---")
    if len(printed) > MAX_CALLS_SHOWN:
        lines.append(f"--- fnmap: {len(printed) - MAX_CALLS_SHOWN} more calls printed output: "
                     f"fnmap logs {job.id} ---")
    try:
        file.write("\n".join(lines) + "\n")
        file.flush()
    except (OSError, ValueError):  # a closed or broken stdout must not lose the results
        pass
