"""A pool of warm worker processes for the emulator.

Each invocation borrows one idle process, sends it the request over a pipe and
waits for the answer.  If the process dies (segfault, ``os._exit``, SIGKILL),
or outlives the call's timeout plus a grace period, only that call fails; the
process is replaced in the background and the pool keeps serving.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time

_LEN = struct.Struct(">I")
#: Seconds past a call's own timeout before its process is killed.
KILL_GRACE_SECONDS = 2.0


class WorkerDied(Exception):
    pass


class WorkerHung(Exception):
    pass


class WorkerProcess:
    """One child process speaking the framed protocol of :mod:`fnmap.emulator.process`."""

    def __init__(self, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fnmap.emulator.process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.pid = self.proc.pid
        self.calls = 0
        self.started = time.time()
        self._out = self.proc.stdout.fileno()
        self._ready = False

    def wait_ready(self, timeout: float = 60.0) -> None:
        if not self._ready:
            if self._read(1, time.monotonic() + timeout) != b"R":
                raise WorkerDied("worker process did not start")
            self._ready = True

    def call(self, signature: str | None, body: bytes, timeout: float | None) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout if timeout else None
        self.wait_ready()
        sig = (signature or "").encode()
        try:
            self.proc.stdin.write(_LEN.pack(len(sig)) + sig + _LEN.pack(len(body)))
            self.proc.stdin.write(body)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerDied(str(e)) from None
        self.calls += 1
        status, n = struct.unpack(">II", self._read(8, deadline))
        return status, self._read(n, deadline)

    def _read(self, n: int, deadline: float | None) -> bytes:
        parts, left = [], n
        while left:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self._out], [], [], remaining)[0]:
                    raise WorkerHung()
            data = os.read(self._out, min(left, 1 << 20))
            if not data:
                raise WorkerDied()
            parts.append(data)
            left -= len(data)
        return b"".join(parts)

    def exit_description(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "exit status unknown"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        """Ask the process to exit (end of stdin), then make sure it did."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class WorkerPool:
    """``size`` warm processes; ``execute`` runs one invocation on an idle one."""

    def __init__(self, size: int, env: dict | None = None):
        self.size = size
        self.env = env
        self._idle: queue.LifoQueue[WorkerProcess] = queue.LifoQueue()  # LIFO keeps the warmest busy
        self._all: set[WorkerProcess] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.crashes = 0
        self.timeouts = 0
        self.kills = 0
        #: Moving average of how long a call takes in a worker (fault injection scales with it).
        self.typical_seconds = 0.01
        for _ in range(size):
            self._add()

    def _add(self, ready_first: bool = False) -> None:
        if self._closed:
            return
        worker = WorkerProcess(self.env)
        with self._lock:
            self._all.add(worker)
        if ready_first:
            # A replacement joins the idle workers once it has started: the idle queue is LIFO,
            # so a still-booting process would otherwise make the next call wait for its start
            # while warm workers sit idle below it (issue 3: kills must cost only the dead call).
            try:
                worker.wait_ready()
            except (WorkerDied, WorkerHung):
                pass  # its first call reports the crash, and it is replaced in turn
        self._idle.put(worker)

    def _replace(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._all.discard(worker)
        threading.Thread(target=self._add, args=(True,), daemon=True).start()

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(w.pid for w in self._all)

    def execute(self, signature: str | None, body: bytes, timeout: float | None, *,
                kill_at: float | None = None, cold_start: float = 0.0) -> tuple[str, int, bytes, dict]:
        """Run one invocation; return ``(outcome, status, body, info)``.

        ``outcome`` is ``ok``, ``crashed`` or ``timeout``; ``info`` has the worker's pid.
        Fault injection: ``cold_start`` seconds are spent first on a worker's first call;
        with ``kill_at`` the worker is SIGKILLed that fraction of a typical call's duration
        after it was handed the call, and its answer, if it gave one, dies with it.
        """
        worker = self._idle.get()
        info = {"pid": worker.pid, "cold": worker.calls == 0}
        if info["cold"] and cold_start:
            time.sleep(cold_start)
        hard_timeout = timeout + KILL_GRACE_SECONDS if timeout else None
        killer = None
        if kill_at is not None:
            killer = threading.Timer(kill_at * self.typical_seconds, _sigkill, (worker.proc,))
            killer.start()
        started = time.monotonic()
        try:
            status, out = worker.call(signature, body, hard_timeout)
            if killer is not None:
                killer.join()  # the kill lands even when the call answered first
                worker.proc.wait()
                raise WorkerDied()
        except WorkerDied:
            self.crashes += 1
            if killer is not None:
                killer.join()
                self.kills += 1
            info["exit"] = worker.exit_description()
            worker.kill()
            self._replace(worker)
            return "crashed", 0, b"", info
        except WorkerHung:
            if killer is not None:
                killer.cancel()
            self.timeouts += 1
            worker.kill()
            self._replace(worker)
            return "timeout", 0, b"", info
        self.typical_seconds = 0.8 * self.typical_seconds + 0.2 * (time.monotonic() - started)
        self._idle.put(worker)
        return "ok", status, out, info

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            worker.close()


def _sigkill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
