"""The client: sends a job's calls through a backend and gathers their results.

One :class:`Client` per deployment (backend + storage + secret), shared by
every job of the process, so the emulator, the connections and uploaded
functions are reused.  Dispatch runs on a thread pool sized to the backend's
``max_workers``; an AIMD throttle (:class:`fnmap.policy.Throttle`) lowers the
number of calls in flight when the platform answers 429.  A monitor thread
gathers results of asynchronous calls with one LIST per poll, declares silent
calls lost, and launches speculative copies of stragglers.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback

from . import policy
from .backends import create_backend
from .backends.base import Invocation
from .errors import STORAGE_REFUSED_ERRNOS, ConfigError, KeyNotFound, PlatformFault, StorageError, storage_fix
from .job import CallState, Job
from .runtime import compression, keys, signing
from .runtime.serialization import loads, pickle_function, runtime_info
from .runtime.wire import CallRequest, decode_response, encode
from .storage import open_store

_RUNTIME = runtime_info()
#: Backends whose workers write to this process's terminal: their captured output is not echoed
#: there unless output="live" (issue 14); cloud workers echo it into the platform's log.
_BACKENDS_ON_THIS_TERMINAL = ("emulator", "local")
#: Seconds past a call's timeout before an asynchronous call counts as lost.
LOST_GRACE_SECONDS = 10.0
_POLL_SECONDS = (0.05, 1.0)
#: How long calls submitted one by one wait to be sent together where the backend batches calls.
COALESCE_SECONDS = 0.1


class Client:
    def __init__(self, config):
        self.config = config
        self.store = open_store(config.storage_url)
        self.backend = create_backend(config)
        secret = config.secret.encode() if config.secret else self.backend.secret
        if not secret:
            raise ConfigError(
                f"the {config.backend} backend needs the deployment's shared secret to sign requests: "
                "set FNMAP_SECRET (or secret=...) to the value the deploy script printed"
            )
        self.secret = secret
        self.max_workers = self.backend.max_workers
        # A fixed set of daemon threads over one queue of steps; lighter than a ThreadPoolExecutor,
        # which allocates a Future per step (100,000 queued calls carried 100,000 of them).
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._dispatch_loop, name=f"fnmap-dispatch_{i}", daemon=True)
            for i in range(self.max_workers)
        ]
        for thread in self._threads:
            thread.start()
        self._throttle = policy.Throttle(self.max_workers)
        self._slots = threading.Condition()
        #: One entry per call in flight (see ``_acquire_slot``).
        self._sends: list[None] = []
        self._uploaded: set[str] = set()
        #: Calls waiting to be sent together to a backend that batches calls (see ``_coalesce``).
        self._pending: dict[Job, list[CallState]] = {}
        self._pending_lock = threading.Lock()
        self._active: set[Job] = set()
        self._active_lock = threading.Lock()
        self._monitor: threading.Thread | None = None
        self.closed = False

    # -- functions -----------------------------------------------------------

    def upload_function(self, func) -> str:
        """Pickle ``func`` and store it under its content hash (once per process and store)."""
        if not callable(func):
            raise TypeError(f"fnmap needs a callable to run, got {type(func).__name__}: {func!r:.100}")
        digest, data = pickle_function(func)
        key = keys.function_key(digest)
        if key not in self._uploaded:
            with self.storage_errors("store the function"):
                if not self.store.exists(key):
                    self.store.put(key, data)
            self._uploaded.add(key)
        return key

    @contextlib.contextmanager
    def storage_errors(self, doing: str):
        """Turn a refused write into a :class:`StorageError` naming the storage, the setting it came
        from and the fix (a raw ``OSError: Read-only file system: '.../functions'`` named none)."""
        try:
            yield
        except OSError as e:
            if isinstance(e, KeyNotFound):
                raise
            cfg = self.config
            where = (cfg.describe("storage") if cfg.source("storage") != "default"
                     else "the default storage (no storage= or FNMAP_STORAGE set)")
            fix = storage_fix(e) if e.errno in STORAGE_REFUSED_ERRNOS else "check that the storage is reachable"
            err = StorageError(f"cannot {doing} in {self.store.url}, {where}: "
                               f"{e.strerror or e} ({getattr(e, 'filename', None) or ''}); {fix}")
            err.errno = e.errno
            raise err from e

    # -- jobs ----------------------------------------------------------------

    def new_job(self, config, kind: str = "map") -> Job:
        job = Job(self, config, kind)
        with self._active_lock:
            self._active.add(job)
        self._ensure_monitor()
        return job

    def _spawn(self, step, job: Job, target, *args) -> None:
        """Queue one step of a call (or of a list of ``(state, attempt)``) for the dispatch threads."""
        if self.closed:  # no thread would take it: fail the call(s) rather than leave them pending
            fault = PlatformFault("cancelled", "the fnmap client was closed before this call was sent")
            for state in ([s for s, _ in target] if isinstance(target, list) else [target]):
                job.fail(state, fault, 0)
            self._maybe_retire(job)
            return
        self._steps.put((step, job, target, args))

    def _dispatch_loop(self) -> None:
        """Body of each dispatch thread.

        An unexpected error in fnmap's own code fails the call(s) with that error
        rather than vanishing and leaving their futures pending forever.
        """
        while True:
            item = self._steps.get()
            if item is None:
                return
            step, job, target, args = item
            try:
                step(job, target, *args)
            except BaseException as e:  # noqa: B036 - nothing may leave a call unresolved
                detail = "".join(traceback.format_exception(type(e), e, e.__traceback__))
                fault = PlatformFault("client", f"internal error in the fnmap client: {e!r}\n{detail}")
                states = [s for s, _ in target] if isinstance(target, list) else [target]
                for state in states:
                    job.fail(state, fault, 0)
                self._maybe_retire(job)

    def dispatch(self, job: Job, state: CallState) -> None:
        """Dispatch one call (``Executor.submit``, a Dask task)."""
        if self.backend.batches_calls:
            self._coalesce(job, state)
            return
        self._spawn(self._attempt, job, state, job.next_attempt(state))

    def _coalesce(self, job: Job, state: CallState) -> None:
        """Gather calls submitted one at a time for ``COALESCE_SECONDS``, then send them together:
        on Batch, 1,000 ``submit`` calls in a loop become one array job, not 1,000 jobs."""
        with self._pending_lock:
            pending = self._pending.setdefault(job, [])
            pending.append(state)
            first = len(pending) == 1
        if first:
            timer = threading.Timer(COALESCE_SECONDS, self._flush_pending, (job,))
            timer.daemon = True
            timer.start()

    def _flush_pending(self, job: Job) -> None:
        with self._pending_lock:
            states = self._pending.pop(job, [])
        if states:
            self.dispatch_many(job, states)

    def dispatch_many(self, job: Job, states: list[CallState]) -> None:
        """Dispatch a job's calls: one by one, or all in one request where the backend batches calls."""
        attempts = job.next_attempts(states)
        if not self.backend.batches_calls:
            for state, attempt in attempts:
                self._spawn(self._attempt, job, state, attempt)
            return
        self._spawn(self._attempt_many, job, attempts)

    def _invocation(self, job: Job, state: CallState, attempt: int) -> Invocation | None:
        """The signed request of one attempt, or None when the call needs no attempt any more."""
        if state.done:
            return None
        if attempt == 1:
            if not job.start_call(state):  # cancelled (by the caller, or with its job) before it started
                return None
        elif job.abandoned:  # nobody waits for the result: no retry, no copy
            with job._lock:
                others_out = state.in_flight > 0
            if not others_out:  # the attempt in flight decides; otherwise the call ends here
                job.fail(state, PlatformFault("cancelled", "the job was abandoned before this call "
                                              "could be retried"), attempt - 1)
            return None
        cfg = job.config
        req = CallRequest(
            job_id=job.id, call_id=state.call_id, func_key=state.func_key, store_url=self.store.url,
            attempt=attempt, timeout=cfg.timeout, items_key=state.items_key,
            inline_result_limit=cfg.inline_limit, extra_env=cfg.extra_env, runtime=_RUNTIME,
            first_index=state.first_index, retry_on=job.retry_on_names,
            # retry_on re-runs share the retries left (speculative copies and 429s use none).
            max_attempts=attempt + max(0, cfg.retries - state.charged), output=cfg.output,
            echo_output=cfg.output == "live" or cfg.backend not in _BACKENDS_ON_THIS_TERMINAL,
        )
        payload = state.payload
        if payload is None:  # finished by another copy meanwhile
            return None
        body = encode(req, payload)
        return Invocation(req, body, signing.sign(self.secret, body), cfg)

    def _attempt_many(self, job: Job, attempts: list[tuple[CallState, int]]) -> None:
        """One platform request for many calls (an array job); each answer is handled as in ``_attempt``."""
        ready = [(s, a, inv) for s, a in attempts if (inv := self._invocation(job, s, a)) is not None]
        if not ready:
            return
        ticket, _at_floor = self._acquire_slot()
        for state, attempt, _ in ready:
            job.record_attempt(state, attempt, time.time())
        try:
            answers = self.backend.invoke_many([inv for _, _, inv in ready])
        except Exception as e:
            fault = e if isinstance(e, PlatformFault) else PlatformFault("server", f"{type(e).__name__}: {e}")
            self._release_slot(fault.kind == "throttled", ticket)
            for state, attempt, _ in ready:
                self._spawn(self._on_fault, job, state, attempt, fault)
            return
        self._release_slot(False, ticket)
        for (state, attempt, _), answer in zip(ready, answers, strict=True):
            if answer is None:
                self._accepted(job, state, attempt)
            else:
                self._spawn(self._on_answer, job, state, attempt, answer)

    def _accepted(self, job: Job, state: CallState, attempt: int) -> None:
        with job._lock:
            if state.awaiting is None:
                state.awaiting = {}
            state.awaiting[attempt] = time.time()

    def _attempt(self, job: Job, state: CallState, attempt: int) -> None:
        invocation = self._invocation(job, state, attempt)
        if invocation is None:
            return
        ticket, at_floor = self._acquire_slot()
        job.record_attempt(state, attempt, time.time())
        try:
            answer = self.backend.invoke(invocation)
        except PlatformFault as fault:
            throttled = fault.kind == "throttled"
            self._release_slot(throttled, ticket)
            self._on_fault(job, state, attempt, fault, policy.charges_retry(fault.kind, at_floor))
            return
        except Exception as e:  # a backend bug or an unexpected client error: a server-side fault
            self._release_slot(False, ticket)
            self._on_fault(job, state, attempt, PlatformFault("server", f"{type(e).__name__}: {e}"))
            return
        self._release_slot(False, ticket)
        if answer is None:
            self._accepted(job, state, attempt)
            return
        self._on_answer(job, state, attempt, answer)

    def _on_answer(self, job: Job, state: CallState, attempt: int, answer: bytes) -> None:
        try:
            resp, payload = decode_response(answer)
        except (ValueError, TypeError) as e:
            self._on_fault(job, state, attempt, PlatformFault("server", f"malformed answer: {e}"))
            return
        if not resp.ok:
            self._on_fault(job, state, attempt, PlatformFault(resp.error_kind or "server", resp.error or ""))
            return
        try:
            data = bytes(payload) if resp.inline else self.store.get(resp.result_key)
            outcomes = loads(compression.unpack(data))
        except Exception as e:
            self._on_fault(job, state, attempt, PlatformFault("server", f"cannot read the result: {e!r}"))
            return
        if resp.error_kind == "retry_on":  # a user exception the caller asked to retry
            job.record_fault(state, attempt, "retry_on")
            with job._lock:
                state.charged += 1
            time.sleep(policy.backoff_delay(state.charged))
            if not state.done:
                self._attempt(job, state, job.next_attempt(state))
            return
        job.finish(state, outcomes, resp.stats, attempt)
        self._maybe_retire(job)

    def _on_fault(self, job: Job, state: CallState, attempt: int, fault: PlatformFault,
                  charge: bool | None = None) -> None:
        """Retry an attempt's platform fault with backoff and jitter, or fail the call for good.

        Only faults that :func:`policy.charges_retry` charges use up ``retries``; while
        another attempt of the call (a speculative copy) is still out, that one decides.
        """
        job.record_fault(state, attempt, fault.kind)
        if charge is None:
            charge = policy.charges_retry(fault.kind, self._throttle.at_floor)
        with job._lock:
            if state.done:
                return
            if charge:
                state.charged += 1
            charged, others_out = state.charged, state.in_flight > 0
        if others_out:
            return
        if not job.abandoned and policy.retry_fault(fault.retryable, charged, job.config.retries):
            if fault.retry_after is not None:
                delay = fault.retry_after
            else:
                delay = policy.backoff_delay(max(1, charged if charge else len(state.attempts)))
            time.sleep(delay)
            if not state.done:
                self._attempt(job, state, job.next_attempt(state))
            return
        job.fail(state, fault, attempt)
        self._maybe_retire(job)

    # -- throttle ------------------------------------------------------------

    def _acquire_slot(self) -> tuple[int, bool]:
        """Wait for room under the throttle; return the send's ticket and whether the limit is at
        its floor.

        Every send is one entry in ``_sends`` (``list.append``/``pop`` are atomic), so the count
        in flight is always exact.  While no 429 has lowered the limit, the dispatch threads
        themselves bound the calls in flight (one each, ``max_workers`` of them) and a send
        takes no lock: a lock shared by every dispatch thread on every call made them queue
        behind each other and tripled the client's CPU per call (issue 9).
        """
        throttle = self._throttle
        if throttle.limit < throttle.ceiling:
            with self._slots:
                while len(self._sends) >= throttle.allowed():
                    self._slots.wait(0.1)
                self._sends.append(None)
                return throttle.ticket(), throttle.at_floor
        self._sends.append(None)
        return throttle.ticket(), throttle.at_floor

    def _release_slot(self, throttled: bool, ticket: int | None = None) -> None:
        self._sends.pop()
        throttle = self._throttle
        if not throttled and throttle.limit >= throttle.ceiling:
            return  # unthrottled: nothing to update, nobody is waiting for room
        with self._slots:
            if throttled:
                throttle.on_throttled(ticket)
            else:
                throttle.on_success()
            self._slots.notify_all()

    # -- monitor: async results, lost calls, stragglers ------------------------

    def _ensure_monitor(self) -> None:
        with self._active_lock:
            if self._monitor is None or not self._monitor.is_alive():
                self._monitor = threading.Thread(target=self._monitor_loop, name="fnmap-monitor", daemon=True)
                self._monitor.start()

    def _maybe_retire(self, job: Job) -> None:
        if job.done:
            with self._active_lock:
                self._active.discard(job)

    def _monitor_loop(self) -> None:
        delay = _POLL_SECONDS[0]
        while not self.closed:
            with self._active_lock:
                jobs = list(self._active)
                if not jobs:
                    self._monitor = None
                    return
            for job in jobs:
                if job.done:
                    self._maybe_retire(job)
                    continue
                try:
                    self._poll(job)
                except Exception:  # storage hiccup: the next poll tries again
                    pass
                self._speculate(job)
            try:
                self._platform_failures(jobs)
            except Exception:  # the platform's status API hiccupped: the next poll asks again
                pass
            time.sleep(delay)
            delay = min(_POLL_SECONDS[1], delay * 1.5)

    def _poll(self, job: Job) -> None:
        waiting = [s for s in job.calls if s.awaiting and not s.done]
        if not waiting:
            return
        finished = {keys.call_id_from_key(k) for k in self.store.list(keys.results_prefix(job.id))}
        now = time.time()
        lost_after = job.config.timeout + LOST_GRACE_SECONDS if job.config.timeout else self.backend.lost_after
        if self.backend.watches_calls:  # the platform reports failed calls itself (poll_failures)
            lost_after = self.backend.lost_after
        for state in waiting:
            if state.call_id in finished:
                attempt = max(state.awaiting)
                stored = self.store.get(keys.result_key(job.id, state.call_id))
                outcomes = loads(compression.unpack(stored))
                state.awaiting = None
                if job.finish(state, outcomes, None, attempt):
                    self._maybe_retire(job)
                continue
            if lost_after is not None:
                for attempt, since in list(state.awaiting.items()):
                    if now - since > lost_after:
                        del state.awaiting[attempt]
                        fault = PlatformFault("lost", f"no result {lost_after:.0f} s after it was accepted")
                        self._spawn(self._on_fault, job, state, attempt, fault)

    def _platform_failures(self, jobs: list[Job]) -> None:
        """Route the calls the platform reports as failed to the usual fault handling (retry or fail)."""
        by_id = {job.id: job for job in jobs}
        for failure in self.backend.poll_failures():
            job = by_id.get(failure.job_id)
            if job is None or not 0 <= failure.call_id < len(job.calls):
                continue
            state = job.calls[failure.call_id]
            with job._lock:
                if state.done or not state.awaiting or failure.attempt not in state.awaiting:
                    continue
                del state.awaiting[failure.attempt]
            self._spawn(self._on_fault, job, state, failure.attempt, failure.fault)

    def stop_copies(self, job: Job, state: CallState, attempts: list[int]) -> None:
        """A call's outcome is final while ``attempts`` of it are still out (speculative copies,
        an attempt declared lost): have the backend stop them where it can (the emulator kills
        their worker processes, Batch terminates their containers).  Elsewhere they run on and
        their late results are discarded as duplicates.  Best effort: a copy that is not stopped
        costs only its own run, so a failure to stop it is not the job's failure."""
        try:
            self.backend.stop_attempts(job.id, [(state.call_id, a) for a in attempts], self.secret)
        except Exception:  # see above: the late result is discarded in any case
            pass

    def _speculate(self, job: Job) -> None:
        # A Dask graph job gets calls as tasks become ready and is sealed only at the end; "most
        # of the job done" then means most of the calls sent so far, i.e. the graph's frontier
        # waits on a few slow tasks, which is when a copy helps most (issue 4).
        if not (job.sealed or job.kind == "dask") or not job.config.speculation or job.abandoned:
            return
        with job._lock:
            running = {s.call_id: s.sent_at for s in job.calls
                       if not s.done and s.in_flight and not s.speculated}
            durations = list(job.durations)
        picks = policy.stragglers(running, durations, job.done_count, len(job.calls), time.time())
        for call_id in picks:
            state = job.calls[call_id]
            state.speculated = True
            self._spawn(self._attempt, job, state, job.next_attempt(state))

    def close(self) -> None:
        self.closed = True
        for _ in self._threads:
            self._steps.put(None)
        self.backend.close()


_clients: dict[tuple, Client] = {}
_clients_lock = threading.Lock()


def get_client(config) -> Client:
    """The process-wide client for a deployment (created on first use)."""
    key = config.deployment_key()
    with _clients_lock:
        client = _clients.get(key)
        if client is not None and not client.closed and not _usable(client):
            client.close()  # its emulator is gone (killed): a new client starts a new one
        if client is None or client.closed:
            client = _clients[key] = Client(config)
        return client


def _usable(client: Client) -> bool:
    usable = getattr(client.backend, "usable", None)
    return usable is None or usable()
