"""A minimal HTTP/1.1 keep-alive client for plain ``http://`` POSTs on the per-call path.

``http.client`` parses every response's headers with the ``email`` package's
feed parser and builds the request header by header; on a noop job that was
about half of the client's CPU per call.  This client sends one
request buffer and has the answer parsed by :mod:`fnmap.runtime.httpwire` (httptools, or
h11 where httptools is missing).  It speaks only what fnmap needs: POST with a
body, a response per request, no 1xx other than ``100 Continue``, no trailers.
"""

from __future__ import annotations

import select
import socket

from ..runtime import httpwire
from ..runtime.httpwire import Headers, ProtocolError, Response

__all__ = ["Connection", "Headers", "ProtocolError", "Response", "StaleConnection"]


class StaleConnection(ProtocolError):
    """A reused keep-alive connection failed before any byte of the answer came: the server had
    closed it while idle (it closes connections idle for a few seconds), so the request was not
    served and may be sent again on a new connection."""

#: Bodies larger than this are sent with a second ``sendall`` instead of being copied onto the head.
_JOIN_LIMIT = 64 * 1024


#: A call with no ``timeout`` may run for hours, so no read timeout applies to it; TCP keep-alive
#: probes instead find a host that vanished without closing the connection (about 2 minutes).
_KEEPALIVE = (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6))


def _keep_alive_probes(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        option = getattr(socket, name, None)  # Linux names; macOS has only some of them
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class Connection:
    """One keep-alive connection to ``host:port`` (not thread-safe: one per thread).  ``parser``
    is ``httptools`` or ``h11`` (default: :data:`fnmap.runtime.httpwire.PARSER`)."""

    __slots__ = ("host", "port", "sock", "answered", "_wire", "_host_header", "_timeout", "_poll")

    def __init__(self, host: str, port: int, connect_timeout: float, parser: str | None = None):
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), connect_timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _keep_alive_probes(self.sock)
        self._wire = httpwire.response_reader(self.sock, parser)
        #: Answers read on this connection so far (more than none: a reused keep-alive connection).
        self.answered = 0
        self._host_header = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self._timeout: object = ...  # settimeout is a system call: made only when it changes
        self._poll = None

    def post(self, path: str, body: bytes, headers: dict[str, str], timeout: float | None) -> Response:
        """Send one POST and read its whole answer.  Raises ``TimeoutError`` when no answer
        comes within ``timeout`` seconds, ``OSError`` (``ProtocolError``) on a broken connection,
        :class:`StaleConnection` when a reused connection broke before any of the answer came."""
        head, data = self._wire.encode("POST", path, self._host_header, headers, body)
        if timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout
        try:
            if len(data) <= _JOIN_LIMIT:
                self.sock.sendall(head + data)
            else:
                self.sock.sendall(head)
                self.sock.sendall(data)
            while True:
                response = self._wire.read()
                if response.status != 100:
                    self.answered += 1
                    return response
        except TimeoutError:
            raise
        except OSError as e:
            if self.answered and not self._wire.answer_started():
                raise StaleConnection(f"the server closed this idle keep-alive connection ({e!r})") from e
            raise

    def readable(self) -> bool:
        """Whether the socket reads as ready now (on an idle keep-alive connection: the server
        closed it); a poll object kept per connection, not a ``select`` building lists each time."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock, select.POLLIN)
        return bool(self._poll.poll(0))

    def close(self) -> None:
        self.sock.close()
