"""A pool of warm worker processes for the emulator.

Each invocation borrows one idle process, sends it the request over a pipe and
waits for the answer.  If the process dies (segfault, ``os._exit``, SIGKILL),
or outlives the call's timeout plus a grace period, only that call fails; the
process is replaced in the background and the pool keeps serving.  A call can
also be stopped from another thread (:class:`Stopper`): its process is killed
and replaced the same way.  A call with a ``memory`` limit is watched
(:class:`fnmap.emulator.memlimit.MemoryWatch`): a worker whose peak resident
memory during the call goes past it is killed and replaced, and the call
ends ``out_of_memory``, as Lambda ends a function over its memory.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import select
import signal
import threading
import time

from ..runtime.batch_frames import pack_calls
from .memlimit import MemoryWatch, reset_peak
from .process import FIRST_READ, LENGTH, MANY, REQUEST_HEAD, VERIFIED, serve, write_message

#: The longest wait one poll(2) takes (its timeout is a C int of milliseconds).
_LONGEST_POLL_MS = 1 << 30
#: Seconds past a call's own timeout before its process is killed.
KILL_GRACE_SECONDS = 2.0
#: Seconds a closing pool gives busy workers before it kills them.
CLOSE_GRACE_SECONDS = 0.5


class WorkerDied(Exception):
    pass


class WorkerHung(Exception):
    pass


class Stopper:
    """Lets another thread stop one invocation: before it reaches a worker, or by killing the
    worker process running it (the client decided the call by another attempt)."""

    __slots__ = ("_lock", "_requested", "_event", "_worker", "_killed")

    def __init__(self):  # one per call: the Event is made only when someone waits on it
        self._lock = threading.Lock()
        self._requested = False
        self._event: threading.Event | None = None
        self._worker: WorkerProcess | None = None
        self._killed = False

    @property
    def stopped(self) -> threading.Event:
        """Set once the invocation was asked to stop."""
        with self._lock:
            if self._event is None:
                self._event = threading.Event()
                if self._requested:
                    self._event.set()
            return self._event

    def stop(self, kill: bool = True) -> None:
        """Stop the invocation: it reaches no worker from now on, and (``kill``) the one running it dies."""
        with self._lock:
            self._requested = True
            if self._event is not None:
                self._event.set()
            if kill and self._worker is not None and not self._killed:
                _sigkill(self._worker.proc)
                self._killed = True

    @property
    def requested(self) -> bool:
        """Whether the invocation was asked to stop."""
        return self._requested

    def attach(self, worker: WorkerProcess) -> bool:
        """The invocation is about to run on ``worker``; False when it was stopped already."""
        with self._lock:
            if self._requested:
                return False
            self._worker = worker
            return True

    def detach(self) -> bool:
        """The invocation left its worker; True when the worker was killed meanwhile (whatever
        it answered, it must not serve again)."""
        with self._lock:
            self._worker = None
            return self._killed


class WorkerProcess:
    """One child process running :func:`fnmap.emulator.process.serve` over a pipe.

    Children are forked by a fork server (:mod:`multiprocessing`'s ``forkserver``)
    that has already imported the worker routine, so a new or replacement worker
    starts in milliseconds instead of a fresh interpreter's few hundred: a killed
    worker then costs its call, not the job's CPU (``--kill-rate``).  The
    fork server is single-threaded, unlike the emulator, so forking it is safe.
    """

    def __init__(self, env: dict | None = None, client: dict | None = None):
        ctx = _context()
        self._conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=serve, args=(child, env, client), name="fnmap-worker", daemon=True)
        self.proc.start()
        child.close()
        self.pid = self.proc.pid
        self.calls = 0
        self.started = time.time()
        self._ready = False
        #: Answers read ahead by :meth:`receive` (the worker answers a batch's calls back to back).
        self._buffered = bytearray()
        self._fd = self._conn.fileno()
        self._poll = select.poll()  # one per worker: Connection.poll built a selector per call
        self._poll.register(self._fd, select.POLLIN)

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not self._ready:
            if self._recv(time.monotonic() + timeout) != b"R":
                raise WorkerDied("worker process did not start")
            self._ready = True

    def call(self, signature: str | None, body: bytes, timeout: float | None,
             verified: bool = False) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout if timeout else None
        signed = (signature or "").encode()
        self._send(REQUEST_HEAD.pack(VERIFIED if verified else 0, len(signed)), signed, body)
        return self.receive(deadline)

    def send_many(self, calls: list[tuple[str | None, bytes]], verified: bool) -> None:
        """Hand the worker several calls in one message; it answers each, in order (:meth:`receive`)."""
        self._send(REQUEST_HEAD.pack(MANY | (VERIFIED if verified else 0), 0), pack_calls(calls))

    def receive(self, deadline: float | None = None) -> tuple[int, bytes]:
        """The answer to the next call handed over: ``(status, the worker's response)``."""
        answer = self._recv(deadline)
        self.calls += 1
        (status,) = LENGTH.unpack_from(answer)
        return status, answer[LENGTH.size:]

    def _send(self, *parts) -> None:
        self.wait_ready()
        try:
            write_message(self._live_fd(), *parts)
        except (BrokenPipeError, OSError, ValueError) as e:
            raise WorkerDied(str(e)) from None

    def _live_fd(self) -> int:
        if self._conn.closed:  # never read or write a number the closed pipe's may have been reused for
            raise OSError("the worker's pipe is closed")
        return self._fd

    def _recv(self, deadline: float | None) -> bytes:
        """The next message from the worker.  It may have written several by the time this reads (a
        batch's answers come back to back): what follows the first is kept for the next."""
        buffered = self._buffered
        try:
            fd = self._live_fd()
            while True:
                end = LENGTH.size + LENGTH.unpack_from(buffered)[0] if len(buffered) >= LENGTH.size else 0
                if end and len(buffered) >= end:
                    break
                if deadline is not None:
                    while not self._poll.poll(min(_LONGEST_POLL_MS,
                                                  math.ceil(max(0, deadline - time.monotonic()) * 1e3))):
                        if time.monotonic() >= deadline:
                            raise WorkerHung()
                chunk = os.read(fd, max(FIRST_READ, end - len(buffered)))
                if not chunk:
                    raise EOFError
                buffered += chunk
        except (EOFError, OSError, ValueError, TypeError):  # TypeError: the pipe was closed under this read
            raise WorkerDied() from None
        message = bytes(buffered[LENGTH.size:end])
        del buffered[:end]
        return message

    def exit_description(self) -> str:
        self.proc.join(timeout=5)
        code = self.proc.exitcode
        if code is None:
            return "exit status unknown"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        _sigkill(self.proc)
        self.proc.join()
        self._conn.close()

    def close(self) -> None:
        """Ask the process to exit (end of its pipe), then make sure it did."""
        self._conn.close()
        self.proc.join(timeout=3)
        _sigkill(self.proc)
        self.proc.join()


_ctx = None
_ctx_lock = threading.Lock()


def _context():
    """The fork server context, with the worker routine imported once in the server."""
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            ctx = multiprocessing.get_context("forkserver")
            # The worker routine too: a shared emulator forks a client's workers when it attaches, and
            # each would otherwise import it first (25 ms of a fresh script's first map).
            ctx.set_forkserver_preload(["fnmap.emulator.process", "fnmap.runtime.worker",
                                        "fnmap.runtime.batch_frames", "fnmap.runtime.heap"])
            _ctx = ctx
        return _ctx


def start_fork_server() -> None:
    """Start the fork server now, so that the first pool's workers do not wait for it."""
    from multiprocessing import forkserver

    _context()
    forkserver.ensure_running()


class PoolClosed(Exception):
    """The pool was closed (its client session ended, or the emulator stops) while a call waited for a worker."""


class _IdleStack:
    """The idle workers, the last returned given first: ``queue.LifoQueue`` without its task
    counting and its notifications when nobody waits (a lock and a list on the per-call path).
    Closed, it wakes every call waiting for a worker (:class:`PoolClosed`) and drops those put back."""

    def __init__(self):
        self._items: list = []
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiting = 0
        self._closed = False

    def put(self, item) -> None:
        with self._lock:
            if self._closed:
                return
            self._items.append(item)
            if self._waiting:
                self._ready.notify()

    def put_under(self, item) -> None:
        """Put ``item`` below the others: given out after them."""
        with self._lock:
            self._items.insert(0, item)
            if self._waiting:
                self._ready.notify()

    def get(self):
        with self._lock:
            while not self._items:
                if self._closed:
                    raise PoolClosed()
                self._waiting += 1
                try:
                    self._ready.wait()
                finally:
                    self._waiting -= 1
            return self._items.pop()

    def close(self) -> list:
        """Stop handing out workers, wake every call waiting for one; the idle workers."""
        with self._lock:
            self._closed = True
            items, self._items = self._items, []
            self._ready.notify_all()
        return items


class PassedFd:
    """A file descriptor handed to a worker through the fork server (``SCM_RIGHTS``, as
    :mod:`multiprocessing` hands a pipe): the worker gets its own copy in :attr:`fd`."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return _passed_fd, (reduction.DupFd(self.fd),)


def _passed_fd(dup) -> PassedFd:
    return PassedFd(dup.detach())


class WorkerPool:
    """``size`` warm processes; ``execute`` runs one invocation on an idle one.

    ``env``: the workers' environment (None: the emulator's).  ``client``: what makes the workers
    a client's own (:func:`fnmap.emulator.process.serve`; its ``stderr`` a :class:`PassedFd`).
    ``start=False``: no process starts before the first call (a pool that may never be used)."""

    def __init__(self, size: int, env: dict | None = None, client: dict | None = None, start: bool = True):
        self.size = size
        self.env = env
        self.client = client
        self._started = False
        self._idle = _IdleStack()  # LIFO keeps the warmest busy
        self._all: set[WorkerProcess] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.crashes = 0
        self.timeouts = 0
        self.kills = 0
        self.out_of_memory = 0
        #: Moving average of how long a call takes in a worker (fault injection scales with it).
        self.typical_seconds = 0.01
        if start:
            self.start()

    def start(self) -> None:
        """Start the workers (once; a pool made with ``start=False`` starts at its first call)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        # The first call waits for one worker, not for all: the first started is handed out first,
        # the others go under it (on top, the last started was the first call's, which waited for it).
        for n in range(self.size):
            self._add(under=n > 0)

    def _add(self, ready_first: bool = False, under: bool = False) -> None:
        # Started under the lock: close() waits for a start in progress and then stops the new
        # worker too.  A child whose parent exited in the middle of its start printed the fork
        # server's EOFError tracebacks on the user's terminal after a Ctrl-C.
        with self._lock:
            if self._closed:
                return
            worker = WorkerProcess(self.env, self.client)
            self._all.add(worker)
        if ready_first:
            # A replacement joins the idle workers once it has started: the idle queue is LIFO,
            # so a still-booting process would otherwise make the next call wait for its start
            # while warm workers sit idle below it (kills must cost only the dead call).
            try:
                worker.wait_ready()
            except (WorkerDied, WorkerHung):
                pass  # its first call reports the crash, and it is replaced in turn
        if under:
            self._idle.put_under(worker)
        else:
            self._idle.put(worker)

    def _replace(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._all.discard(worker)
        threading.Thread(target=self._add, args=(True,), daemon=True).start()

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(w.pid for w in self._all)

    def execute(self, signature: str | None, body: bytes, timeout: float | None, *,
                kill_at: float | None = None, cold_start: float = 0.0,
                stopper: Stopper | None = None, memory: int | None = None,
                verified: bool = False) -> tuple[str, int, bytes, dict]:
        """Run one invocation; return ``(ending, status, body, info)``.

        ``ending`` is ``ok``, ``crashed``, ``timeout``, ``stopped`` (by ``stopper``),
        ``out_of_memory`` (over ``memory`` MB; ``info["memory"]`` says how much it used) or
        ``closed`` (the pool closed before a worker was free: it ran nowhere);
        ``info`` has the worker's pid.
        Fault injection: ``cold_start`` seconds are spent first on a worker's first call;
        with ``kill_at`` the worker is SIGKILLed that fraction of a typical call's duration
        after it was handed the call, and its answer, if it gave one, dies with it.
        ``verified``: the caller verified the signature with the workers' secret (the worker does not).
        """
        if stopper is not None and stopper.requested:  # stopped before any worker got it: run nowhere
            return "stopped", 0, b"", {}
        if not self._started:
            self.start()
        try:
            worker = self._idle.get()
        except PoolClosed:
            return "closed", 0, b"", {}
        info = {"pid": worker.pid, "cold": worker.calls == 0}
        if stopper is not None and not stopper.attach(worker):  # stopped while it waited for a worker
            self._idle.put(worker)
            return "stopped", 0, b"", {}  # no pid: it ran on none, none was killed
        if not memory:
            return self._execute(worker, info, (signature, verified), body, timeout, kill_at, cold_start, stopper)
        try:
            worker.wait_ready()  # its start-up is not the call's memory
        except (WorkerDied, WorkerHung):
            pass  # the call reports the dead worker
        reset_peak(worker.pid)
        watch = MemoryWatch(worker.pid, memory)
        try:
            return self._execute(worker, info, (signature, verified), body, timeout, kill_at, cold_start, stopper,
                                 watch)
        finally:
            watch.stop()

    def execute_many(self, calls: list[tuple[str | None, bytes, Stopper]],
                     verified: bool = False) -> list[tuple[str, int, bytes, dict]]:
        """Run calls with no timeout, memory limit or injected fault, one after another, handed to a
        worker in one message; one ``(ending, status, body, info)`` per call, as :meth:`execute`.

        A call that crashes its worker or is stopped ends as it would alone; the calls after it,
        which its worker had not started, go to another worker.  Saves a message and a wake-up
        each way per call, for short calls sent together (``POST /invoke-many``).
        """
        results: list = []
        while len(results) < len(calls):
            results += self._run_on_one_worker(calls[len(results):], verified)
        return results

    def _run_on_one_worker(self, calls: list, verified: bool) -> list[tuple[str, int, bytes, dict]]:
        """Hand ``calls`` to one idle worker; the results of those it got to (one at least)."""
        if calls[0][2].requested:  # stopped before any worker got it (its client hung up): run nowhere
            return [("stopped", 0, b"", {})]
        if not self._started:
            self.start()
        try:
            worker = self._idle.get()
        except PoolClosed:
            return [("closed", 0, b"", {})]
        results = []
        try:
            worker.send_many([(signature, body) for signature, body, _ in calls], verified)
        except WorkerDied:
            return [self._died(worker, {"pid": worker.pid, "cold": worker.calls == 0}, None, None, None)]
        for _signature, _body, stopper in calls:
            info = {"pid": worker.pid, "cold": worker.calls == 0, "together": len(calls)}
            if not stopper.attach(worker):
                # Stopped before its turn, which may have come: a batch's calls are short, so its end
                # costs less than killing and replacing the worker; its answer is dropped.
                try:
                    worker.receive()
                except WorkerDied:
                    results.append(self._died(worker, info, None, None, None))
                    return results
                results.append(("stopped", 0, b"", {"together": len(calls)}))  # no pid: none was killed
                continue
            started = time.monotonic()
            try:
                status, out = worker.receive()
            except WorkerDied:
                results.append(self._died(worker, info, None, stopper, None))
                return results
            if stopper.detach():  # killed just after it answered
                results.append(self._stopped(worker, None, info))
                return results
            self.typical_seconds = 0.8 * self.typical_seconds + 0.2 * (time.monotonic() - started)
            results.append(("ok", status, out, info))
        self._idle.put(worker)
        return results

    def _execute(self, worker: WorkerProcess, info: dict, signed: tuple, body, timeout, kill_at,
                 cold_start, stopper: Stopper | None,
                 watch: MemoryWatch | None = None) -> tuple[str, int, bytes, dict]:
        if info["cold"] and cold_start:
            time.sleep(cold_start)
        hard_timeout = timeout + KILL_GRACE_SECONDS if timeout else None
        killer = None
        if kill_at is not None:
            killer = threading.Timer(kill_at * self.typical_seconds, _sigkill, (worker.proc,))
            killer.start()
        started = time.monotonic()
        try:
            status, out = worker.call(signed[0], body, hard_timeout, verified=signed[1])
            if killer is not None:
                killer.join()  # the kill lands even when the call answered first
                worker.proc.join()
                raise WorkerDied()
        except WorkerDied:
            return self._died(worker, info, killer, stopper, watch)
        except WorkerHung:
            if killer is not None:
                killer.cancel()
            if stopper is not None and stopper.detach():
                return self._stopped(worker, killer, info)
            self.timeouts += 1
            worker.kill()
            self._replace(worker)
            return "timeout", 0, b"", info
        if stopper is not None and stopper.detach():  # killed just after it answered
            return self._stopped(worker, killer, info)
        if watch is not None and watch.check():  # over its limit, if only between two samples
            return self._out_of_memory(worker, watch, info)
        self.typical_seconds = 0.8 * self.typical_seconds + 0.2 * (time.monotonic() - started)
        self._idle.put(worker)
        return "ok", status, out, info

    def _died(self, worker: WorkerProcess, info: dict, killer, stopper: Stopper | None,
              watch: MemoryWatch | None) -> tuple[str, int, bytes, dict]:
        """The worker died during the call: stopped on request, over its memory, or crashed."""
        if stopper is not None and stopper.detach():
            return self._stopped(worker, killer, info)
        if watch is not None and watch.exceeded:
            return self._out_of_memory(worker, watch, info)
        self.crashes += 1
        if killer is not None:
            killer.join()
            self.kills += 1
        info["exit"] = worker.exit_description()
        worker.kill()
        self._replace(worker)
        return "crashed", 0, b"", info

    def _out_of_memory(self, worker: WorkerProcess, watch: MemoryWatch, info: dict) -> tuple[str, int, bytes, dict]:
        """The call went over its memory: its worker is killed (if the watch has not) and replaced."""
        self.out_of_memory += 1
        info["memory"] = watch.message("the call")
        worker.kill()
        self._replace(worker)
        return "out_of_memory", 0, b"", info

    def _stopped(self, worker: WorkerProcess, killer, info: dict) -> tuple[str, int, bytes, dict]:
        """The call's worker was killed on request: replace it; the call's answer is ``stopped``."""
        if killer is not None:
            killer.cancel()
        worker.kill()
        self._replace(worker)
        return "stopped", 0, b"", info

    def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        """Stop every worker: idle ones exit at the end of their pipe at once; busy ones (their calls
        are abandoned with the emulator) are killed after ``grace`` seconds, all together.  Joined one
        by one for 3 s each, four busy workers kept a stopping emulator, and the notebook kernel that
        waited for it at exit, alive for 12 s."""
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        idle = set(self._idle.close())  # a call still waiting for a worker ends "closed", not never
        # Only idle workers' pipes are closed here.  A busy worker's pipe belongs to the thread
        # waiting on its answer: closed under that thread's read, multiprocessing raised TypeError
        # ('NoneType' object cannot be interpreted as an integer) and each such call printed a
        # 30-line traceback on the user's stderr whenever a job failed or was interrupted.
        # Killed below, the busy worker ends its waiter's read with EOF instead.
        for worker in workers:
            if worker in idle:
                worker._conn.close()
        deadline = time.monotonic() + grace
        for worker in workers:
            worker.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            _sigkill(worker.proc)
            worker.proc.join()


def _sigkill(proc) -> None:
    if proc.exitcode is None:
        try:
            proc.kill()  # SIGKILL
        except (ProcessLookupError, ValueError):
            pass
