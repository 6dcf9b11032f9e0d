"""The front door of every fnmap HTTP app: requests from other origins are refused before any route.

Loopback is not a security boundary: a web page in the user's browser can send
requests to ``127.0.0.1`` (a ``text/plain`` POST needs no CORS preflight), and
through DNS rebinding (its own host name resolving to ``127.0.0.1``) it can even
read the answers.  So before a route sees a request, :class:`FrontDoor` refuses:

* a ``Host`` that is not an address the server serves (403): DNS rebinding.  Only
  the emulator knows its addresses (:meth:`FrontDoor.serve_at`); a deployed
  handler behind a cloud's front end checks no ``Host``;
* a browser's cross-site request (403): an ``Origin`` other than the server's own
  (``null`` included), or ``Sec-Fetch-Site`` other than ``same-origin``/``none``;
* a body whose ``Content-Type`` is not what the route takes (415): the three types
  a browser sends cross-origin without a preflight (``text/plain``, forms) never
  reach a route.  The AWS JSON routes (the Batch API, Lambda's management API)
  take only JSON types, as boto3 sends; the routes signed with the job's secret
  take theirs or none (plain ``requests`` posts): ``/invoke``
  ``application/octet-stream``, ``/cancel`` JSON; Lambda's Invoke takes the
  bytes boto3 sends with no type, or any type but those three.

It is WSGI middleware, outside Flask and the invocation fast path, so it guards
both servers the emulator runs (its own, and waitress) and every route.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from .httpwire import reason_phrase

#: What a browser may send cross-origin without a CORS preflight (the "CORS-safelisted" types).
BROWSER_SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
JSON_TYPES = frozenset({"application/json", "application/x-amz-json-1.0", "application/x-amz-json-1.1"})
#: ``Sec-Fetch-Site`` values of requests that did not come from another site's page.
SAME_SITE_FETCHES = frozenset({"same-origin", "none"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_INVOKE_PATHS = frozenset({"/", "/invoke"})
_LAMBDA_INVOKE = re.compile(r"/20\d\d-\d\d-\d\d/functions/[^/]+/invocations")
_AWS_API = re.compile(r"/(20\d\d-\d\d-\d\d|v1)/")
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def loopback_names(port: int) -> set[str]:
    """The ``Host`` values a client on this machine uses for ``port``: 127.0.0.1, localhost, [::1]."""
    return {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}


def host_value(host: str, port: int) -> str:
    """``host:port`` as a ``Host`` header writes it (an IPv6 address in brackets), lower case."""
    host = host.strip("[]").lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FrontDoor:
    """WSGI middleware refusing foreign hosts, cross-site browser requests and unexpected bodies.

    ``hosts``: the ``Host`` values allowed (None: any, for an app behind a cloud's front end).
    The emulator sets them once bound, with :meth:`serve_at`.
    """

    def __init__(self, app, hosts: set[str] | None = None):
        self.app = app
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)
        #: Bound to every address (0.0.0.0 or ::): any IP literal with the port is one of ours.
        self._any_ip_port: int | None = None

    def serve_at(self, host: str, port: int, extra_names: tuple[str, ...] = ()) -> None:
        """Allow only the ``Host`` values of a server bound to ``host:port``: its loopback names,
        the bound address, ``extra_names`` (``--allow-host``) and, bound to every address, any IP
        address and this machine's names; each with the port or without."""
        hosts = loopback_names(port) | {host_value(host, port)} | {host_value(n, port) for n in extra_names}
        self._any_ip_port = port if host.strip("[]") in _WILDCARDS else None
        if self._any_ip_port is not None:
            hosts |= {host_value(socket.gethostname(), port), host_value(socket.getfqdn(), port)}
        # The names without the port as well: a client may leave it out, and no other site's page
        # sends one of these names.
        hosts |= {h.rsplit(":", 1)[0] for h in hosts}
        self.hosts = frozenset(hosts)

    def __call__(self, environ, start_response):
        refusal = self.refusal(environ)
        if refusal is None:
            return self.app(environ, start_response)
        status, message = refusal
        body = message.encode()
        start_response(f"{status} {reason_phrase(status)}", [
            ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    def refusal(self, environ) -> tuple[int, str] | None:
        """``(status, why)`` when the request must be refused, else None."""
        refusal = self.origin_refusal(environ.get("HTTP_HOST", ""), environ.get("HTTP_ORIGIN"),
                                      environ.get("HTTP_SEC_FETCH_SITE"))
        if refusal is None and environ.get("REQUEST_METHOD") in _BODY_METHODS:
            return _content_type_refusal(environ.get("PATH_INFO", ""), environ.get("CONTENT_TYPE", ""))
        return refusal

    def origin_refusal(self, host: str, origin: str | None, fetch_site: str | None) -> tuple[int, str] | None:
        """``(403, why)`` for a foreign ``Host`` or a browser's cross-site request, else None."""
        host = host.lower()
        # No Host at all (HTTP/1.0) never comes from a browser: rebinding needs a name in it.
        if self.hosts is not None and host and not self._ours(host):
            return 403, (f"Host {host!r} is not an address this server serves ({', '.join(sorted(self.hosts))}): "
                         "refused (a web page reaching it through DNS rebinding would send that); connect to "
                         "one of those, or start the emulator with --allow-host NAME")
        if origin is not None and not self._own_origin(origin.lower(), host):
            return 403, (f"cross-origin request from {origin!r} refused: the fnmap emulator takes no "
                         "requests from web pages")
        if fetch_site is not None and fetch_site.lower() not in SAME_SITE_FETCHES:
            return 403, (f"Sec-Fetch-Site {fetch_site!r} refused: the fnmap emulator takes no requests "
                         "from web pages")
        return None

    def _ours(self, host: str) -> bool:
        if host in self.hosts:
            return True
        if self._any_ip_port is None:
            return False
        if host.endswith(f":{self._any_ip_port}"):
            host = host.rsplit(":", 1)[0]
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        return True  # an address literal cannot be rebound to another site's name

    def _own_origin(self, origin: str, host: str) -> bool:
        """A browser's same-origin request: ``http://`` and the server's own (checked) Host."""
        if not origin.startswith("http://"):
            return False
        return origin[len("http://"):] == host and (self.hosts is None or self._ours(host))


def _content_type_refusal(path: str, content_type: str) -> tuple[int, str] | None:
    media = content_type.split(";", 1)[0].strip().lower()
    if path in _INVOKE_PATHS:
        allowed, wanted = media in ("", "application/octet-stream"), "application/octet-stream"
    elif _LAMBDA_INVOKE.fullmatch(path):
        allowed, wanted = media not in BROWSER_SIMPLE_TYPES, "application/octet-stream, or none as boto3 sends"
    elif path == "/cancel":  # signed with the secret, as /invoke
        allowed, wanted = media in ("", "application/json"), "application/json"
    elif _AWS_API.match(path):
        allowed, wanted = media in JSON_TYPES, "application/json"
    else:
        allowed, wanted = media not in BROWSER_SIMPLE_TYPES, "a type a web page cannot send"
    if allowed:
        return None
    return 415, (f"Content-Type {content_type or '(none)'!r} refused on {path}: send {wanted} "
                 "(a web page can post text/plain or a form to any address without asking)")
