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
import collections
import concurrent.futures
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
import zipfile

from .lambda_environment import INIT_SECONDS, Environment, LambdaEvent, LambdaFunction
from .lambda_layers import LayerStore

__all__ = ["INIT_SECONDS", "Environment", "LambdaFunction", "LambdaRuntime", "link_runtime"]

#: Seconds an invocation waits for an environment of its function that has answered its last event
#: but not yet asked for the next (it does within milliseconds, unless the machine is busy; one that
#: exits instead stops the wait) before it starts a new one.
REUSE_GRACE_SECONDS = 5.0
#: Distributions Lambda's Python runtime provides besides the standard library (``/var/runtime``).
RUNTIME_DISTRIBUTIONS = ("awslambdaric", "boto3")


class LambdaRuntime:
    """The functions the emulator serves and their execution environments."""

    def __init__(self, base_env: dict, max_environments: int):
        self.base_env = base_env
        self.max_environments = max(1, max_environments)
        self.workdir = tempfile.mkdtemp(prefix="fnmap-lambda-")
        self.runtime_dir = link_runtime(os.path.join(self.workdir, "runtime"))
        self.functions: dict[str, LambdaFunction] = {}
        #: The published layers, each version unpacked in a folder of its own.
        self.layers = LayerStore(lambda data: self._unzip(data, "layer"))
        #: Functions made with CreateFunction, and their tags (GetFunction finds only these).
        self.created: dict[str, dict] = {}
        self.stats: dict[str, int] = {"cold_starts": 0, "warm_starts": 0, "init_errors": 0, "timeouts": 0,
                                      "runtime_exits": 0}
        self._idle: list[Environment] = []
        self._all: set[Environment] = set()
        self._count = 0
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        #: Invocations waiting for an environment, by function: each function's waiters on a condition
        #: of their own (of the one lock), the longest-waiting of each woken as an environment frees
        #: up.  Waking every waiter on every release cost more CPU than the invocations with 64 calls
        #: in flight.
        self._waiting: dict[str, threading.Condition] = {}
        self._waiters: collections.Counter = collections.Counter()
        self._default_code: str | None = None
        self._folders = itertools.count()
        self._closed = False
        # Environments are started from one long-lived thread: the death signal set in each child
        # (PR_SET_PDEATHSIG) fires when the thread that forked it ends, not only the emulator.
        self._launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fnmap-lambda-launch")
        atexit.register(self.close)

    # -- functions, code and layers ---------------------------------------------------

    def function(self, name: str) -> LambdaFunction:
        """The function ``name``; one not created yet runs the default package (this fnmap, packaged)."""
        with self._cond:
            if name not in self.functions:
                self.functions[name] = LambdaFunction(name, self._default_package())
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
                  variables=None, layers=None) -> LambdaFunction:
        """Change a function's code or configuration; environments of the old revision retire."""
        if timeout is not None and not (isinstance(timeout, int) and 1 <= timeout <= 900):
            raise ValueError(f"Timeout={timeout!r} must be an integer from 1 to 900 seconds")
        if memory is not None and not (isinstance(memory, int) and 128 <= memory <= 10240):
            raise ValueError(f"MemorySize={memory!r} must be an integer from 128 to 10240 MB")
        resolved = None if layers is None else [(arn, self.layers.folder(arn)) for arn in layers]
        code = self._unzip(zip_file, "code") if zip_file is not None else None
        current = self.function(name)
        with self._cond:
            self.functions[name] = LambdaFunction(
                name, code or current.code, timeout if timeout is not None else current.timeout,
                memory if memory is not None else current.memory,
                dict(variables) if variables is not None else current.variables,
                resolved if resolved is not None else current.layers, current.revision + 1)
            self._wake_all()
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
            self._wake_all()
            return True

    # -- invocations ---------------------------------------------------------------------

    def invoke(self, name: str, payload: bytes, client_context: str | None = None) -> tuple[bytes, bool]:
        """Run one event in an environment of ``name``; return ``(Lambda's answer, function error?)``."""
        env = self._acquire(self.function(name))
        try:
            body, error = env.invoke(LambdaEvent(payload, client_context))
        finally:
            self._release(env)
        counter = {"init_error": "init_errors", "exit": "runtime_exits", "timeout": "timeouts"}.get(env.ending)
        if counter:
            self.stats[counter] += 1
        return body, error

    def _acquire(self, function: LambdaFunction) -> Environment:
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
                    self._wait(function.name, max(0.0, grace_until - time.monotonic()))
                    continue
                if self._count < self.max_environments:
                    break
                if self._idle:  # make room: stop an idle environment of another function or revision
                    self._retire(self._idle.pop(0))
                    continue
                self._wait(function.name, 1.0)
            self._count += 1
            self.stats["cold_starts"] += 1
        try:
            env = Environment(function, self.runtime_dir, self.base_env, self._launch, self._ready, self._exited)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._wake()
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
                    self._wake()
            else:
                self._retire(env)
                self._wake()

    def _ready(self, env: Environment) -> None:
        """The runtime of ``env`` waits in ``/next``: an environment no Invoke holds becomes idle."""
        with self._cond:
            if not env.busy and not env.retired and env.alive and env not in self._idle:
                self._idle.append(env)
                self._wake()

    def _exited(self, env: Environment) -> None:
        """The process of ``env`` ended; one no Invoke holds is stopped here (a held one on release)."""
        with self._cond:
            if not env.busy:
                if env in self._idle:
                    self._idle.remove(env)
                self._retire(env)
                self._wake()

    def _wait(self, name: str, timeout: float) -> None:
        """Wait (holding the lock) until an environment of function ``name`` may be free, or ``timeout``."""
        cond = self._waiting.get(name)
        if cond is None:
            cond = self._waiting[name] = threading.Condition(self._lock)
        self._waiters[name] += 1
        try:
            cond.wait(timeout)
        finally:
            self._waiters[name] -= 1

    def _wake(self) -> None:
        """Wake the longest-waiting invocation of each function (the caller holds the lock): an
        environment is idle, or there is room for a new one.  One per function, not all of them: the
        one of the freed environment's function takes it; one of another may stop it to make room,
        as any waiting invocation may.  Each woken one looks again and waits again if it found nothing."""
        for name, cond in self._waiting.items():
            if self._waiters[name] > 0:
                cond.notify(1)

    def _wake_all(self) -> None:
        """Wake every waiting invocation: functions changed, or the emulator is stopping."""
        for cond in self._waiting.values():
            cond.notify_all()

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
            self._wake_all()
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
