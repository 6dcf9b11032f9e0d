"""``emulator`` (the default): the http backend pointed at a local emulator.

With ``FNMAP_EMULATOR_URL`` (or ``emulator_url=``) it uses an emulator that is
already running.  Otherwise, by default, it attaches to the emulator shared by
this user's processes of the same interpreter and secret, or starts it
(:mod:`fnmap.emulator.shared`: it stays up ``emulator_idle`` seconds after its
last request, so the next script's first call waits for no start-up).  With
``emulator_idle=0`` or ``emulator_options`` it starts one of its own in the background on a free
loopback port (:class:`fnmap.emulator.launcher.EmulatorLauncher`), signing with
the configured secret (``secret=`` / ``FNMAP_SECRET``) or else a fresh one,
reuses it for every later job of this process with the same settings, and
stops it at interpreter exit.  The emulator runs in a session of its own, so a
Ctrl-C or a Jupyter interrupt (SIGINT to the whole process group) stops the
job but not the emulator; it watches its stdin, so it stops when this process
dies without running ``atexit`` (a notebook kernel killed or restarted).

An emulator fnmap started that disappears in the middle of a job (stopped,
killed, crashed) is replaced: the backend starts or finds another and sends the
calls again; a call whose result its old worker committed is answered from
storage, so every item is committed once.  An emulator named by URL is the
user's: its loss fails the calls with an error that names it and says how to
finish the job.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import TYPE_CHECKING

from ..config import endpoint_environment
from ..errors import ConfigError, FaultKind, PlatformFault
from ..runtime import forks
from ..runtime.batch_frames import MANY_PATH, MAX_CALLS, pack_calls, unpack_answers
from ..runtime.wire import SESSION_GONE_STATUS, SESSION_HEADER
from .base import Answer
from .http import HttpBackend

if TYPE_CHECKING:
    from ..emulator import EmulatorHandle

#: Emulators one backend may start or find in place of one that disappeared, before it gives up.
MAX_REPLACEMENTS = 5
#: How long an emulator that dropped a connection must stay up and listening to count as there (a
#: killed one closes its connections first, its listening socket next, and reads as ended last).
SETTLE_SECONDS = 0.25


class SessionGone(PlatformFault):
    """The shared emulator answered that it has no session of this process (its socket closed, or
    another emulator took the place of the one it attached to): attach again and send the call
    again (:meth:`EmulatorBackend._after`).  A connection fault to whoever else meets it."""

    def __init__(self, message: str):
        super().__init__(FaultKind.CONNECTION, message)


class EmulatorBackend(HttpBackend):
    name = "emulator"
    #: A loopback request to a warm worker costs about a millisecond: 0.1 s calls amortize it.
    call_seconds = 0.1
    workers_on_this_terminal = True

    def __init__(self, config):
        self._config = config
        self._replacing = threading.Lock()
        self._generation = 0  # emulators replaced so far
        emulator = None
        if config.emulator_url:
            url = config.emulator_url.rstrip("/")
            _check_reachable(url, config)
            workers = config.workers
        else:
            emulator = self._embedded_emulator()
            url, workers = emulator.url, emulator.workers
        super().__init__(config, url=url)
        #: The emulator this backend attached to or started, or None (one named by URL).
        self.embedded: EmulatorHandle | None = None
        if emulator is not None:
            self._use(emulator)
        self.invoke_url = self.url + "/invoke"
        # Enough calls in flight to keep every worker busy while responses travel.
        self.max_workers = config.workers or (2 * workers if workers else 16)
        #: Set once the emulator answered that it takes one call a request (404 to ``POST
        #: /invoke-many``: it injects faults, or its workers check every call's signature).
        self._cannot_batch = False

    def _embedded_emulator(self, gone: EmulatorHandle | None = None) -> EmulatorHandle:
        config = self._config
        return embedded_emulator(config.workers, config.emulator_options, endpoint_environment(),
                                 secret=config.secret, idle=config.emulator_idle, gone=gone)

    def _use(self, emulator: EmulatorHandle) -> None:
        """Send calls to ``emulator`` (started or found by this backend), as this process's session."""
        self.embedded = emulator
        self.secret = emulator.secret.encode()
        self.headers = emulator.headers()
        self.url = emulator.url
        self.invoke_url = self.url + "/invoke"

    def invoke(self, invocation):
        while True:
            generation = self._generation
            try:
                return super().invoke(invocation)
            except PlatformFault as fault:
                self._after(fault, generation, invocation.request.job_id)

    def _after(self, fault: PlatformFault, generation: int, job_id: str) -> None:
        """Return to send again, on an emulator that replaced one that is gone, or in a new session
        of this process; else raise ``fault`` (named for the user when the emulator is theirs)."""
        if fault.kind != FaultKind.CONNECTION:
            raise fault
        if self.embedded is None:
            raise PlatformFault(FaultKind.CONNECTION, (
                f"{fault.message}: the emulator at {self.url} ({self._config.describe('emulator_url')}) is not "
                f"answering; if it stopped, start it again (`fnmap emulator`) and finish the job with "
                f"`fnmap redrive {job_id}`")) from None
        with self._replacing:
            if self._generation != generation:
                return  # another thread replaced it already
            emulator = self.embedded
            gone = isinstance(fault, SessionGone)
            there = _still_there(emulator, settle=0 if gone else SETTLE_SECONDS)
            if there and not gone:
                raise fault  # it is there: a fault of this call's, retried as any other
            if self._generation >= MAX_REPLACEMENTS:
                raise PlatformFault(FaultKind.CONNECTION, f"{fault.message} (the emulator fnmap started was "
                                    f"replaced {self._generation} times already; its log says why)") from None
            if there:
                emulator.attach()  # it is there but ended this process's session: a new one
            else:  # a new one, even where the old one's process has not yet read as ended
                emulator.stop()
                emulator = self._embedded_emulator(gone=emulator)
            self._use(emulator)
            self._generation += 1

    def refused(self, status: int, headers, text: str, url: str) -> PlatformFault:
        if status == SESSION_GONE_STATUS and SESSION_HEADER in self.headers:
            return SessionGone(f"{url} answered {status}: {text[:500]}")
        return super().refused(status, headers, text, url)

    @property
    def group_limit(self) -> int:
        """Short calls go to the emulator together, this many at most a request (``fnmap.dispatch``
        decides when): a request and a worker message each, not one per call.  0 once the
        emulator said it takes one call a request."""
        return 0 if self._cannot_batch else min(32, MAX_CALLS)

    def invoke_group(self, invocations: list) -> list | None:
        """``POST /invoke-many``: the calls in one request, each signed as alone; each call's answer
        or fault, as :meth:`invoke` would have given or raised (see :mod:`fnmap.runtime.batch_frames`)."""
        while True:
            generation = self._generation
            try:
                return self._invoke_group(invocations)
            except PlatformFault as fault:
                self._after(fault, generation, invocations[0].request.job_id)

    def _invoke_group(self, invocations: list) -> list | None:
        target = self._plain_target()
        if target is None or self._cannot_batch:
            return None  # the client sends each alone
        host, port, _path = target
        body = pack_calls([(invocation.signature, invocation.body) for invocation in invocations])
        url = self.url + MANY_PATH
        r = self._post_plain_body((host, port, MANY_PATH), body,
                                  {"Content-Type": "application/octet-stream", **self.headers}, None)
        if r.status == 404:  # it injects faults, or its workers check signatures: one request a call from now on
            self._cannot_batch = True
            return None
        if r.status != 200:
            raise self.refused(r.status, r.headers, r.body.decode(errors="replace"), url)
        try:
            answers = unpack_answers(r.body, len(invocations))
        except ValueError as e:
            raise PlatformFault("server", f"{url} answered a malformed batch: {e}") from None
        return [Answer(out) if status == 200 else self.refused(status, headers, out.decode(errors="replace"),
                                                                self.invoke_url)
                for status, headers, out in answers]

    def usable(self) -> bool:
        """False once the emulator this backend started is gone (killed): its client must be replaced."""
        return self.embedded is None or self.embedded.alive()


def _still_there(emulator: EmulatorHandle, settle: float) -> bool:
    """Whether ``emulator`` is up and listening, and stays so for ``settle`` seconds."""
    from ..emulator.shared import listening

    deadline = time.monotonic() + settle
    while emulator.alive() and listening(emulator.url):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.02)
    return False


def _check_reachable(url: str, config) -> None:
    """Ask the emulator at ``url`` for its health; a ConfigError saying whether nothing answered there
    or an emulator answered and refused (its front door admits only the names it serves)."""
    from urllib.parse import urlsplit

    import requests

    where = config.describe("emulator_url")
    try:
        r = requests.get(url + "/health", timeout=5)
    except requests.RequestException as e:
        raise ConfigError(
            f"{where} is not reachable ({e.__class__.__name__}): start one "
            "with `fnmap emulator`, or unset FNMAP_EMULATOR_URL to let fnmap start its own"
        ) from None
    if r.status_code == 200:
        return
    reason = r.text.strip()[:400]
    parts = urlsplit(url)
    if r.status_code == 403 and reason.startswith("Host "):
        name = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        raise ConfigError(
            f"{where} refused by the front door: Host {parts.netloc!r} not among its names; use --allow-host "
            f"{name} where the emulator starts (`fnmap emulator --allow-host {name}`), or reach it by one of "
            f"its names (127.0.0.1, localhost, on any port). It said: {reason}")
    raise ConfigError(f"{where} answered {r.status_code} to GET /health ({reason or 'no reason given'}): is it "
                      "an fnmap emulator? Start one with `fnmap emulator`, or unset FNMAP_EMULATOR_URL to let "
                      "fnmap start its own")


_embedded: dict[tuple, EmulatorHandle] = {}
_lock = threading.Lock()


def embedded_emulator(workers: int | None, options: str = "", environment: tuple = (),
                      secret: str | None = None, idle: float = 0,
                      gone: EmulatorHandle | None = None) -> EmulatorHandle:
    """The emulator for these settings, started on first use (restarted if it died, or if it is
    ``gone``: a handle its caller found not answering, which may not read as ended yet).

    ``idle`` > 0 and no ``options``: the one shared by this user's processes
    (:mod:`fnmap.emulator.shared`), attached to or started, which stays up ``idle`` seconds after
    its last request (the ``idle`` of the process that attached last); this process's workers on it
    are ``workers``.  Else this process's own: extra ``options`` (faults on purpose, another HTTP
    server) describe an emulator no other process asked for.  The secret is part of the settings:
    two jobs with different secrets must not share an emulator.
    """
    from ..emulator import default_workers
    from ..emulator.shared import supported

    key = (workers, options, environment, secret, idle)
    with _lock:
        emu = _embedded.get(key)
        if emu is None or emu is gone or not emu.alive():
            if emu is not None:
                emu.stop()  # reap the dead one
            if idle and not options and supported():
                from ..emulator.shared import SharedEmulator
                from ..runtime.signing import local_secret

                emu = SharedEmulator(workers or default_workers(), secret or local_secret(), idle)
            else:
                from ..emulator.launcher import EmbeddedEmulator

                emu = EmbeddedEmulator(workers, options, secret)
            _embedded[key] = emu
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


@forks.at_fork
def _forget_in_child() -> None:
    """In a forked child: the parent's emulators stay the parent's, forgotten here and never
    stopped; the child's first job starts or attaches to its own.  The child closes its copy of
    the pipe whose end tells a per-process emulator that its parent is gone, and of the socket
    whose end ends the parent's session on a shared one (the parent's workers end with the parent)."""
    global _embedded, _lock
    for emu in _embedded.values():
        try:
            emu.close_in_child()
        except OSError:
            pass
    forks.keep(_embedded)
    _embedded, _lock = {}, threading.Lock()
