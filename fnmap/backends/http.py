"""``http``: POST signed invocations to any HTTP-triggered function.

Google Cloud Functions, Cloud Run, Knative, Function Compute and SCF web
functions, and the emulator all take the same request: the envelope as the
body and its HMAC in ``X-Fnmap-Signature``.  Each dispatch thread keeps its own
keep-alive connection.  Plain ``http://`` targets that no proxy applies to (the
emulator, in-cluster functions) are posted with :mod:`.rawhttp` directly: a
``requests.Session`` spent about 1 ms of client CPU per call on a noop job
(netrc lookups, adapters, pool bookkeeping), more than the call itself, and
``http.client`` half of what remained.
Everything else (``https://``, proxies) goes through ``requests``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from urllib.parse import urlsplit

from ..errors import ConfigError, PlatformFault
from ..runtime.signing import ROUTE_CANCEL, SIGNATURE_HEADER, sign_request
from ..runtime.wire import ERROR_KIND_HEADER
from . import rawhttp
from .base import Answer, BaseBackend, Invocation

_CONNECT_TIMEOUT = 10.0
#: Extra seconds past a call's timeout before the client declares it lost.
GRACE_SECONDS = 5.0
#: Where a host that can stop calls (the emulator) takes ``POST`` requests to stop attempts.
STOP_PATH = "/cancel"
_STOP_TIMEOUT = 30.0


class HttpBackend(BaseBackend):
    name = "http"
    stops_attempts = True  # see BaseBackend: its stop_attempts stops a running call
    #: A request and a response per call: a fraction of a second amortizes it.
    call_seconds = 0.5

    def __init__(self, config, url: str | None = None):
        url = url or config.http_url
        if not url:
            raise ConfigError(
                "the http backend needs the function's URL: set http_url=... or FNMAP_HTTP_URL "
                "(the URL the deploy script printed)"
            )
        self.url = url.rstrip("/")
        self.invoke_url = self.url
        self.max_workers = config.workers or 64
        self._local = threading.local()
        #: Headers every request to the host carries, whichever way it is sent.
        self.headers: dict[str, str] = {}
        #: Set once the host answered that it has no stop route (a function host, not the emulator).
        self._cannot_stop = False

    def _session(self):
        session = getattr(self._local, "session", None)
        if session is None:
            import requests  # here: the emulator's plain-http path never needs it (0.1 s to import)

            session = self._local.session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=4, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        return session

    def invoke(self, invocation: Invocation) -> Answer:
        timeout = invocation.request.timeout
        read_timeout = timeout + GRACE_SECONDS if timeout else None
        target = self._plain_target()
        if target is not None:
            return Answer(self._post_plain(target, invocation, read_timeout))
        session = self._session()
        import requests

        try:
            r = session.post(
                self.invoke_url,
                data=invocation.body,
                headers={SIGNATURE_HEADER: invocation.signature, "Content-Type": "application/octet-stream",
                         **self.headers},
                timeout=(_CONNECT_TIMEOUT, read_timeout),
            )
        except requests.exceptions.ReadTimeout as e:
            raise PlatformFault("lost", f"no answer from {self.invoke_url} within {read_timeout} s") from e
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as e:
            # A reset mid-response (the host died while answering) is a connection fault too.
            raise PlatformFault("connection", f"cannot reach {self.invoke_url}: {e}") from e
        if r.status_code == 200:
            return Answer(r.content)
        raise self.refused(r.status_code, r.headers, r.text, self.invoke_url)

    def refused(self, status: int, headers, text: str, url: str) -> PlatformFault:
        """The fault a non-200 answer of the host is (:func:`fault_from_status`)."""
        return fault_from_status(status, headers, text, url)

    def stop_attempts(self, job_id: str, attempts: list[tuple[int, int]], secret: bytes) -> None:
        """Ask the host to stop these attempts: ``POST /cancel`` with ``{"job_id", "attempts"}``,
        signed with the job's secret as an invocation is.  The emulator kills the worker
        processes running them; a function host without that route answers 404 once and is not
        asked again (its copies run on and their results are discarded)."""
        if not attempts or self._cannot_stop:
            return
        import requests

        body = json.dumps({"job_id": job_id, "attempts": [list(a) for a in attempts]}).encode()
        base = self.url.removesuffix("/invoke")  # an emulator's invoke URL given as http_url
        url = base + STOP_PATH
        try:
            signature = sign_request(secret, ROUTE_CANCEL, job_id, "", "", body)
            r = self._session().post(url, data=body, timeout=(_CONNECT_TIMEOUT, _STOP_TIMEOUT),
                                     headers={SIGNATURE_HEADER: signature, "Content-Type": "application/json",
                                              **self.headers})
        except requests.exceptions.RequestException as e:
            raise PlatformFault("connection", f"cannot reach {url}: {e}") from e
        if r.status_code in (404, 405, 501):
            self._cannot_stop = True
            return
        if r.status_code != 200:
            raise self.refused(r.status_code, r.headers, r.text, url)

    def _plain_target(self) -> tuple[str, int, str] | None:
        """``(host, port, path)`` when ``invoke_url`` is plain HTTP with no proxy, else None."""
        cached = getattr(self, "_target_for", None)
        if cached is not None and cached[0] == self.invoke_url:
            return cached[1]
        parts = urlsplit(self.invoke_url)
        target = None
        proxied = _proxied(parts.hostname or "")
        if parts.scheme == "http" and parts.hostname and not proxied:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            target = (parts.hostname, parts.port or 80, path)
        self._target_for = (self.invoke_url, target)
        return target

    def _post_plain(self, target: tuple[str, int, str], invocation: Invocation,
                    read_timeout: float | None) -> bytes:
        headers = {SIGNATURE_HEADER: invocation.signature, "Content-Type": "application/octet-stream", **self.headers}
        r = self._post_plain_body(target, invocation.body, headers, read_timeout)
        if r.status == 200:
            return r.body
        raise self.refused(r.status, r.headers, r.body.decode(errors="replace"), self.invoke_url)

    def _post_plain_body(self, target: tuple[str, int, str], body: bytes, headers: dict,
                         read_timeout: float | None) -> rawhttp.Response:
        try:
            return self._post_plain_once(target, body, headers, read_timeout)
        except rawhttp.StaleConnection:
            # The server closed the reused connection while idle, before reading the request:
            # it was not served; send it once more, on a new connection.
            return self._post_plain_once(target, body, headers, read_timeout)

    def _post_plain_once(self, target: tuple[str, int, str], body: bytes, headers: dict,
                         read_timeout: float | None) -> rawhttp.Response:
        host, port, path = target
        conn = getattr(self._local, "conn", None)
        if conn is not None and ((conn.host, conn.port) != (host, port) or _dropped(conn)):
            self._forget(conn)
            conn = None
        if conn is None:
            try:
                conn = rawhttp.Connection(host, port, _CONNECT_TIMEOUT)
            except OSError as e:
                raise PlatformFault("connection", f"cannot reach {self.invoke_url}: {e!r}") from e
            self._local.conn = conn
        try:
            r = conn.post(path, body, headers, read_timeout)
        except TimeoutError as e:
            self._forget(conn)
            raise PlatformFault("lost", f"no answer from {self.invoke_url} within {read_timeout} s") from e
        except rawhttp.StaleConnection:
            self._forget(conn)
            raise
        except OSError as e:  # refused, reset, or cut off mid-answer (rawhttp.ProtocolError)
            self._forget(conn)
            raise PlatformFault("connection", f"cannot reach {self.invoke_url}: {e!r}") from e
        if r.will_close:
            self._forget(conn)
        return r

    def _forget(self, conn) -> None:
        if conn is not None:
            conn.close()
        self._local.conn = None


def _dropped(conn) -> bool:
    """An idle keep-alive connection that reads as ready has been closed by the server."""
    if conn.sock is None:
        return True
    try:
        return conn.readable()
    except (OSError, ValueError):
        return True


def fault_from_status(status: int, headers, text: str, url: str) -> PlatformFault:
    """Map a non-200 answer to the kind of fault it is."""
    message = f"{url} answered {status}: {text[:500]}"
    kind = headers.get(ERROR_KIND_HEADER)
    if kind:
        return PlatformFault(kind, message)
    if status == 429:
        retry_after = headers.get("Retry-After")
        try:
            delay = float(retry_after) if retry_after else None
        except ValueError:
            delay = None
        return PlatformFault("throttled", message, retry_after=delay)
    if status in (401, 403):
        return PlatformFault("signature", message + " (is the client's FNMAP_SECRET the deployment's?)")
    if status >= 500:
        return PlatformFault("server", message)
    return PlatformFault("rejected", message)


def _proxied(host: str) -> bool:
    """Whether a plain-HTTP request to ``host`` goes through a proxy (then ``requests`` sends it).

    On Linux the proxies are only the ``*_proxy`` variables: with none set, ``urllib.request``
    (and the ``http.client``, ``email`` and ``ssl`` it imports, some 15 ms of a fresh process's first
    map) is not imported at all.  macOS and Windows read system settings too.
    """
    if sys.platform.startswith("linux") and not any(k.lower().endswith("_proxy") for k in os.environ):
        return False
    import urllib.request

    return "http" in urllib.request.getproxies() and not urllib.request.proxy_bypass(host)
