"""Serve the dashboard on loopback with the emulator's own HTTP server.

:class:`fnmap.emulator.httpserver.WSGIServer` rather than werkzeug's development server: it is
the one HTTP stack fnmap already runs and tests (a maintained parser under it, a thread per
keep-alive connection, connections bounded in number and time, so a stuck browser tab or a
thousand idle sockets lock nobody out), and werkzeug's says itself it is not for lasting use.  It
answers with a length, never a stream, so the pages poll rather than listen to server-sent events.
"""

from __future__ import annotations

import threading

from ..emulator.httpserver import WSGIServer
from ..runtime.frontdoor import LOOPBACK_NAMES, allowed_name
from . import DEFAULT_PORT
from .app import create_app
from .pages import JobPages

#: Connections held at once: a few browser tabs (six each) and a scraper.
MAX_CONNECTIONS = 64


class Dashboard:
    """The dashboard over ``store`` bound to ``host:port`` (0: a free port) until :meth:`close`.

    ``allow_hosts``: names besides its own that browsers may reach it by (a port forward's name).
    Job pages are made in a process it spawns (:mod:`.pages`): as with any spawning
    ``multiprocessing`` user, a script that makes one guards its entry point with
    ``if __name__ == "__main__":`` (``fnmap dashboard`` and notebooks need nothing).
    """

    def __init__(self, store, token: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 allow_hosts: tuple[str, ...] = ()):
        allow_hosts = tuple(allowed_name(name) for name in allow_hosts)
        self.pages = JobPages(store, isolated=True)
        self.app = create_app(store, token, self.pages)
        self.server = WSGIServer(self.app, host=host, port=port, max_connections=MAX_CONNECTIONS)
        self.app.extensions["fnmap_front_door"].serve_at(str(self.server.host), self.server.port, allow_hosts)
        self._token = token
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The address to open, without the token."""
        host = str(self.server.host)
        host = f"[{host}]" if ":" in host else host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.server.port}/"

    @property
    def url_with_token(self) -> str:
        return f"{self.url}?token={self._token}"

    @property
    def loopback(self) -> bool:
        return str(self.server.host) in LOOPBACK_NAMES or str(self.server.host) == "::1"

    def start(self) -> Dashboard:
        """Serve from a daemon thread (tests, notebooks); :meth:`serve_forever` serves from this one."""
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fnmap-dashboard")
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def close(self) -> None:
        self.server.close()
        self.pages.close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
