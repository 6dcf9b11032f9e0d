"""Lambda execution environments on the emulator: AWS's own runtime interface client runs the deployed package.

Each environment is one process ``python -S -m awslambdaric handlers.aws_lambda.handler``
(the ``awslambdaric`` package, as in Lambda's Python base images), working in a
folder holding the unpacked deployment package that ``fnmap deploy aws`` builds
(:func:`fnmap.deploy.package.build_folder`), and talking to Lambda's Runtime API
(version 2018-06-01) served here:

* ``GET /2018-06-01/runtime/invocation/next``: blocks until the environment is
  given an invocation; answers the event with ``Lambda-Runtime-Aws-Request-Id``,
  ``-Deadline-Ms``, ``-Invoked-Function-Arn``, ``-Trace-Id`` and, when the Invoke
  carried one, ``-Client-Context``.
* ``POST /2018-06-01/runtime/invocation/<id>/response`` and ``.../error``: 202;
  400 ``InvalidRequestID`` for an id the environment is not running; 413 for a
  response over Lambda's 6 MiB (the invocation gets ``Function.ResponseSizeTooLarge``,
  and awslambdaric exits, as on Lambda).
* ``POST /2018-06-01/runtime/init/error``: the package failed to load
  (``Runtime.ImportModuleError`` and friends); the invocation is answered with it.

How an environment sees only its own invocations: awslambdaric builds every URL
from ``AWS_LAMBDA_RUNTIME_API`` (host:port) itself, so a path prefix cannot
tell environments apart, and its C client reuses one keep-alive connection while
its init-error report opens another.  So each environment gets its own Runtime
API listener on a free loopback port (a small :mod:`http.server` thread):
the port is the environment's identity, whatever connections it makes.

The environment's Python path is Lambda's: the package folder first (the working
folder and ``LAMBDA_TASK_ROOT``, like ``/var/task``), then each layer's ``python/``
(like ``/opt/python``), then a folder of links to what Lambda's runtime itself
provides (awslambdaric and boto3 with their dependencies, like ``/var/runtime``).
``-S`` keeps ``site`` from running, so neither the emulator's site-packages nor
an editable install of fnmap (a ``.pth`` file there) is seen: what runs is the
package, not the checkout.  ``PYTHON*`` variables of the emulator are dropped.
So, as on Lambda, what a function imports beyond the standard library and boto3
comes from a layer: publish one with boto3's ``publish_layer_version`` (a zip
with ``python/`` inside, e.g. from :func:`fnmap.deploy.package.build_layer`, as
``fnmap deploy aws env`` does) and name it in the function's ``Layers``.

Lambda's behaviour: an environment runs one invocation at a time and is reused
warm (an event is handed only to an environment whose runtime waits in ``/next``);
a new one is a cold start, given the function's timeout plus :data:`INIT_SECONDS`
to load the package; the function's timeout kills the environment
and answers ``Sandbox.Timedout`` (``Task timed out after N.NN seconds``); an
environment that exits mid-invocation answers ``Runtime.ExitError``, and one whose
peak resident memory goes past the function's ``MemorySize`` is killed and answers
``Runtime.OutOfMemory`` (:mod:`.memlimit`).  At most
``max_environments`` run at once (the emulator's ``--workers``); invocations
beyond wait for one, and idle environments of other functions are stopped to
make room.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import http.server
import importlib.metadata
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field

from ..runtime.frontdoor import FrontDoor
from .lambda_common import ACCOUNT, HANDLER, REGION, lambda_error
from .lambda_layers import LayerStore
from .memlimit import MemoryWatch

#: Lambda's limit on a synchronous response, enforced by its Runtime API.
RESPONSE_LIMIT = 6 * 1024 * 1024
#: Seconds a new environment may take to ask for its first invocation (awslambdaric's start plus the
#: package's imports), on top of the function's timeout: Lambda's init phase has 10 s of its own.
INIT_SECONDS = 10.0
#: Seconds an invocation waits for an environment of its function that has answered its last event
#: but not yet asked for the next (it does within milliseconds, unless the machine is busy; one that
#: exits instead stops the wait) before it starts a new one.
REUSE_GRACE_SECONDS = 5.0
#: Distributions Lambda's Python runtime provides besides the standard library (``/var/runtime``).
RUNTIME_DISTRIBUTIONS = ("awslambdaric", "boto3")
_API = "/2018-06-01/runtime"
_POST_PATH = re.compile(rf"^{_API}/invocation/([^/]+)/(response|error)$")


@dataclass
class Function:
    """One function's code and configuration; ``revision`` changes whenever either does."""

    name: str
    code: str
    timeout: int = 900
    memory: int = 1024
    variables: dict = field(default_factory=dict)
    layers: list = field(default_factory=list)  # (arn, folder) pairs, in the configured order
    revision: int = 0

    @property
    def arn(self) -> str:
        return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.name}"


@dataclass
class Invocation:
    """One event on its way through an environment, and what came back."""

    payload: bytes
    client_context: str | None = None
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: ``(body, function error?)`` once answered.
    answer: tuple[bytes, bool] | None = None
    handed_over: float | None = None  # monotonic time the runtime received it


class Environment:
    """One execution environment: an awslambdaric process and its own Runtime API listener."""

    def __init__(self, function: Function, runtime_dir: str, base_env: dict, launch, on_ready, on_exit):
        self.function = function
        #: Called (without this environment's lock) when the runtime asks for work, and when the process ends.
        self._on_ready, self._on_exit = on_ready, on_exit
        #: Owned by the :class:`LambdaRuntime`'s lock: lent to an Invoke; stopped and no longer counted.
        self.busy = True
        self.retired = False
        #: The runtime is waiting in ``/next``: Lambda hands an event only to such an environment.
        self.waiting = False
        #: How the last invocation ended: ok, init_error, exit or timeout.
        self.outcome = ""
        self._cond = threading.Condition()
        self._pending: Invocation | None = None
        self._current: Invocation | None = None
        self.initialized = False
        self.init_error: bytes | None = None
        self.exit: str | None = None
        self.killed = False
        self.invocations = 0
        self.server = _RuntimeApiServer(("127.0.0.1", 0), _RuntimeApiHandler)
        self.server.environment = self
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, name="fnmap-lambda-runtime-api", daemon=True).start()
        try:
            self.proc = launch(self._command(), self._environ(runtime_dir, base_env), function.code)
        except BaseException:
            self.server.shutdown()
            self.server.server_close()
            raise
        #: The function's MemorySize, enforced as Lambda does: over it, the runtime is killed.
        self.memory = MemoryWatch(self.proc.pid, function.memory)
        threading.Thread(target=self._watch, name="fnmap-lambda-environment", daemon=True).start()

    def _command(self) -> list[str]:
        return [sys.executable, "-S", "-m", "awslambdaric", HANDLER]

    def _environ(self, runtime_dir: str, base_env: dict) -> dict:
        f = self.function
        env = {k: v for k, v in base_env.items() if not k.startswith("PYTHON")}
        env.update(f.variables)
        path = [f.code] + [os.path.join(folder, "python") for _arn, folder in reversed(f.layers)] + [runtime_dir]
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        env.update(
            AWS_LAMBDA_RUNTIME_API=self.address, _HANDLER=HANDLER, LAMBDA_TASK_ROOT=f.code,
            LAMBDA_RUNTIME_DIR=runtime_dir, AWS_EXECUTION_ENV=f"AWS_Lambda_python{python}",
            AWS_LAMBDA_FUNCTION_NAME=f.name, AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(f.memory), AWS_LAMBDA_LOG_GROUP_NAME=f"/aws/lambda/{f.name}",
            AWS_LAMBDA_LOG_STREAM_NAME=f"{time.strftime('%Y/%m/%d')}/[$LATEST]{uuid.uuid4().hex}",
            AWS_LAMBDA_INITIALIZATION_TYPE="on-demand", PYTHONPATH=os.pathsep.join(path),
        )
        env.setdefault("AWS_REGION", env.get("AWS_DEFAULT_REGION", REGION))
        env.setdefault("AWS_DEFAULT_REGION", env["AWS_REGION"])
        return env

    def _watch(self) -> None:
        code = self.proc.wait()
        self.memory.stop()
        with self._cond:
            self.exit = f"signal: {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            self._cond.notify_all()
        self._on_exit(self)
        self.server.shutdown()
        self.server.server_close()

    @property
    def alive(self) -> bool:
        return self.exit is None and not self.killed and self.init_error is None

    # -- the Runtime API's side (threads of this environment's listener) ----------------

    def next_invocation(self) -> Invocation | None:
        with self._cond:
            self.initialized = True
            self.waiting = True
            self._cond.notify_all()
        self._on_ready(self)
        with self._cond:
            while self._pending is None and self.alive:
                self._cond.wait()
            self.waiting = False
            inv, self._pending = self._pending, None
            if inv is not None:
                inv.handed_over = time.monotonic()
                self._current = inv
            return inv

    def deadline_ms(self, inv: Invocation) -> int:
        return int((time.time() + self.function.timeout - (time.monotonic() - inv.handed_over)) * 1000)

    def answer(self, request_id: str, body: bytes, error: bool) -> bool:
        """Record the runtime's answer; False when ``request_id`` is not the invocation it runs."""
        with self._cond:
            inv = self._current
            if inv is None or inv.request_id != request_id:
                return False
            inv.answer = (body, error)
            self._current = None
            self._cond.notify_all()
            return True

    def failed_init(self, body: bytes) -> None:
        with self._cond:
            self.init_error = body
            self._cond.notify_all()

    # -- the Invoke API's side -----------------------------------------------------------

    def invoke(self, inv: Invocation) -> tuple[bytes, bool]:
        """Run ``inv`` here and wait for its answer, the function's timeout, or the runtime's end."""
        timeout = float(self.function.timeout)
        init_deadline = time.monotonic() + timeout + INIT_SECONDS
        with self._cond:
            self.invocations += 1
            self._pending = inv
            self._cond.notify_all()
            while inv.answer is None and self.alive:
                deadline = inv.handed_over + timeout if inv.handed_over is not None else init_deadline
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._pending = None
            if inv.answer is not None:
                self.outcome = "ok"
                return inv.answer
            if self.init_error is not None:
                self.outcome = "init_error"
                return self.init_error, True
            if self.exit is not None and self.memory.exceeded:
                self.outcome = "exit"
                return lambda_error("Runtime.OutOfMemory", (
                    f"RequestId: {inv.request_id} Error: Runtime exited with error: {self.exit} "
                    f"({self.memory.message('the runtime')})")), True
            if self.exit is not None:
                self.outcome = "exit"
                return lambda_error("Runtime.ExitError", (
                    f"RequestId: {inv.request_id} Error: Runtime exited with error: {self.exit}")), True
            self.outcome = "timeout"
        self.kill()
        return lambda_error("Sandbox.Timedout", (
            f"RequestId: {inv.request_id} Error: Task timed out after {timeout:.2f} seconds")), True

    def kill(self) -> None:
        with self._cond:
            self.killed = True
            self._cond.notify_all()
        if self.proc.poll() is None:
            self.proc.kill()


class _RuntimeApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    environment: Environment

    def server_activate(self) -> None:
        super().server_activate()
        #: Only the runtime on this machine, by this address: no other Host (DNS rebinding), no web page.
        self.front_door = FrontDoor(None)
        self.front_door.serve_at(self.server_address[0], self.server_address[1])

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a stopped environment's connection: no news
            super().handle_error(request, client_address)


class _RuntimeApiHandler(http.server.BaseHTTPRequestHandler):
    """Lambda's Runtime API for the one environment its server belongs to."""

    protocol_version = "HTTP/1.1"
    server_version = "fnmap-lambda-runtime-api"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def log_message(self, format, *args):  # noqa: A002 - the name of the base class's argument
        pass  # the runtime's requests are not news

    def _send(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", (headers or {}).get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, error_type: str, message: str) -> None:
        self._send(status, lambda_error(error_type, message))

    def _refused(self) -> bool:
        refusal = self.server.front_door.origin_refusal(self.headers.get("Host", ""), self.headers.get("Origin"),
                                                        self.headers.get("Sec-Fetch-Site"))
        if refusal is not None:
            self.close_connection = True
            self._error(refusal[0], "Forbidden", refusal[1])
        return refusal is not None

    def do_GET(self):
        if self._refused():
            return
        env = self.server.environment
        if self.path != f"{_API}/invocation/next":
            return self._error(404, "NotFound", f"the Runtime API has no GET {self.path}")
        inv = env.next_invocation()
        if inv is None:
            return self._error(410, "EnvironmentStopped", "this execution environment is being stopped")
        headers = {
            "Lambda-Runtime-Aws-Request-Id": inv.request_id,
            "Lambda-Runtime-Deadline-Ms": str(env.deadline_ms(inv)),
            "Lambda-Runtime-Invoked-Function-Arn": env.function.arn,
            "Lambda-Runtime-Trace-Id": _trace_id(),
        }
        if inv.client_context:
            headers["Lambda-Runtime-Client-Context"] = inv.client_context
        self._send(200, inv.payload, headers)

    def do_POST(self):
        if self._refused():
            return
        env = self.server.environment
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self._error(411, "LengthRequired", "the Runtime API needs a Content-Length")
        body = self.rfile.read(int(length))
        if self.path == f"{_API}/init/error":
            if env.initialized:
                return self._error(403, "InvalidStateTransition", "init errors are reported before /next")
            if not body:
                body = lambda_error(self.headers.get("Lambda-Runtime-Function-Error-Type", "Runtime.Unknown"), "")
            env.failed_init(body)
            return self._send(202, b'{"status":"OK"}')
        match = _POST_PATH.match(self.path)
        if match is None:
            return self._error(404, "NotFound", f"the Runtime API has no POST {self.path}")
        request_id, kind = match.groups()
        error = kind == "error"
        if not error and len(body) > RESPONSE_LIMIT:
            if env.answer(request_id, lambda_error("Function.ResponseSizeTooLarge", (
                    f"Response payload size ({len(body)} bytes) exceeded maximum allowed payload size "
                    f"({RESPONSE_LIMIT} bytes).")), True):
                return self._error(413, "RequestEntityTooLarge",
                                   f"Exceeded maximum allowed payload size ({RESPONSE_LIMIT} bytes).")
        elif error and not body:
            body = lambda_error(self.headers.get("Lambda-Runtime-Function-Error-Type", "Runtime.Unknown"), "")
        if not env.answer(request_id, body, error):
            return self._error(400, "InvalidRequestID", f"Invalid request ID {request_id!r}")
        self._send(202, b'{"status":"OK"}')


def _trace_id() -> str:
    return f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Parent={uuid.uuid4().hex[:16]};Sampled=0"


class LambdaRuntime:
    """The functions the emulator serves and their execution environments."""

    def __init__(self, base_env: dict, max_environments: int):
        self.base_env = base_env
        self.max_environments = max(1, max_environments)
        self.workdir = tempfile.mkdtemp(prefix="fnmap-lambda-")
        self.runtime_dir = link_runtime(os.path.join(self.workdir, "runtime"))
        self.functions: dict[str, Function] = {}
        #: The published layers, each version unpacked in a folder of its own.
        self.layers = LayerStore(lambda data: self._unzip(data, "layer"))
        #: Functions made with CreateFunction, and their tags (GetFunction finds only these).
        self.created: dict[str, dict] = {}
        self.stats: dict[str, int] = {"cold_starts": 0, "warm_starts": 0, "init_errors": 0, "timeouts": 0,
                                      "runtime_exits": 0}
        self._idle: list[Environment] = []
        self._all: set[Environment] = set()
        self._count = 0
        self._cond = threading.Condition()
        self._default_code: str | None = None
        self._folders = itertools.count()
        self._closed = False
        # Environments are started from one long-lived thread: the death signal set in each child
        # (PR_SET_PDEATHSIG) fires when the thread that forked it ends, not only the emulator.
        self._launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fnmap-lambda-launch")
        atexit.register(self.close)

    # -- functions, code and layers ---------------------------------------------------

    def function(self, name: str) -> Function:
        """The function ``name``; one not created yet runs the default package (this fnmap, packaged)."""
        with self._cond:
            if name not in self.functions:
                self.functions[name] = Function(name, self._default_package())
            return self.functions[name]

    def _default_package(self) -> str:
        if self._default_code is None:
            from ..deploy.package import build_folder

            self._default_code = build_folder(os.path.join(self.workdir, "package"))
        return self._default_code

    def _unzip(self, data: bytes, what: str) -> str:
        folder = os.path.join(self.workdir, f"{what}-{next(self._folders)}")
        import io

        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                zf.extractall(folder)
        except zipfile.BadZipFile as e:
            raise ValueError(f"the {what} is not a zip file ({e}); send the zip's bytes") from None
        return folder

    def configure(self, name: str, *, zip_file: bytes | None = None, timeout=None, memory=None,
                  variables=None, layers=None) -> Function:
        """Change a function's code or configuration; environments of the old revision retire."""
        if timeout is not None and not (isinstance(timeout, int) and 1 <= timeout <= 900):
            raise ValueError(f"Timeout={timeout!r} must be an integer from 1 to 900 seconds")
        if memory is not None and not (isinstance(memory, int) and 128 <= memory <= 10240):
            raise ValueError(f"MemorySize={memory!r} must be an integer from 128 to 10240 MB")
        resolved = None if layers is None else [(arn, self.layers.folder(arn)) for arn in layers]
        code = self._unzip(zip_file, "code") if zip_file is not None else None
        current = self.function(name)
        with self._cond:
            self.functions[name] = Function(
                name, code or current.code, timeout if timeout is not None else current.timeout,
                memory if memory is not None else current.memory,
                dict(variables) if variables is not None else current.variables,
                resolved if resolved is not None else current.layers, current.revision + 1)
            self._cond.notify_all()
            return self.functions[name]

    def delete_function(self, name: str) -> bool:
        """Remove a function made with CreateFunction; its environments retire.  False if none."""
        with self._cond:
            if self.created.pop(name, None) is None:
                return False
            self.functions.pop(name, None)
            for env in list(self._idle):
                if env.function.name == name:
                    self._idle.remove(env)
                    self._retire(env)
            self._cond.notify_all()
            return True

    # -- invocations ---------------------------------------------------------------------

    def invoke(self, name: str, payload: bytes, client_context: str | None = None) -> tuple[bytes, bool]:
        """Run one event in an environment of ``name``; return ``(Lambda's answer, function error?)``."""
        env = self._acquire(self.function(name))
        try:
            body, error = env.invoke(Invocation(payload, client_context))
        finally:
            self._release(env)
        counter = {"init_error": "init_errors", "exit": "runtime_exits", "timeout": "timeouts"}.get(env.outcome)
        if counter:
            self.stats[counter] += 1
        return body, error

    def _acquire(self, function: Function) -> Environment:
        grace_until = time.monotonic() + REUSE_GRACE_SECONDS
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the emulator is stopping")
                function = self.functions.get(function.name, function)
                for env in reversed(self._idle):
                    if env.function is function and env.alive:
                        self._idle.remove(env)
                        env.busy = True
                        self.stats["warm_starts"] += 1
                        return env
                # An environment that just answered asks for its next event within milliseconds: wait
                # for it rather than start another (a client's next call follows its last answer at once).
                finishing = any(e.function is function and not e.busy and e.alive for e in self._all)
                if finishing and time.monotonic() < grace_until:
                    self._cond.wait(max(0.0, grace_until - time.monotonic()))
                    continue
                if self._count < self.max_environments:
                    break
                if self._idle:  # make room: stop an idle environment of another function or revision
                    self._retire(self._idle.pop(0))
                    continue
                self._cond.wait(1.0)
            self._count += 1
            self.stats["cold_starts"] += 1
        try:
            env = Environment(function, self.runtime_dir, self.base_env, self._launch, self._ready, self._exited)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._all.add(env)
        return env

    def _release(self, env: Environment) -> None:
        with self._cond:
            env.busy = False
            if env.alive and not self._closed and self.functions.get(env.function.name) is env.function:
                if env.waiting:  # else it becomes idle when its runtime asks for the next event
                    self._idle.append(env)
            else:
                self._retire(env)
            self._cond.notify_all()

    def _ready(self, env: Environment) -> None:
        """The runtime of ``env`` waits in ``/next``: an environment no Invoke holds becomes idle."""
        with self._cond:
            if not env.busy and not env.retired and env.alive and env not in self._idle:
                self._idle.append(env)
                self._cond.notify_all()

    def _exited(self, env: Environment) -> None:
        """The process of ``env`` ended; one no Invoke holds is stopped here (a held one on release)."""
        with self._cond:
            if not env.busy:
                if env in self._idle:
                    self._idle.remove(env)
                self._retire(env)
                self._cond.notify_all()

    def _retire(self, env: Environment) -> None:
        """Stop ``env`` and stop counting it (the caller holds the lock; ``env`` is in no idle list)."""
        if not env.retired:
            env.retired = True
            self._count -= 1
            self._all.discard(env)
        env.kill()

    def _launch(self, command: list[str], env: dict, cwd: str) -> subprocess.Popen:
        def start():
            return subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=sys.stderr.fileno(), preexec_fn=_die_with_parent())

        return self._launcher.submit(start).result()

    def environments(self) -> int:
        return self._count

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            envs, self._idle = list(self._all), []
            self._cond.notify_all()
        for env in envs:
            env.kill()
        self._launcher.shutdown(wait=False)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _die_with_parent():
    """A ``preexec_fn`` that has Linux kill the child when the emulator dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def set_death_signal():
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return set_death_signal


def link_runtime(dest: str) -> str:
    """Make ``dest`` a folder of links to the installed awslambdaric and boto3 and their dependencies:
    what Lambda's Python runtime provides beside the package (its ``/var/runtime``), and nothing else."""
    os.makedirs(dest, exist_ok=True)
    seen: set[str] = set()
    todo = list(RUNTIME_DISTRIBUTIONS)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                todo.append(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
        for top in _top_level_entries(dist):
            source = os.path.realpath(str(dist.locate_file(top)))
            target = os.path.join(dest, top)
            if os.path.exists(source) and not os.path.lexists(target):
                os.symlink(source, target)
    return dest


def _top_level_entries(dist) -> set[str]:
    """Top-level packages and modules a distribution installed (no metadata, scripts or .pth files)."""
    entries = set()
    for path in dist.files or []:
        first = path.parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".egg-info", ".pth", ".data")):
            continue
        if len(path.parts) > 1 or first.endswith((".py", ".so", ".pyd")):
            entries.add(first)
    return entries
