"""Serve the emulator (:mod:`.httpserver`) until SIGTERM/SIGINT (or, with ``watch_stdin``, end of stdin)."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import sys
import threading
import time

from ..runtime.deadlines import TimeLimits
from ..runtime.frontdoor import allowed_name
from ..runtime.signing import SECRET_ENV, new_secret
from . import default_workers, shared
from .faults import FaultPlan
from .httpserver import MAX_CONNECTIONS, WSGIServer, raise_file_limit
from .pool import WorkerPool
from .sigv4 import take_credentials

log = logging.getLogger(__name__)


def serve(host: str = "127.0.0.1", port: int = 0, workers: int | None = None,
          watch_stdin: bool = False, faults: FaultPlan | None = None, wsgi_server: str = "fnmap",
          lambda_runtime: str | None = None, on_listening=None, scaling_rate: int | None = None,
          limits: TimeLimits | None = None, max_connections: int = MAX_CONNECTIONS,
          allow_hosts: tuple[str, ...] = (), idle_exit: float | None = None, state_file: str | None = None,
          stop_on_hangup: bool = False) -> None:
    """Run the emulator in this process until told to stop; ``faults`` makes it unreliable on purpose.

    ``wsgi_server`` is ``"fnmap"`` (:mod:`.httpserver`) or ``"waitress"``; ``lambda_runtime`` is ``"ric"``,
    ``"pool"`` or None (ric when awslambdaric is installed; :mod:`.lambda_api`).  ``on_listening(url)``
    is called once the server is bound, before the "listening" line (``fnmap emulator --aws``
    prints its exports there).  ``scaling_rate``: new Lambda execution environments per function per 10 s
    (None: no limit).  ``limits`` and ``max_connections`` bound the connections it holds
    (:class:`.httpserver.WSGIServer`); ``allow_hosts``: host names besides its addresses that
    clients may reach it by (every other ``Host`` is refused: DNS rebinding).  ``idle_exit``: stop
    once no request came for that many seconds; ``state_file``: where to say its URL and pid once
    it listens; ``stop_on_hangup``: stop a call whose client hung up (all three for an emulator
    shared by a user's processes, :mod:`.shared`).
    """
    allow_hosts = tuple(allowed_name(name) for name in allow_hosts)  # a malformed one fails before anything starts
    workers = workers or default_workers()
    env = dict(os.environ)
    credentials = _announce_secrets(env)
    _warn_if_exposed(host)
    limits = limits or TimeLimits()
    limit_blas_threads(env, workers)
    # Shared (a state file): its clients' calls run on workers of their own (.sessions); its own
    # pool serves the rest (the Lambda API, a client that names its URL) and starts when first used.
    pool = _start_pool_while(workers, env, _import_app, start=not state_file)
    emulator, app = _emulator_app(pool, faults, credentials, lambda_runtime, scaling_rate)
    emulator.stop_on_hangup = stop_on_hangup
    activity = _Activity(app)
    server = _server(activity, wsgi_server, host, port, workers, limits, max_connections)
    actual_host, actual_port = server.host, server.port
    app.extensions["fnmap_front_door"].serve_at(str(actual_host), actual_port, allow_hosts)
    shown_host = f"[{actual_host}]" if ":" in str(actual_host) else actual_host

    stop_requested = _stop_event(watch_stdin)
    serving = threading.Thread(target=server.serve_forever, name="fnmap-emulator-server", daemon=True)
    serving.start()
    url = f"http://{shown_host}:{actual_port}"
    if on_listening is not None:
        on_listening(url)
    if state_file:
        emulator.sessions = _sessions(state_file, emulator, env, workers, url, activity, idle_exit)
        shared.write_state(state_file, url, workers, emulator.sessions.path)
    print(f"fnmap emulator listening on {url} with {workers} workers", flush=True)
    if emulator.faults.active:
        print(f"fnmap emulator: injecting faults: {' '.join(emulator.faults.options())}", flush=True)
    try:
        idle = (lambda: emulator.sessions.idle_exit) if state_file else (lambda: idle_exit)
        _serve_until(stop_requested, serving, activity, idle, state_file)
    finally:
        _shut_down(emulator, server, serving, state_file)


def _shut_down(emulator, server, serving: threading.Thread, state_file: str | None) -> None:
    """Stop being found, stop serving, end the clients' workers and the emulator's own."""
    if state_file:
        shared.withdraw_state(state_file)
    emulator.stopping.set()
    server.close()
    serving.join(timeout=10)
    if emulator.sessions is not None:
        emulator.sessions.close()
    emulator.pool.close()
    # A log record, not a print: an embedded emulator stops with every script that used it, and
    # said so on that script's stderr (`fnmap emulator` in a terminal shows INFO records).
    log.info("fnmap emulator stopped")


def _stop_event(watch_stdin: bool) -> threading.Event:
    """Set on SIGTERM or SIGINT, and (``watch_stdin``) when the parent holding our stdin is gone."""
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.set())
    if watch_stdin:
        threading.Thread(target=_set_on_stdin_eof, args=(stop_requested,), daemon=True).start()
    return stop_requested


def _emulator_app(pool, faults, credentials, lambda_runtime, scaling_rate):
    from .app import Emulator, create_emulator_app

    emulator = Emulator(pool, faults)
    emulator.aws_credentials = credentials
    emulator.lambda_runtime = lambda_runtime
    emulator.lambda_scaling_rate = scaling_rate
    return emulator, create_emulator_app(emulator)


#: Seconds an idle emulator keeps serving after it withdrew its state file: a client that read the
#: file just before still has its requests answered.
IDLE_GRACE = 2.0


def _serve_until(stop_requested: threading.Event, serving: threading.Thread, activity, idle_exit, state_file) -> None:
    """Return when told to stop, when the server thread ended, or once idle as long as ``idle_exit()``
    says (None: never)."""
    withdrawn_at = None
    while not stop_requested.wait(0.25) and serving.is_alive():
        idle = activity.idle_for()
        if withdrawn_at is None:
            if idle_exit() and idle >= idle_exit():
                if state_file:
                    shared.withdraw_state(state_file)
                withdrawn_at = time.monotonic()
        elif min(idle, time.monotonic() - withdrawn_at) >= IDLE_GRACE:
            log.info("fnmap emulator: no request for %g s, stopping", idle_exit())
            return


class _Activity:
    """The WSGI app, counting the requests in progress and when the last one ended."""

    def __init__(self, app):
        self.app = app
        self.busy = 0
        self.last = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self._lock:
            self.busy += 1
        try:
            return self.app(environ, start_response)
        finally:
            with self._lock:
                self.busy -= 1
                self.last = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last request ended; 0 while one is in progress."""
        with self._lock:
            return 0.0 if self.busy else time.monotonic() - self.last


def _announce_secrets(env: dict):
    """Make the secret and AWS credentials the emulator accepts, if none are set, and print them."""
    if not env.get(SECRET_ENV):
        env[SECRET_ENV] = new_secret()
        print(f"{SECRET_ENV}={env[SECRET_ENV]}  (no secret was set; clients must use this one)", flush=True)
    credentials = take_credentials(env)  # the Lambda and Batch APIs accept requests signed with them
    if credentials.generated:
        print(" ".join(f"{k}={v}" for k, v in credentials.environment().items())
              + "  (AWS credentials of the emulator's Lambda and Batch APIs; boto3 clients must sign with them)",
              flush=True)
    return credentials


def _server(app, wsgi_server: str, host: str, port: int, workers: int, limits: TimeLimits, max_connections: int):
    """The HTTP server, bound.  A thread per connection: calls beyond the workers are answered 429, and
    delayed calls (latency, stragglers, drops) wait, without stopping the pool from serving."""
    from ..runtime.http_app import MAX_BODY_BYTES

    if wsgi_server == "waitress":
        return _Waitress(app, host, port, threads=2 * workers + 8, idle=limits.idle, limit=max_connections)
    return WSGIServer(app, host=host, port=port, limits=limits, max_body=MAX_BODY_BYTES,
                      max_connections=raise_file_limit(max_connections))


def _import_app() -> None:
    from . import app  # noqa: F401 - Flask and the app: about 0.2 s of imports


def _sessions(state_file: str, emulator, env: dict, workers: int, url: str, activity, idle_exit):
    """The client sessions of a shared emulator, on a socket beside its state file."""
    from .sessions import Sessions, tree_memory

    def env_for(client_env: dict, session_workers: int | None) -> dict:
        client_env[SECRET_ENV] = env[SECRET_ENV]  # the workers check calls with the emulator's secret
        limit_blas_threads(client_env, session_workers or workers)
        return client_env

    def describe() -> dict:
        idle, idle_exit = activity.idle_for(), sessions.idle_exit
        return {"pid": os.getpid(), "url": url, "python": sys.executable, "version": sys.version.split()[0],
                "workers": workers, "in_flight": emulator.in_flight, "served": emulator.served,
                "memory": tree_memory(os.getpid()), "started": emulator.started,
                "idle_exit": idle_exit, "idle_left": max(0.0, idle_exit - idle) if idle_exit else None}

    def make_pool(client_env: dict, client: dict, session_workers: int | None) -> WorkerPool:
        return WorkerPool(session_workers or workers, env=client_env, client=client, start=False)

    sessions = Sessions(os.path.dirname(state_file), make_pool, env_for, describe, emulator.lock, idle_exit)
    return sessions


def _start_pool_while(workers: int, env: dict, work, start: bool = True) -> WorkerPool:
    """Start the worker pool (a fork server and its children, mostly waiting on their imports)
    while this process does ``work``: the emulator is ready about 0.2 s sooner on a cold start.
    ``start=False``: only the fork server starts; the pool's workers wait for its first call."""
    box: dict = {}

    def start_pool():
        try:
            box["pool"] = WorkerPool(workers, env=env, start=start)
            if not start:
                from .pool import start_fork_server

                start_fork_server()
        except BaseException as e:  # noqa: B036 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=start_pool, name="fnmap-emulator-pool-start")
    thread.start()
    try:
        work()
    finally:
        thread.join()
    if "error" in box:
        raise box["error"]
    return box["pool"]


class _Waitress:
    """waitress behind the interface of :class:`.httpserver.WSGIServer` (``--wsgi-server waitress``)."""

    def __init__(self, app, host: str, port: int, threads: int, idle: float, limit: int):
        from waitress import create_server

        # 1 MB arguments: big reads, kept in memory (waitress's defaults: 8 KB reads, a temp
        # file past 512 KB, cost 5 ms per MB).  Its one loop holds slow connections
        # without a thread each; inactive ones are closed after ``idle`` seconds.
        self._server = create_server(app, host=host, port=port, threads=threads, channel_timeout=idle,
                                     cleanup_interval=max(1, int(idle / 2)),
                                     connection_limit=limit, asyncore_use_poll=True,
                                     recv_bytes=1 << 18, inbuf_overflow=16 << 20)
        self.host, self.port = self._server.effective_host, self._server.effective_port

    def serve_forever(self) -> None:
        self._server.run()

    def close(self) -> None:
        # Clients' keep-alive connections are in waitress's socket map too: close them all, in
        # the loop's own thread (the trigger's thunk), which ends the loop.
        server = self._server

        def close_all():
            for channel in list(server._map.values()):
                if channel is not server and channel is not server.trigger:
                    channel.close()
            server.close()

        server.trigger.pull_trigger(close_all)


#: Thread-count settings of the BLAS and OpenMP runtimes under NumPy, SciPy, PyTorch and numexpr.
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def limit_blas_threads(env: dict, workers: int) -> None:
    """Give each worker process its share of the cores for BLAS threads, unless ``env`` sets them.

    Otherwise every worker's NumPy starts one BLAS thread per core: 4 workers on 2 cores ran
    8 threads that fought over the cores, and a matmul job went slower than a plain loop.
    """
    share = str(max(1, (os.cpu_count() or 1) // workers))
    for name in BLAS_THREAD_VARS:
        env.setdefault(name, share)


def _set_on_stdin_eof(event: threading.Event) -> None:
    """The parent that started us holds our stdin; when it dies, we stop too (no orphans).

    Reads the file descriptor itself, not ``sys.stdin.buffer``: this daemon thread is still in
    its read when the interpreter exits (stopped by SIGTERM), and a buffered reader's lock held
    there made the exit abort with ``Fatal Python error: _enter_buffered_busy``.
    """
    try:
        while os.read(sys.stdin.fileno(), 1 << 16):
            pass
    except (OSError, ValueError):
        pass
    event.set()


def _warn_if_exposed(host: str) -> None:
    """Say, when bound beyond loopback, who can reach the emulator and what they can do there."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        print(
            f"WARNING: the fnmap emulator is bound to {host or 'every address'}, reachable from other "
            "machines. Anyone who reaches the port can read /health, /calls and /lambda/stats (counts, "
            "no job ids or keys) and send requests; code runs only for requests signed with its secret "
            "(FNMAP_SECRET: /invoke, /cancel, Lambda events) or, on the Lambda and Batch APIs, signed "
            "(SigV4) with the credentials it prints. The traffic is plain HTTP: anyone on the network path "
            "reads the arguments, results and signed requests. Keep the secret and credentials private "
            "and the network trusted, or bind 127.0.0.1.",
            file=sys.stderr, flush=True,
        )
