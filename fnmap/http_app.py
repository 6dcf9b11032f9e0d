"""The WSGI app every HTTP entry point serves: ``handlers/http.py`` and the emulator.

``create_app(execute)`` takes the function that runs one invocation: the
worker routine in-process for a real function host, or the emulator's pool of
worker processes.  ``execute(body, signature)`` returns ``(status, body,
headers)``.
"""

from __future__ import annotations

from typing import Callable

from flask import Flask, Response, request

from .signing import SIGNATURE_HEADER

Execute = Callable[[bytes, "str | None"], "tuple[int, bytes, dict]"]

#: Requests larger than this are refused before they are read (arguments this big go through storage).
MAX_BODY_BYTES = 64 << 20


def create_app(execute: Execute, name: str = "fnmap") -> Flask:
    app = Flask(name)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

    def invoke():
        status, body, headers = execute(request.get_data(cache=False), request.headers.get(SIGNATURE_HEADER))
        mimetype = "application/octet-stream" if status == 200 else "text/plain"
        return Response(body, status=status, headers=headers, mimetype=mimetype)

    app.add_url_rule("/", "invoke_root", invoke, methods=["POST"])
    app.add_url_rule("/invoke", "invoke", invoke, methods=["POST"])
    return app


def in_process_execute(secret: bytes | None) -> Execute:
    """Run invocations in this process through the worker routine (real function hosts)."""
    from . import worker

    def execute(body: bytes, signature: str | None):
        status, out = worker.handle(body, signature, secret)
        return status, out, {}

    return execute
