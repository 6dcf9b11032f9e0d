"""Notice a client that hung up while its request was being served, and say so to whoever asked.

The emulator a user's processes share (:mod:`.shared`) outlives them: a client killed in the middle
of a job (SIGKILL, a crashed kernel) would leave its calls running in the shared workers, and the
next script would wait behind them.  An emulator a process starts for itself dies with it, and its
calls with it; with ``--stop-on-hangup`` the shared one does the same for the calls of a client
whose connection closed: the connection's serving thread registers a callback
(:func:`on_hangup`), and one watcher thread per server checks the registered sockets twice a
second.  (Lambda keeps running a synchronous invocation whose caller went away; an emulator
started with ``fnmap emulator`` keeps that behaviour.)
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable

#: Seconds between two looks at the watched connections.
INTERVAL = 0.5
_current = threading.local()


def _nothing() -> None:
    pass


def on_hangup(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` (once, from the watcher thread) if the client of the request this thread
    serves closes its connection before the answer; returns the function that ends the watch.
    Outside a server that watches (another WSGI server, a test), nothing is watched."""
    served = getattr(_current, "served", None)
    return served[0]._watch(served[1], callback) if served is not None else _nothing


class HangupWatch:
    """The watcher of one server: :meth:`serving` marks the thread serving a request on a socket."""

    def __init__(self):
        self._lock = threading.Condition()
        self._watched: dict[object, tuple[socket.socket, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def serving(self, sock: socket.socket | None) -> None:
        """This thread now serves a request on ``sock`` (None: no longer)."""
        _current.served = None if sock is None else (self, sock)  # per request: no closure made

    def _watch(self, sock: socket.socket, callback: Callable[[], None]) -> Callable[[], None]:
        token = object()
        with self._lock:
            if self._closed:
                return _nothing
            self._watched[token] = (sock, callback)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fnmap-emulator-hangups", daemon=True)
                self._thread.start()
            self._lock.notify()

        def unwatch() -> None:
            with self._lock:
                self._watched.pop(token, None)

        return unwatch

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watched.clear()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                gone = [token for token, (sock, _) in self._watched.items() if _hung_up(sock)]
                callbacks = [self._watched.pop(token)[1] for token in gone]
            for callback in callbacks:  # outside the lock: stopping a call kills a process
                callback()
            with self._lock:
                self._lock.wait(INTERVAL)


def _hung_up(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection.  Looked at under the watch's lock, so a
    socket is never read after its request ended (its thread unwatches it first)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""  # readable: end of stream, or the client sent more
    except (OSError, ValueError):
        return True
