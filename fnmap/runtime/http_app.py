"""The WSGI app every HTTP entry point serves: ``handlers/http.py`` and the emulator.

``create_app(execute)`` takes the function that runs one invocation: the
worker routine in-process for a real function host, or the emulator's pool of
worker processes.  ``execute(body, signature, session)`` returns ``(status, body,
headers)``; ``session`` is the request's :data:`SESSION_HEADER` (or None).
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response, request

from .batch_frames import MANY_PATH
from .frontdoor import FrontDoor
from .httpwire import reason_phrase
from .signing import SIGNATURE_HEADER
from .wire import SESSION_HEADER

Execute = Callable[[bytes, "str | None", "str | None"], "tuple[int, bytes, dict]"]
ExecuteMany = Callable[[bytes, "str | None"], "tuple[int, bytes, dict]"]

_SESSION_ENVIRON = "HTTP_" + SESSION_HEADER.upper().replace("-", "_")

#: Requests larger than this are refused before they are read (arguments this big go through storage).
MAX_BODY_BYTES = 64 << 20


def create_app(execute: Execute, name: str = "fnmap", execute_many: ExecuteMany | None = None) -> Flask:
    """The app; ``app.extensions["fnmap_front_door"]`` is its :class:`~.frontdoor.FrontDoor` (the
    emulator tells it the addresses it serves).  No static route: nothing is served from files.
    ``execute_many`` (the emulator's) serves ``POST /invoke-many``: several invocations in one
    request (:mod:`.batch_frames`), each verified on its own."""
    app = Flask(name, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

    def invoke():
        return _response(*execute(request.get_data(cache=False), request.headers.get(SIGNATURE_HEADER),
                                  request.headers.get(SESSION_HEADER)))

    app.add_url_rule("/", "invoke_root", invoke, methods=["POST"])
    app.add_url_rule("/invoke", "invoke", invoke, methods=["POST"])
    if execute_many is not None:
        app.add_url_rule(MANY_PATH, "invoke_many", lambda: _response(*execute_many(request.get_data(cache=False),
                                                                request.headers.get(SESSION_HEADER))),
                         methods=["POST"])
    door = FrontDoor(_InvokeFastPath(app.wsgi_app, execute, execute_many))
    app.wsgi_app = app.extensions["fnmap_front_door"] = door
    return app


def _response(status: int, body: bytes, headers: dict) -> Response:
    mimetype = "application/octet-stream" if status == 200 else "text/plain"
    return Response(body, status=status, headers=headers, mimetype=mimetype)


class _InvokeFastPath:
    """WSGI middleware answering ``POST /`` and ``/invoke`` without Flask's request machinery.

    The invocation is the hot path: Flask's request context, routing and
    ``Response`` cost about 150 us of the emulator's CPU per call, as much as a
    noop call itself.  It answers exactly what the Flask views above
    answer; any other request, and a body of unknown length, go to Flask.
    """

    def __init__(self, wsgi_app, execute: Execute, execute_many: ExecuteMany | None = None):
        self.wsgi_app = wsgi_app
        self.execute = execute
        self.paths = ("/", "/invoke", MANY_PATH) if execute_many is not None else ("/", "/invoke")
        self.execute_many = execute_many

    def __call__(self, environ, start_response):
        length = environ.get("CONTENT_LENGTH")
        path = environ.get("PATH_INFO")
        if (environ.get("REQUEST_METHOD") != "POST" or path not in self.paths
                or not length or not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES):
            return self.wsgi_app(environ, start_response)
        body = environ["wsgi.input"].read(int(length))
        if path == MANY_PATH:
            status, out, headers = self.execute_many(body, environ.get(_SESSION_ENVIRON))
        else:
            status, out, headers = self.execute(body, environ.get(_SIGNATURE_ENVIRON), environ.get(_SESSION_ENVIRON))
        mimetype = "application/octet-stream" if status == 200 else "text/plain; charset=utf-8"
        start_response(f"{status} {reason_phrase(status)}", [
            ("Content-Type", mimetype), ("Content-Length", str(len(out))), *headers.items()])
        return [out]


_SIGNATURE_ENVIRON = "HTTP_" + SIGNATURE_HEADER.upper().replace("-", "_")


def in_process_execute(secret: bytes | None) -> Execute:
    """Run invocations in this process through the worker routine (real function hosts)."""
    from . import worker

    def execute(body: bytes, signature: str | None, session: str | None = None):
        status, out = worker.handle(body, signature, secret)
        return status, out, {}

    return execute
