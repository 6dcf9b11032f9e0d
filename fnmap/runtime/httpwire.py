"""HTTP/1.1 message parsing shared by the emulator's server and fnmap's client connection.

Parsing is left to a maintained parser, as uvicorn does: httptools (llhttp, the
parser of Node.js) where it can be imported, h11 (pure Python) where it cannot.
Both refuse what RFC 9112 forbids and hand-written parsers let through:
chunk sizes such as ``+10``, ``0x10``, ``1_0`` or ``-1``, whitespace before a
header's colon, a ``Transfer-Encoding`` other than ``chunked``, ``Content-Length``
together with ``Transfer-Encoding``.  fnmap adds what neither does alone:
limits on the size of a message's head and body, a refusal of obs-fold lines (h11
would unfold them), and the choice of parser (here).  The messages and limits are in
``http_messages``, the reading of requests (server side) in ``http_requests``, of
answers (client side) in ``http_responses``; the rest of fnmap imports this module.

``FNMAP_HTTP_PARSER`` (``httptools`` or ``h11``) picks the parser of a process,
so that the fallback can be tested; the server and client take ``parser=`` too.
It lives outside ``backends/`` because the worker side (the emulator's server,
``http_app``) must not import the client side.
"""

from __future__ import annotations

import os
import socket

from .http_messages import (
    MAX_HEAD,
    MAX_HEADERS,
    READ_SIZE,
    BadRequest,
    Headers,
    ProtocolError,
    Request,
    Response,
    format_request,
    reason_phrase,
)
from .http_requests import H11RequestReader, HttptoolsRequestReader
from .http_responses import H11ResponseReader, HttptoolsResponseReader

__all__ = ["BadRequest", "Headers", "MAX_HEAD", "MAX_HEADERS", "PARSER", "PARSERS", "ProtocolError", "READ_SIZE",
           "Request", "Response", "check_parser", "format_request", "reason_phrase", "request_reader",
           "response_reader"]

PARSERS = ("httptools", "h11")


def _default_parser() -> str:
    chosen = os.environ.get("FNMAP_HTTP_PARSER", "").strip().lower()
    if chosen:
        if chosen not in PARSERS:
            raise ValueError(f"FNMAP_HTTP_PARSER={chosen!r} is not a parser fnmap knows; "
                             f"set it to one of {', '.join(PARSERS)} or leave it unset")
        return chosen
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


#: The parser this process uses unless told otherwise.
PARSER = _default_parser()


def check_parser(parser: str) -> str:
    if parser not in PARSERS:
        raise ValueError(f"unknown HTTP parser {parser!r}: use one of {', '.join(PARSERS)}")
    return parser


def request_reader(sock, max_body: int, parser: str | None = None):
    """A reader of the requests that arrive on ``sock`` (a socket, or a
    :class:`~fnmap.runtime.deadlines.TimedConnection`, told when each head is complete):
    ``read()`` returns the next :class:`Request`, None once the client has closed, or raises
    :class:`BadRequest` (``TimeoutError`` past a ``TimedConnection``'s deadline)."""
    if check_parser(parser or PARSER) == "httptools":
        return HttptoolsRequestReader(sock, max_body)
    return H11RequestReader(sock, max_body)


def response_reader(sock: socket.socket, parser: str | None = None):
    """The client's side of a connection: ``encode(...)`` gives the bytes to send for a request
    (its head, then its body), ``read()`` the answer.  Raises :class:`ProtocolError`."""
    if check_parser(parser or PARSER) == "httptools":
        return HttptoolsResponseReader(sock)
    return H11ResponseReader(sock)
