"""The front door of every fnmap HTTP app: requests from other origins are refused before any route.

Loopback is not a security boundary: a web page in the user's browser can send
requests to ``127.0.0.1`` (a ``text/plain`` POST needs no CORS preflight), and
through DNS rebinding (its own host name resolving to ``127.0.0.1``) it can even
read the answers.  So before a route sees a request, :class:`FrontDoor` refuses:

* a ``Host`` that is not a name or address the server serves (403): DNS rebinding.
  Only the emulator knows its addresses (:meth:`FrontDoor.serve_at`); a deployed
  handler behind a cloud's front end checks no ``Host``.  The port is not checked:
  a rebinding page controls the name, not the port, and a client reaching the
  emulator through a port forward (``ssh -L 9000:localhost:8765``) names the
  forward's port (Jupyter's check also admits its local names on any port);
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

from ..errors import ConfigError
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
#: A host name or IPv4 address as ``--allow-host`` takes it.
_NAME = re.compile(r"[a-z0-9_]([a-z0-9._-]*[a-z0-9_])?")
#: The names a client on this machine reaches a loopback server by.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})


def host_name(host: str) -> str:
    """A host name or address as a ``Host`` header writes it without its port: lower case, an IPv6
    address in brackets."""
    host = host.strip("[]").lower()
    return f"[{host}]" if ":" in host else host


def split_host(value: str) -> tuple[str, str | None]:
    """``(name, port)`` of a ``Host`` header or ``--allow-host`` value (``port`` None when absent);
    ``name`` as :func:`host_name` writes it.  A bare IPv6 address (more than one colon, no brackets)
    has no port."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return value, None  # malformed: matches no name of ours
        return host_name(name), rest[1:] if rest else None
    if value.count(":") == 1:
        name, port = value.split(":")
        return name, port
    return host_name(value), None


def _valid_port(port: str | None) -> bool:
    return not port or (port.isdigit() and len(port) <= 5 and int(port) <= 65535)  # RFC 3986: may be empty


def allowed_name(value: str) -> str:
    """The name an ``--allow-host`` value admits (on any port): ``NAME``, ``NAME:PORT``, an IP
    address, ``[IPv6]`` or ``[IPv6]:PORT``; ConfigError naming the value when it is none of these."""
    name, port = split_host(value)
    if name.startswith("["):
        valid = name.endswith("]") and _is_ip(name[1:-1])
    else:
        valid = _NAME.fullmatch(name) is not None
    if not valid or not _valid_port(port):
        raise ConfigError(
            f"--allow-host {value!r} is not a host name, an address or NAME:PORT: give the name clients "
            "put in the URL they reach the emulator by, e.g. --allow-host fnmap.internal or "
            "--allow-host fnmap.internal:9000 (any port is admitted either way)")
    return name


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class FrontDoor:
    """WSGI middleware refusing foreign hosts, cross-site browser requests and unexpected bodies.

    ``hosts``: the names allowed in ``Host``, on any port (None: any, for an app behind a cloud's
    front end).  The emulator sets them once bound, with :meth:`serve_at`.
    """

    def __init__(self, app, hosts: set[str] | None = None):
        self.app = app
        self.hosts = None if hosts is None else frozenset(split_host(h)[0] for h in hosts)
        #: Bound to every address (0.0.0.0 or ::): any IP literal is one of ours.
        self._any_ip = False

    def serve_at(self, host: str, port: int, extra_names: tuple[str, ...] = ()) -> None:
        """Allow only the names of a server bound to ``host:port``: its loopback names, the bound
        address, ``extra_names`` (``--allow-host``, with or without a port) and, bound to every
        address, any IP address and this machine's names; each on any port (a port forward's
        included), or none: ``port`` is the bound one, which a ``Host`` need not name."""
        hosts = set(LOOPBACK_NAMES) | {host_name(host)} | {allowed_name(n) for n in extra_names}
        self._any_ip = host.strip("[]") in _WILDCARDS
        if self._any_ip:
            hosts |= {host_name(socket.gethostname()), host_name(socket.getfqdn())}
        self.hosts = frozenset(hosts - {""})

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
            return 403, (f"Host {host!r} is not among the names this server serves ({', '.join(sorted(self.hosts))}, "
                         "on any port): refused (a web page reaching it through DNS rebinding would send that); "
                         f"connect by one of those, or start the emulator with --allow-host {split_host(host)[0]}")
        if origin is not None and not self._own_origin(origin.lower(), host):
            return 403, (f"cross-origin request from {origin!r} refused: the fnmap emulator takes no "
                         "requests from web pages")
        if fetch_site is not None and fetch_site.lower() not in SAME_SITE_FETCHES:
            return 403, (f"Sec-Fetch-Site {fetch_site!r} refused: the fnmap emulator takes no requests "
                         "from web pages")
        return None

    def _ours(self, host: str) -> bool:
        name, port = split_host(host)
        if not _valid_port(port):
            return False
        if name in self.hosts:
            return True
        # Bound to every address: an address literal cannot be rebound to another site's name.
        return self._any_ip and _is_ip(name.strip("[]"))

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
