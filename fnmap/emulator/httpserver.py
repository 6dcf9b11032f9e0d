"""The emulator's HTTP server: a thread per keep-alive connection, running a WSGI app.

waitress cost about 60 % of the emulator's CPU per noop call (py-spy): its
asyncore loop, task queue, parser and the hand-offs between its threads.
fnmap's clients hold a few long keep-alive connections (one per
dispatch thread; boto3 pools ten), so a thread per connection that reads a
request, calls the app and writes the answer is all the emulator needs.  It
speaks HTTP/1.1 with keep-alive, ``Content-Length`` and chunked request bodies,
``Expect: 100-continue`` and HEAD; an answer without a length is gathered and
sent with one.  Requests are parsed by :mod:`fnmap.runtime.httpwire` (httptools, or h11):
a malformed one is answered 400 (413, 431, 501, 505) and its connection closed.
It binds where it is told (the CLI warns when that is not loopback).

Connections are bounded: a connection silent between requests is closed after
``TimeLimits.idle`` seconds, a request's head must arrive within ``TimeLimits.head`` seconds of its
first byte and its body at a minimum rate, and at ``max_connections`` the connection waiting longest
without a request is given up for the new one: a thousand silent or byte-a-second connections do
not lock other clients out.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
import threading
import time
import traceback
from io import BytesIO

from ..runtime import httpwire
from ..runtime.deadlines import TimedConnection, TimeLimits
from ..runtime.httpwire import BadRequest, reason_phrase
from .hangup import HangupWatch

#: Connections served at once; when a new one would pass it, the idle connection waiting longest is
#: given up (a client's keep-alive connection: fnmap's client sends again on a new one); when
#: every connection is answering a request, the new one is answered 503 and closed.  Above 64
#: clients of 16 connections each (a thread each; :func:`raise_file_limit` makes room for them).
MAX_CONNECTIONS = 2048
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
#: File descriptors kept for what is not a connection (worker pipes, files, the listener).
_RESERVED_FILES = 256


def raise_file_limit(connections: int) -> int:
    """Raise this process's soft limit of open files towards ``connections`` plus a reserve (up to
    the hard limit); return how many connections it leaves room for."""
    try:
        import resource
    except ImportError:  # not POSIX
        return connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + _RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return connections if soft == resource.RLIM_INFINITY else max(1, min(connections, soft - _RESERVED_FILES))


class WSGIServer:
    """Serve ``app`` on ``host:port`` (0: any free port) until :meth:`close`.  ``parser`` is
    ``httptools`` or ``h11`` (default: :data:`fnmap.runtime.httpwire.PARSER`).

    ``limits`` (:class:`~fnmap.runtime.deadlines.TimeLimits`) bounds how long a connection may stay
    silent between requests and how long a request's head and body may take to arrive, so that
    silent or byte-a-second connections (a thread each) cannot lock other clients out;
    ``max_connections`` bounds how many are held at once.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, limits: TimeLimits | None = None,
                 max_body: int = 64 << 20, parser: str | None = None, max_connections: int = MAX_CONNECTIONS):
        self.app = app
        self.parser = httpwire.check_parser(parser or httpwire.PARSER)
        self.limits = limits or TimeLimits()
        self.max_body = max_body
        if max_connections < 1:
            raise ValueError(f"max_connections={max_connections} must be at least 1")
        self.max_connections = max_connections
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=1024)
        self.host, self.port = self.listener.getsockname()[:2]
        #: Open connections, each with where its request stands.
        self._connections: dict[socket.socket, TimedConnection] = {}
        self._lock = threading.Lock()
        self._closed = False
        #: Connections given up to make room for new ones (idle first).
        self.evicted = 0
        #: Clients that hang up mid-request, for the app's :func:`.hangup.on_hangup`.
        self.hangups = HangupWatch()

    def serve_forever(self) -> None:
        while not self._closed:
            try:
                sock, peer = self.listener.accept()
            except OSError as e:
                if self._closed or e.errno not in _OUT_OF_FILES:
                    return  # closed
                self._out_of_files()
                continue
            conn = TimedConnection(sock, self.limits, self.max_body)
            with self._lock:
                victim = self._make_room()
                admitted = len(self._connections) < self.max_connections
                if admitted:
                    self._connections[sock] = conn
            if victim is not None:
                with contextlib.suppress(OSError):
                    victim.sock.shutdown(socket.SHUT_RDWR)  # its thread wakes from recv and ends
            if not admitted:
                with contextlib.suppress(OSError):
                    sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
                sock.close()
                continue
            threading.Thread(target=self._serve_connection, args=(conn, peer), daemon=True,
                             name="fnmap-emulator-connection").start()

    def _out_of_files(self) -> None:
        """accept() failed for want of file descriptors: give up the connection idle longest."""
        with self._lock:
            self.max_connections = max(1, len(self._connections))  # what fits, from now on
            victim = self._make_room()
        if victim is not None:
            with contextlib.suppress(OSError):
                victim.sock.shutdown(socket.SHUT_RDWR)
        time.sleep(0.01)  # its thread closes it; the client waiting in the backlog is accepted next

    def _make_room(self) -> TimedConnection | None:
        """At the limit, take the connection that waited longest without a request in hand off the
        table (idle ones first, then those still sending a head, then a body) and return it."""
        if len(self._connections) < self.max_connections:
            return None
        waiting = [c for c in self._connections.values() if c.phase != c.BUSY]
        if not waiting:
            return None
        victim = min(waiting, key=lambda c: (c.phase, c.since))
        victim.given_up = True
        del self._connections[victim.sock]
        self.evicted += 1
        return victim

    def close(self) -> None:
        """Stop accepting and hang up every open connection (their threads then end)."""
        self._closed = True
        self.hangups.close()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- one connection ----------------------------------------------------------

    def _serve_connection(self, conn: TimedConnection, peer) -> None:
        sock = conn.sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            reader = httpwire.request_reader(conn, self.max_body, self.parser)
            while not self._closed:
                conn.waiting()
                try:
                    request = reader.read()
                except BadRequest as e:
                    self._send_simple(sock, e.status, str(e))
                    return
                if request is None:
                    return
                with self._lock:  # either it is given up before it answers, or it answers
                    if conn.given_up:
                        return  # not served: the client sends it again on a new connection
                    conn.answering()
                if not self._serve_request(conn, request, peer):
                    return
        except (OSError, ValueError):
            return  # the client hung up, was too slow (TimeoutError), or the server is closing
        finally:
            with self._lock:
                if self._connections.get(sock) is conn:
                    del self._connections[sock]
            with contextlib.suppress(OSError):
                sock.close()

    def _serve_request(self, conn: TimedConnection, request: httpwire.Request, peer) -> bool:
        method, target, version, body = request.method, request.target, request.version, request.body
        path, _, query = target.partition("?")
        if path.startswith(("http://", "https://")):  # absolute form
            path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
        environ = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": _unquote(path),
            "QUERY_STRING": query, "SERVER_NAME": str(self.host), "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": version, "REMOTE_ADDR": str(peer[0]) if peer else "",
            "CONTENT_LENGTH": str(len(body)), "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
            "wsgi.input": BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": False, "wsgi.run_once": False, "RAW_URI": target,
        }
        for name, value in request.headers.items():
            if "_" in name:
                continue  # X_Fnmap_Signature would pass for X-Fnmap-Signature in WSGI's names
            key = name.upper().replace("-", "_")
            if key == "CONTENT_TYPE":
                environ[key] = value
            elif key not in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
                environ["HTTP_" + key] = value
        return self._respond(conn, environ, method, version, request.keep_alive)

    def _respond(self, conn: TimedConnection, environ: dict, method: str, version: str,
                 keep_alive: bool) -> bool:
        sock = conn.sock
        state: dict = {}

        def start_response(status, response_headers, exc_info=None):
            if exc_info and state.get("sent"):
                raise exc_info[1].with_traceback(exc_info[2])
            state["status"], state["headers"] = status, list(response_headers)
            return state.setdefault("early", []).append  # the legacy write() callable

        self.hangups.serving(sock)
        try:
            result = self.app(environ, start_response)
            try:
                chunks = list(state.pop("early", [])) + [c for c in result if c]
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception:
            traceback.print_exc()
            self._send_simple(sock, 500, "internal error in the fnmap emulator")
            return False
        finally:
            self.hangups.serving(None)
        if "status" not in state:
            self._send_simple(sock, 500, "the app did not start a response")
            return False
        names = {name.lower() for name, _ in state["headers"]}
        body = b"".join(chunks)
        head = [f"HTTP/1.1 {state['status']}"]
        head.extend(f"{name}: {value}" for name, value in state["headers"])
        if "content-length" not in names:
            head.append(f"Content-Length: {len(body)}")
        if not keep_alive:
            head.append("Connection: close")
        elif version == "HTTP/1.0":
            head.append("Connection: keep-alive")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        state["sent"] = True
        conn.allow_writing(len(data) + len(body))  # a client that never reads is given up
        if method == "HEAD":
            sock.sendall(data)
        elif len(body) <= 65536:
            sock.sendall(data + body)
        else:
            sock.sendall(data)
            sock.sendall(body)
        return keep_alive

    def _send_simple(self, sock: socket.socket, status: int, text: str) -> None:
        body = text.encode()
        with contextlib.suppress(OSError):
            sock.settimeout(self.limits.head)
            sock.sendall(f"HTTP/1.1 {status} {reason_phrase(status)}\r\nContent-Type: text/plain; "
                         f"charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode("latin-1") + body)


def _unquote(path: str) -> str:
    """PATH_INFO is the decoded path, as bytes in latin-1 (PEP 3333)."""
    if "%" not in path:
        return path
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(path).decode("latin-1")
