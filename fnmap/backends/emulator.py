"""``emulator`` (the default): the http backend pointed at a local emulator.

With ``FNMAP_EMULATOR_URL`` (or ``emulator_url=``) it uses an emulator that is
already running.  Otherwise it starts one in the background on a free
loopback port with a fresh secret, reuses it for every later job of this
process, and stops it at interpreter exit.  The emulator watches its stdin,
so it also stops when this process dies without running ``atexit``
(a notebook kernel killed or restarted).
"""

from __future__ import annotations

import atexit
import os
import shlex
import subprocess
import sys
import threading
import time

from ..config import endpoint_environment
from ..errors import ConfigError, FnmapError
from ..signing import SECRET_ENV, new_secret
from .http import HttpBackend

_STARTUP_TIMEOUT = 60.0


class EmulatorBackend(HttpBackend):
    name = "emulator"

    def __init__(self, config):
        if config.emulator_url:
            url = config.emulator_url.rstrip("/")
            _check_reachable(url, config)
            workers = config.workers
        else:
            embedded = embedded_emulator(config.workers, config.emulator_options, endpoint_environment())
            url, workers = embedded.url, embedded.workers
            self.secret = embedded.secret
        super().__init__(config, url=url)
        self.invoke_url = self.url + "/invoke"
        # Enough calls in flight to keep every worker busy while responses travel.
        self.max_workers = config.workers or (2 * workers if workers else 16)


def _check_reachable(url: str, config) -> None:
    import requests

    try:
        r = requests.get(url + "/health", timeout=5)
        r.raise_for_status()
    except requests.RequestException as e:
        raise ConfigError(
            f"{config.describe('emulator_url')} is not reachable ({e.__class__.__name__}): start one "
            "with `fnmap emulator`, or unset FNMAP_EMULATOR_URL to let fnmap start its own"
        ) from None


class EmbeddedEmulator:
    """An emulator subprocess owned by this process."""

    def __init__(self, workers: int | None, options: str = ""):
        from ..emulator import default_workers

        self.workers = workers or default_workers()
        self.secret = new_secret().encode()
        env = dict(os.environ, **{SECRET_ENV: self.secret.decode()})
        cmd = [sys.executable, "-m", "fnmap", "emulator", "--host", "127.0.0.1", "--port", "0",
               "--workers", str(self.workers), "--watch-stdin", *shlex.split(options)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.url = self._wait_for_url()
        atexit.register(self.stop)

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + _STARTUP_TIMEOUT
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                code = self.proc.wait()
                raise FnmapError(
                    f"the embedded emulator exited with code {code} before it was ready; its output:\n"
                    + "".join(lines)
                )
            lines.append(line)
            if "listening on " in line:
                url = line.split("listening on ", 1)[1].split()[0]
                # Keep draining stdout so the emulator never blocks on a full pipe.
                threading.Thread(target=self._drain, daemon=True).start()
                return url
        self.stop()
        raise FnmapError(f"the embedded emulator was not ready after {_STARTUP_TIMEOUT} s")

    def _drain(self) -> None:
        try:
            while self.proc.stdout.read(1 << 16):
                pass
        except (OSError, ValueError):
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Stop the emulator and reap it (a child never waited for would outlive a kernel)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        else:
            self.proc.wait()


_embedded: dict[tuple, EmbeddedEmulator] = {}
_lock = threading.Lock()


def embedded_emulator(workers: int | None, options: str = "", environment: tuple = ()) -> EmbeddedEmulator:
    """The process-wide emulator for these settings, started on first use (restarted if it died)."""
    key = (workers, options, environment)
    with _lock:
        emu = _embedded.get(key)
        if emu is None or not emu.alive():
            emu = _embedded[key] = EmbeddedEmulator(workers, options)
        return emu


def stop_embedded() -> None:
    """Stop every emulator this process started."""
    with _lock:
        for emu in _embedded.values():
            emu.stop()
        _embedded.clear()
