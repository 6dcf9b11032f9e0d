"""Remote ``print()`` output shown by the client: after a job (the ``output="after"`` option), or
as it happens (``output="live"``) through the descriptor the emulator's workers write to.

Workers capture each call's output; with ``output="after"`` they send it back with the call's
answer (bounded: :data:`fnmap.runtime.worker.OUTPUT_CHARS`) instead of writing it to the emulator's stderr,
where it cut into the progress bar and other calls' output mid-line.  The client prints it once
the job is over, per call and in call order, on its own stdout (in Jupyter: the running cell).
Nothing is read from storage here: a job of 100,000 calls does not fetch 100,000 log objects;
``fnmap logs JOB`` shows the rest.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading

from ..runtime import forks

#: Calls whose output is printed after a job; beyond them one line says how to see the rest.
MAX_CALLS_SHOWN = 50


def show_call_output(job, file=None) -> None:
    """Print the output that came back with ``job``'s calls, each under a short header.

    Calls with a failed item are left out: their output is in the raised exception's notes.
    With ``output="live"`` in a notebook: the lines the calls wrote are in the cell before it ends.
    """
    if job.config.output == "live" and _relay is not None:
        _relay.drain()
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


# -- output="live": where the emulator's workers write -------------------------------------------------


#: Longest a job's end waits for its ``live`` lines to reach its cell.
DRAIN_SECONDS = 2.0
#: What :meth:`_CellRelay.drain` writes into the pipe, and its thread takes out.
_SYNC = b"\x00fnmap-live-output-drained\x00"


class _CellRelay:
    """A pipe the workers write their output to in a Jupyter kernel, and the thread that writes what
    comes out of it to the running cell (``sys.stderr``), whole lines at a time.

    The kernel's own fd 2 is a pipe that ipykernel reads in chunks that cut lines, and copies to the
    kernel's real stderr (the Jupyter server's console): workers writing there had their lines of
    concurrent calls spliced in the cell and every line copied to the console.
    """

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, False)  # handed on explicitly (SCM_RIGHTS, Popen's stderr)
        self._synced = threading.Semaphore(0)
        # In an empty context: ipykernel sends what a thread writes to the cell its context names, and
        # with none to the running cell (a thread that inherited the first map's cell kept writing there).
        threading.Thread(target=contextvars.Context().run, args=(self._relay,), name="fnmap-live-output",
                         daemon=True).start()

    def drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """Return once what was written to the pipe before is in the cell (the calls of a job wrote
        their lines before answering: they are shown in its cell, not the next one)."""
        try:
            os.write(self.write_fd, _SYNC)
        except OSError:
            return
        self._synced.acquire(timeout=timeout)

    def _relay(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            synced = 0
            while (at := pending.find(_SYNC)) >= 0:
                pending, synced = pending[:at] + pending[at + len(_SYNC):], synced + 1
            # whole lines; at a drain all of it (a call's last line without its end, flushed as it ended)
            cut = len(pending) if synced else pending.rfind(b"\n") + 1
            if cut:
                whole, pending = pending[:cut], pending[cut:]
                try:
                    sys.stderr.write(whole.decode(errors="replace"))  # the running cell's, at each write
                except (OSError, ValueError):  # a closed stream at the kernel's exit: nothing to show it on
                    pass
            for _ in range(synced):
                self._synced.release()


_relay: _CellRelay | None = None
_relay_lock = threading.Lock()


@forks.at_fork
def _forget_relay() -> None:
    """In a forked child: the parent's relay thread is not there; the child makes its own if it needs one."""
    global _relay, _relay_lock
    _relay, _relay_lock = None, threading.Lock()


def workers_stderr() -> int | None:
    """The descriptor the emulator's workers (and an emulator of this process's own) write their
    ``live`` output to: this process's stderr, or in a Jupyter kernel a pipe whose lines reach the
    running cell whole and nothing else (:class:`_CellRelay`).  None: stderr is closed."""
    from .progress import in_kernel

    if not in_kernel():
        try:
            os.fstat(2)
        except OSError:
            return None
        return 2
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = _CellRelay()
        return _relay.write_fd
