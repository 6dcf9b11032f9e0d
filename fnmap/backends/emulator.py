"""``emulator`` (the default): the http backend pointed at a local emulator.

With ``FNMAP_EMULATOR_URL`` (or ``emulator_url=``) it uses an emulator that is
already running.  Otherwise, by default, it attaches to the emulator shared by
this user's processes with the same settings, or starts it
(:mod:`fnmap.emulator.shared`: it stays up ``emulator_idle`` seconds after its
last request, so the next script's first call waits for no start-up).  With
``emulator_idle=0`` it starts one of its own in the background on a free
loopback port (:class:`fnmap.emulator.launcher.EmulatorLauncher`), signing with
the configured secret (``secret=`` / ``FNMAP_SECRET``) or else a fresh one,
reuses it for every later job of this process with the same settings, and
stops it at interpreter exit.  The emulator runs in a session of its own, so a
Ctrl-C or a Jupyter interrupt (SIGINT to the whole process group) stops the
job but not the emulator; it watches its stdin, so it stops when this process
dies without running ``atexit`` (a notebook kernel killed or restarted).  A
job whose emulator is gone (killed) gets a new one.
"""

from __future__ import annotations

import atexit
import threading

from ..config import endpoint_environment
from ..errors import ConfigError, PlatformFault
from ..runtime.batch_frames import MANY_PATH, MAX_CALLS, pack_calls, unpack_answers
from .base import Answer
from .http import HttpBackend, fault_from_status


class EmulatorBackend(HttpBackend):
    name = "emulator"
    #: A loopback request to a warm worker costs about a millisecond: 0.1 s calls amortize it.
    call_seconds = 0.1
    workers_share_installation = True

    def __init__(self, config):
        self.embedded = None  # the emulator this backend attached to or started
        if config.emulator_url:
            url = config.emulator_url.rstrip("/")
            _check_reachable(url, config)
            workers = config.workers
        else:
            self.embedded = embedded_emulator(config.workers, config.emulator_options, endpoint_environment(),
                                              secret=config.secret, idle=config.emulator_idle)
            url, workers = self.embedded.url, self.embedded.workers
            self.secret = self.embedded.secret.encode()
        super().__init__(config, url=url)
        self.invoke_url = self.url + "/invoke"
        # Enough calls in flight to keep every worker busy while responses travel.
        self.max_workers = config.workers or (2 * workers if workers else 16)
        #: Set once the emulator answered that it has no ``POST /invoke-many`` (an older one).
        self._cannot_batch = False

    @property
    def batch_limit(self) -> int:
        """Short calls go to the emulator together, this many at most a request (``fnmap.dispatch``
        decides when): a request and a worker message each, not one per call (issue 25).  0 once the
        emulator said it takes one call a request."""
        return 0 if self._cannot_batch else min(32, MAX_CALLS)

    def invoke_batch(self, invocations: list) -> list | None:
        """``POST /invoke-many``: the calls in one request, each signed as alone; each call's answer
        or fault, as :meth:`invoke` would have given or raised (see :mod:`fnmap.runtime.batch_frames`)."""
        target = self._plain_target()
        if target is None or self._cannot_batch:
            return None  # the client sends each alone
        host, port, _path = target
        body = pack_calls([(invocation.signature, invocation.body) for invocation in invocations])
        url = self.url + MANY_PATH
        r = self._post_plain_body((host, port, MANY_PATH), body, {"Content-Type": "application/octet-stream"}, None)
        if r.status in (404, 405):  # an older emulator, or one injecting faults: one request a call from now on
            self._cannot_batch = True
            return None
        if r.status != 200:
            raise fault_from_status(r.status, r.headers, r.body.decode(errors="replace"), url)
        try:
            answers = unpack_answers(r.body, len(invocations))
        except ValueError as e:
            raise PlatformFault("server", f"{url} answered a malformed batch: {e}") from None
        return [Answer(out) if status == 200 else
                fault_from_status(status, headers, out.decode(errors="replace"), self.invoke_url)
                for status, headers, out in answers]

    def usable(self) -> bool:
        """False once the emulator this backend started is gone (killed): its client must be replaced."""
        return self.embedded is None or self.embedded.alive()


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


def _shared(workers: int | None, options: str, secret: str | None, idle: float):
    from ..emulator import default_workers
    from ..emulator.shared import SharedEmulator
    from ..runtime.signing import local_secret

    return SharedEmulator(workers or default_workers(), options, secret or local_secret(), idle)


_embedded: dict[tuple, object] = {}  # EmbeddedEmulator or SharedEmulator
_lock = threading.Lock()


def embedded_emulator(workers: int | None, options: str = "", environment: tuple = (),
                      secret: str | None = None, idle: float = 0):
    """The emulator for these settings, started on first use (restarted if it died).

    ``idle`` > 0: the one shared by this user's processes (:mod:`fnmap.emulator.shared`), attached
    to or started, which stops after ``idle`` seconds without requests; 0: this process's own.
    The secret is part of the settings: two jobs with different secrets must not share an emulator.
    """
    from ..emulator.shared import supported

    key = (workers, options, environment, secret, idle)
    with _lock:
        emu = _embedded.get(key)
        if emu is None or not emu.alive():
            if emu is not None:
                emu.stop()  # reap the dead one
            if idle and supported():
                emu = _embedded[key] = _shared(workers, options, secret, idle)
            else:
                from ..emulator.launcher import EmbeddedEmulator

                emu = _embedded[key] = EmbeddedEmulator(workers, options, secret)
        return emu


def stop_embedded() -> None:
    """Stop every emulator this process started, all at once (each gets its stop signal first)."""
    with _lock:
        emulators = list(_embedded.values())
        _embedded.clear()
    for emu in emulators:
        emu.request_stop()
    for emu in emulators:
        emu.stop()


atexit.register(stop_embedded)
