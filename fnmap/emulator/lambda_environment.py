"""One Lambda execution environment of the emulator: an awslambdaric process and its own Runtime API.

:class:`Environment` starts AWS's runtime interface client over a function's unpacked package with
``AWS_LAMBDA_RUNTIME_API`` pointing at a listener of its own (:class:`_RuntimeApiServer`), hands it
one :class:`LambdaEvent` at a time and reads back the answer, the error or the process's exit.
:class:`.lambda_runtime.LambdaRuntime` keeps the environments of every function (see its module for
the whole Runtime API path).
"""

from __future__ import annotations

import http.server
import os
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from ..runtime.frontdoor import FrontDoor
from .lambda_common import ACCOUNT, HANDLER, REGION, lambda_error
from .memlimit import MemoryWatch

#: Lambda's limit on a synchronous response, enforced by its Runtime API.
RESPONSE_LIMIT = 6 * 1024 * 1024
#: Seconds a new environment may take to ask for its first invocation (awslambdaric's start plus the
#: package's imports), on top of the function's timeout: Lambda's init phase has 10 s of its own.
INIT_SECONDS = 10.0
_API = "/2018-06-01/runtime"
_POST_PATH = re.compile(rf"^{_API}/invocation/([^/]+)/(response|error)$")


@dataclass
class LambdaFunction:
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
class LambdaEvent:
    """One event on its way through an environment, and what came back."""

    payload: bytes
    client_context: str | None = None
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    #: ``(body, function error?)`` once answered.
    answer: tuple[bytes, bool] | None = None
    handed_over: float | None = None  # monotonic time the runtime received it


class Environment:
    """One execution environment: an awslambdaric process and its own Runtime API listener."""

    def __init__(self, function: LambdaFunction, runtime_dir: str, base_env: dict, launch, on_ready, on_exit):
        self.function = function
        #: Called (without this environment's lock) when the runtime asks for work, and when the process ends.
        self._on_ready, self._on_exit = on_ready, on_exit
        #: Owned by the :class:`LambdaRuntime`'s lock: lent to an Invoke; stopped and no longer counted.
        self.busy = True
        self.retired = False
        #: The runtime is waiting in ``/next``: Lambda hands an event only to such an environment.
        self.waiting = False
        #: How the last invocation ended: ok, init_error, exit or timeout.
        self.ending = ""
        self._cond = threading.Condition()
        self._pending: LambdaEvent | None = None
        self._current: LambdaEvent | None = None
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

    def next_invocation(self) -> LambdaEvent | None:
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

    def deadline_ms(self, inv: LambdaEvent) -> int:
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

    def invoke(self, inv: LambdaEvent) -> tuple[bytes, bool]:
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
                self.ending = "ok"
                return inv.answer
            if self.init_error is not None:
                self.ending = "init_error"
                return self.init_error, True
            if self.exit is not None and self.memory.exceeded:
                self.ending = "exit"
                return lambda_error("Runtime.OutOfMemory", (
                    f"RequestId: {inv.request_id} Error: Runtime exited with error: {self.exit} "
                    f"({self.memory.message('the runtime')})")), True
            if self.exit is not None:
                self.ending = "exit"
                return lambda_error("Runtime.ExitError", (
                    f"RequestId: {inv.request_id} Error: Runtime exited with error: {self.exit}")), True
            self.ending = "timeout"
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


