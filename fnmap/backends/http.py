"""``http``: POST signed invocations to any HTTP-triggered function.

Google Cloud Functions, Cloud Run, Knative, Function Compute and SCF web
functions, and the emulator all take the same request: the envelope as the
body and its HMAC in ``X-Fnmap-Signature``.  Each dispatch thread keeps its own
``requests.Session`` so connections are reused.
"""

from __future__ import annotations

import threading

import requests

from ..errors import ConfigError, PlatformFault
from ..signing import SIGNATURE_HEADER
from ..wire import ERROR_KIND_HEADER
from .base import BaseBackend, Invocation

_CONNECT_TIMEOUT = 10.0
#: Extra seconds past a call's timeout before the client declares it lost.
GRACE_SECONDS = 5.0


class HttpBackend(BaseBackend):
    name = "http"

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

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=4, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        return session

    def invoke(self, invocation: Invocation) -> bytes:
        timeout = invocation.request.timeout
        read_timeout = timeout + GRACE_SECONDS if timeout else None
        try:
            r = self._session().post(
                self.invoke_url,
                data=invocation.body,
                headers={SIGNATURE_HEADER: invocation.signature, "Content-Type": "application/octet-stream"},
                timeout=(_CONNECT_TIMEOUT, read_timeout),
            )
        except requests.exceptions.ReadTimeout as e:
            raise PlatformFault("lost", f"no answer from {self.invoke_url} within {read_timeout} s") from e
        except requests.exceptions.ConnectionError as e:
            raise PlatformFault("connection", f"cannot reach {self.invoke_url}: {e}") from e
        if r.status_code == 200:
            return r.content
        raise fault_from_status(r.status_code, r.headers, r.text, self.invoke_url)


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
        return PlatformFault("rejected", message + " (is the client's FNMAP_SECRET the deployment's?)")
    if status >= 500:
        return PlatformFault("server", message)
    return PlatformFault("rejected", message)
