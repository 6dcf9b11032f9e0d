"""Leases: which jobs a live client still runs, told through storage, from any machine.

While a client process runs a job it keeps a small JSON object at ``keys.lease_key(job_id)``::

    {"holder": {"host": ..., "pid": ..., "start": ...}, "renewed": t, "expires": t}

(epoch seconds).  One daemon thread per process renews the leases of all its running jobs every
sixth of the ``lease`` option (60 s by default, so every 10 s), one small PUT per job, never one
per call; a job's lease is deleted once the job is done.  A reader anywhere -- ``fnmap.job(ID)``,
``fnmap jobs``, ``fnmap job``, ``fnmap cancel``, ``fnmap redrive`` -- that finds an unfinished job
whose client is gone calls it ``abandoned`` (:func:`judge`, the one judge they all use), and
waiting on it ends.  A client is gone when its lease has expired (the only sign of a client on
another machine), and at once when the lease names a process of this host that no longer exists
(killed, crashed): a redrive right after a kill is not refused for the lease's remaining minute.

A process that exits (a script's end, a kernel restarted) while a map runs does not wait for the
lease to expire: at exit it abandons the job as Ctrl-C would (no retries, no copies; the platform
stops what it can) and marks the lease ``abandoned`` at once, so the record says ``abandoned``
rather than ``failed`` with the connection errors of an emulator stopping under its calls.  What
was committed stays; ``fnmap redrive ID`` runs the rest (:mod:`fnmap.redrive`).  Not abandoned: a
job cancelled by ``fnmap cancel``, or whose exception reached its caller (a map that raised as the
script ended); their exit waits briefly for them to settle, and they end ``cancelled`` or
``failed``, as their caller saw them (the latter's record was written when it raised).  Except the
interrupt of a notebook kernel's restart or shut-down (jupyter_client interrupts the running cell
before it asks the kernel to shut down): a KeyboardInterrupt that reached a job's caller shortly
before such a kernel exits was not the user's, and the job is ``abandoned`` too.

Clocks: ``expires`` is the holder's clock; readers on machines whose clocks differ by less than
the lease minus the renewal period (50 s by default) judge it right.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
import weakref

from .kinds import KINDS
from .observe.identity import client_process, gone_reason
from .observe.report import JUDGED as _JUDGED
from .runtime import forks, keys

#: How many renewals fit in one lease: a lease survives a few slow or failed renewals.
RENEWALS_PER_LEASE = 6
#: Status of a job whose client stopped before it finished: it gave the job up at its exit, its
#: process is gone, or its lease expired (:func:`gone`).
ABANDONED = "abandoned"
#: Longest a process's exit waits for its jobs cancelled by ``fnmap cancel`` to settle: the platform
#: was told to stop their calls in flight, and a script usually ends as its map raises
#: CancelledError, before the last stopped call is answered (then the job is ``cancelled`` as asked,
#: not ``abandoned``).  Calls a platform cannot stop (Lambda's) are not waited for longer than this.
SETTLE_CANCELLED_AT_EXIT_SECONDS = 5.0
#: A notebook kernel asked to shut down (JupyterLab's restart or shutdown) within this many seconds
#: of an interrupt that reached a job's caller: the interrupt was the shutdown's (jupyter_client
#: interrupts the running cell first), not the user's Ctrl-C, and the job is ``abandoned``.
SHUTDOWN_INTERRUPT_SECONDS = 10.0
#: Why a job stopped by its kernel's shutdown was abandoned.
KERNEL_SHUT_DOWN = "its notebook kernel was shut down or restarted while the job ran"


def holder() -> dict:
    """This process: host name, pid and start time (so a reused pid is not taken for it)."""
    return dict(client_process())


def read(store, job_id: str) -> dict | None:
    """The job's lease, or None (its client has not written it yet, or the job has ended)."""
    try:
        lease = json.loads(store.get(keys.lease_key(job_id)))
    except (OSError, ValueError, LookupError):  # KeyNotFound, or a partial object
        return None
    return lease if isinstance(lease, dict) else None


def gone(lease: dict, now: float | None = None) -> str | None:
    """Why the client holding ``lease`` runs its job no more, or None while it does: it gave the
    job up at its exit, its process is gone from this host (known at once: killed, crashed), or
    it stopped renewing the lease (a client on another machine, known when the lease expires)."""
    if lease.get("abandoned"):
        return str(lease["abandoned"])
    who = lease.get("holder")
    who = who if isinstance(who, dict) else {}  # a holder this host cannot read is not judged by pid
    reason = gone_reason(who)
    if reason:
        return reason
    now = time.time() if now is None else now
    if float(lease.get("expires") or 0) <= now:
        return (f"its client ({who.get('host')}, pid {who.get('pid')}) stopped renewing its lease "
                f"{now - float(lease.get('renewed') or 0):.0f} s ago")
    return None


def client_runs(summary: dict) -> bool:
    """Whether a live client runs the job of ``summary`` (judged by :func:`judge`, which
    :func:`fnmap.observe.records.load` applies): ``fnmap cancel`` then asks it to stop, and
    ``fnmap redrive`` refuses, so the two never disagree."""
    return summary["status"] == "running"


def live(lease: dict | None, now: float | None = None) -> bool:
    """Whether a client still holds this lease: renewed within its lifetime, not given up, and its
    process not gone from this host."""
    return bool(lease) and gone(lease, now) is None


def judge(store, record: dict) -> dict:
    """``record`` (a job record with its ``summary``, or a summary) with the status ``abandoned`` when
    the job did not finish and its client is gone: the one judge of abandonment that every reader
    (``fnmap.job``, ``fnmap jobs``/``job``/``cancel``/``redrive``, the dashboard, ``fnmap gc``) goes
    through.  Its lease says (:func:`gone`); a running job with no lease (not written yet, or a
    client killed before it was) is judged by the client its record names, when that ran on this
    host.  Changes ``record`` in place."""
    summary = record.get("summary", record)
    if summary.get("status") not in _JUDGED:
        return record
    lease = read(store, summary["job_id"])
    if lease is None:
        why = gone_reason(record.get("client") or summary.get("client")) if summary["status"] == "running" else None
    else:
        why = gone(lease)
        if why is None and summary["status"] == "unknown":  # no entry says it started, but a live client holds it
            summary["status"] = "running"
        if why is not None and not (lease.get("abandoned") or summary["status"] in ("running", "unknown", ABANDONED)):
            why = None  # it ended (failed, cancelled, capped) before its client went: that stands
    if why is not None:
        summary["status"] = ABANDONED
        summary["abandoned"] = why  # what the lease says (given up at exit) outranks a guess from the pid
    return record


class _Leases:
    """The leases this process holds: one daemon thread renews them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[str, tuple] = {}  # job id -> (weak reference to the job, store, lease seconds)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._holder: dict | None = None
        self._exiting = False
        self._writing = threading.Lock()
        #: Jobs whose caller an interrupt reached: (weak reference, when), the latest few.
        self._interrupted: list[tuple] = []

    def hold(self, job) -> None:
        """Take the lease of ``job`` and keep renewing it until the job is done: written by the
        renewing thread, woken now (the job's start does not wait for one more PUT)."""
        seconds = float(job.config.lease)
        with self._lock:
            if self._exiting:
                return
            held = self._held.get(job.id)
            if held is not None and held[0]() is job:  # its record written again: the lease is renewed already
                return
            if self._holder is None or self._holder["pid"] != os.getpid():  # a forked child is another holder
                self._holder, self._thread = holder(), None
                atexit.register(self.abandon_all)  # after the emulator's own stop: runs before it
            self._held[job.id] = (weakref.ref(job), job.store, seconds)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._renew_loop, name="fnmap-lease", daemon=True)
                self._thread.start()
        self._wake.set()  # write it now (a shorter lease than those held so far renews sooner too)

    def _write(self, store, job_id: str, seconds: float, abandoned: str | None = None) -> None:
        with self._writing:  # a renewal never lands after the mark of a job given up at exit, or its release
            if not abandoned and (self._exiting or job_id not in self._held):
                return
            now = time.time()
            lease = {"holder": self._holder, "renewed": now, "expires": now if abandoned else now + seconds}
            if abandoned:
                lease["abandoned"] = abandoned
            try:
                store.put(keys.lease_key(job_id), json.dumps(lease).encode())
            except Exception:  # storage hiccup: the next renewal tries again (a lease outlives 5 misses)
                pass

    def _renew_loop(self) -> None:
        while True:
            self._wake.clear()  # before the writes: a hold() meanwhile wakes the wait below at once
            with self._lock:
                held = list(self._held.items())
                if self._exiting or not held:  # nothing to renew: hold() starts another thread
                    self._thread = None
                    return
            period = min(seconds for _, (_, _, seconds) in held) / RENEWALS_PER_LEASE
            for job_id, (ref, store, seconds) in held:
                job = ref()
                if job is None or job.done:
                    self._release(job_id, store)
                else:
                    self._write(store, job_id, seconds)
            self._wake.wait(period)

    def _release(self, job_id: str, store) -> None:
        with self._writing:  # no renewal of it lands after the delete
            with self._lock:
                if self._exiting:
                    return
                self._held.pop(job_id, None)
            try:
                store.delete([keys.lease_key(job_id)])
            except Exception:  # it expires by itself
                pass

    def release(self, job) -> None:
        """``job`` is done and its final record written: its lease goes now, not at the next renewal
        (a ``fnmap gc`` right after the map would keep the job for a live lease)."""
        with self._lock:
            held = self._held.get(job.id)
        if held is not None and held[0]() is job:
            self._release(job.id, job.store)

    def interrupted(self, job) -> None:
        """A KeyboardInterrupt reached ``job``'s caller: ``cancelled``, as the user asked, unless this
        process exits as a notebook kernel asked to shut down (:meth:`_abandon_interrupted`)."""
        with self._lock:
            self._interrupted = [*self._interrupted[-15:], (weakref.ref(job), time.monotonic())]

    def _abandon_interrupted(self) -> set[str]:
        """At the exit of a notebook kernel asked to shut down: the jobs an interrupt stopped just
        before are abandoned, not cancelled (their lease says so, and their record); their ids."""
        if not _kernel_shutting_down():
            return set()
        now = time.monotonic()
        with self._lock:
            jobs = [ref() for ref, when in self._interrupted if now - when <= SHUTDOWN_INTERRUPT_SECONDS]
        given_up = set()
        for job in jobs:
            if job is None or job.raised is None or job.run.cancel_reason:
                continue
            self._write(job.store, job.id, float(job.config.lease), abandoned=KERNEL_SHUT_DOWN)
            job.give_up(KERNEL_SHUT_DOWN)
            given_up.add(job.id)
        return given_up

    def abandon_all(self) -> None:
        """At the process's exit: every job it still runs is abandoned, and says so in its lease
        (after a short wait for those that ended already but are settling: cancelled from outside,
        which then end ``cancelled``, or whose exception reached their caller).  A job whose
        exception reached its caller is not abandoned: its record, written when it raised, stands."""
        given_up = self._abandon_interrupted()
        self._settle_cancelled()
        with self._lock:
            self._exiting = True
            held, self._held = list(self._held.items()), {}
        for job_id, (ref, store, seconds) in held:
            job = ref()
            if job_id in given_up:
                continue
            if job is not None and not job.done and not KINDS[job.kind].given_up_at_exit:
                continue  # an Executor finishes its pending work at exit (as the standard library's); else it expires
            if job is not None and not job.done and job.raised is not None:
                job.save_ended_record()  # with what settled meanwhile; nobody renews the lease any more
                job = None
            if job is None or job.done:
                try:
                    store.delete([keys.lease_key(job_id)])
                except Exception:
                    pass
                continue
            reason = "its client process exited before the job finished"
            self._write(store, job_id, seconds, abandoned=reason)
            try:
                job.cancel(stop_platform=True)  # no retries against an emulator stopping, no copies
            except Exception:  # exiting anyway: the lease says what happened
                pass
            job.give_up(reason)  # its calls stopped, not left for readers to rebuild (the process ends first)

    def _settle_cancelled(self) -> None:
        """Wait (at most ``SETTLE_CANCELLED_AT_EXIT_SECONDS`` in all) for the jobs cancelled from
        outside, or stopped as their exception reached their caller, to settle; each writes its
        final record and releases its lease as it does."""
        with self._lock:
            jobs = [ref() for ref, _, _ in self._held.values()]
        deadline = time.monotonic() + SETTLE_CANCELLED_AT_EXIT_SECONDS
        for job in jobs:
            if job is not None and (job.run.cancel_reason or job.raised is not None) and not job.done:
                job.wait(max(0.0, deadline - time.monotonic()))

    def forget_in_child(self) -> None:
        """In a forked child: the parent's jobs and their leases stay the parent's (never renewed,
        released nor abandoned here); the child's own jobs get a renewing thread of their own."""
        forks.keep(self._held)
        self._lock, self._writing, self._wake = threading.Lock(), threading.Lock(), threading.Event()
        self._held, self._thread, self._holder, self._exiting = {}, None, None, False
        self._interrupted = []


def _kernel_shutting_down() -> bool:
    """Whether this process is a Jupyter kernel that was asked to shut down (its shell's ``exit_now``,
    which ipykernel sets on a shutdown or restart request)."""
    from .observe.progress import kernel_shell

    return bool(getattr(kernel_shell(), "exit_now", False))


_leases = _Leases()
hold = _leases.hold
release = _leases.release
interrupted = _leases.interrupted
forks.at_fork(_leases.forget_in_child)
