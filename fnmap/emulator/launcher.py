"""Start ``fnmap emulator`` as a subprocess, read the URL it serves, and stop it: the one launcher.

Used by the emulator backend (an embedded emulator), the tests, the fault benchmark and the
examples.  The emulator prints ``fnmap emulator listening on URL ...`` when it is ready; its
stdout is drained afterwards so it never blocks on a full pipe.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from ..errors import FnmapError
from ..runtime.signing import SECRET_ENV, new_secret
from .sigv4 import ACCESS_KEY_ENV, SECRET_KEY_ENV, new_credentials

#: Seconds an emulator may take to print its URL (a cold start on a loaded machine).
STARTUP_TIMEOUT = 60.0
#: Seconds a stopping emulator gets before it is killed.
STOP_TIMEOUT = 10.0


class EmulatorLauncher:
    """``fnmap emulator`` running as a child process of this one.

    ``secret``: the signing secret both ends use (a fresh one when None).  ``aws_credentials``
    (``(access key id, secret access key)``, fresh ones when None): what its Lambda and Batch APIs
    accept; :attr:`aws_environment` is what a boto3 client exports to sign with them.  ``options``: extra
    command-line options, a string or a list (e.g. ``"--fail-rate 0.1 --seed 1"``).  ``env``:
    variables added to this process's environment for it.  ``stderr``: where its (and its
    workers') stderr goes, as for :class:`subprocess.Popen` (default: this process's).
    ``embedded``: the emulator belongs to this process: it stops when this process's end of its
    stdin closes (this process died), and it runs in a session of its own, so that a SIGINT to
    this process's group (Ctrl-C in a terminal, a Jupyter interrupt) interrupts this process but
    not the emulator and its workers.
    """

    def __init__(self, workers: int | None = None, *, secret: str | None = None, options: str | list = "",
                 env: dict | None = None, host: str = "127.0.0.1", port: int = 0, stderr=None,
                 embedded: bool = False, aws_credentials: tuple[str, str] | None = None):
        self.secret = secret or new_secret()
        key_id, secret_key = aws_credentials or new_credentials()
        #: ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` of the emulator's Lambda and Batch APIs.
        self.aws_environment = {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret_key}
        extra = shlex.split(options) if isinstance(options, str) else list(options)
        cmd = [sys.executable, "-m", "fnmap", "emulator", "--host", host, "--port", str(port)]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        if embedded:
            cmd.append("--watch-stdin")
        full_env = dict(os.environ, **(env or {}))
        full_env.update({SECRET_ENV: self.secret, ACCESS_KEY_ENV: key_id, SECRET_KEY_ENV: secret_key})
        self.proc = subprocess.Popen(cmd + extra, stdin=subprocess.PIPE if embedded else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=stderr, env=full_env,
                                     start_new_session=embedded)
        self.embedded = embedded
        try:
            self.url = self._wait_for_url()
        except BaseException:
            self.stop()
            raise

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                code = self.proc.wait()
                raise FnmapError(
                    f"the fnmap emulator exited with code {code} before it was ready; its output:\n" + "".join(lines)
                )
            lines.append(line)
            if "listening on " in line:
                url = line.split("listening on ", 1)[1].split()[0]
                threading.Thread(target=self._drain, name="fnmap-emulator-stdout", daemon=True).start()
                return url
        raise FnmapError(f"the fnmap emulator was not ready after {STARTUP_TIMEOUT} s")

    def _drain(self) -> None:
        try:
            with self.proc.stdout:  # closed here, at its end: a close from another thread would wait on this read
                while self.proc.stdout.read(1 << 16):
                    pass
        except (OSError, ValueError):
            pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request_stop(self) -> None:
        """Tell the emulator to stop (end of its stdin and SIGTERM), without waiting for it."""
        if self.proc.poll() is not None:
            return
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """Stop the emulator and reap it (a child never waited for would outlive a kernel); its exit code."""
        self.request_stop()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


class EmbeddedEmulator(EmulatorLauncher):
    """An emulator subprocess owned by this process, on a free loopback port, stopped with it (an
    :class:`fnmap.emulator.EmulatorHandle`)."""

    def __init__(self, workers: int | None, options: str = "", secret: str | None = None):
        from ..runtime.signing import local_secret
        from . import default_workers

        self.workers = workers or default_workers()

        # This user's own secret when none is configured: another process of the user can then
        # check the job's stored results (``fnmap.job(ID).results()``).
        from ..observe.output import workers_stderr

        # Its workers' output reaches this process's stderr, or in a notebook the running cell, whole lines.
        super().__init__(workers=self.workers, secret=secret or local_secret(), options=options, embedded=True,
                         stderr=workers_stderr())

    def headers(self) -> dict[str, str]:
        return {}  # every request runs on its workers, this process's own

    def attach(self) -> None:
        """Nothing: it has no sessions to lose."""

    def close_in_child(self) -> None:
        """The child's copy of the pipe whose end stops the emulator: else it outlives the parent."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
