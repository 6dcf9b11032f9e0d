"""The dashboard's Flask app: two pages, their scripts, their JSON, ``/metrics``; nothing that writes.

Every route answers only ``GET`` (and ``HEAD``); every answer, a 404 included, needs the token
(:mod:`.auth`); the emulator's :class:`~fnmap.runtime.frontdoor.FrontDoor` stands in front of all
of it (a foreign ``Host``, a cross-site ``Origin`` or ``Sec-Fetch-Site``, a form or ``text/plain``
body are refused before the token is even looked at).  The pages are fixed files with no data in
them; their scripts fetch JSON and put stored strings into the page with ``textContent`` only, and
the Content-Security-Policy allows scripts and styles from this server alone, so a function named
``<script>`` or a traceback full of markup stays text even if a script slipped.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent.futures import Future
from importlib import resources

from flask import Flask, Response, redirect, request

from ..attach import FINAL
from ..errors import FnmapError
from ..observe import records
from ..observe.history import JobNotFound
from ..observe.logs import read_logs
from ..runtime.frontdoor import FrontDoor
from . import auth, metrics, views
from .listing import JobList

#: The files the pages are made of, served from the package (no CDN: the page works offline).
ASSETS = {
    "dashboard.css": "text/css; charset=utf-8",
    "common.js": "text/javascript; charset=utf-8",
    "list.js": "text/javascript; charset=utf-8",
    "job.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PAGES = ("index.html", "job.html")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _files() -> dict[str, bytes]:
    folder = resources.files(__package__) / "static"
    return {name: (folder / name).read_bytes() for name in (*ASSETS, *PAGES)}


def create_app(store, token: str, job_list: JobList | None = None) -> Flask:
    """The dashboard over ``store``, answering only requests that carry ``token``.
    ``app.extensions["fnmap_front_door"]`` is its front door (the server tells it its addresses)."""
    app = Flask(__name__, static_folder=None)
    files = _files()
    jobs = job_list or JobList(store)
    pages = _JobPages(store)
    _guard(app, token)

    @app.get("/")
    def index():
        return _file(files, "index.html", "text/html; charset=utf-8")

    @app.get("/jobs/<job_id>")
    def job(job_id: str):
        pages.prefetch(job_id)
        return _file(files, "job.html", "text/html; charset=utf-8")

    @app.get("/static/<name>")
    def asset(name: str):
        if name not in ASSETS:
            return _json({"error": f"no file {name!r}"}, 404)
        return _file(files, name, ASSETS[name])

    @app.get("/api/jobs")
    def api_jobs():
        return _json({"storage": store.url, "jobs": jobs.rows()})

    @app.get("/api/jobs/<job_id>")
    def api_job(job_id: str):
        return Response(pages.page(job_id), mimetype="application/json")

    @app.get("/api/jobs/<job_id>/calls/<int:call>")
    def api_call(job_id: str, call: int):
        record = records.load(store, job_id)
        return _json(views.call_output(record, read_logs(store, record["job_id"], call), call))

    @app.get("/metrics")
    def prometheus():
        return Response(metrics.exposition(jobs.summaries()), content_type=metrics.CONTENT_TYPE)

    @app.errorhandler(JobNotFound)
    def not_found(e):
        return _json({"error": str(e)}, 404)

    @app.errorhandler(FnmapError)
    def unreadable(e):
        return _json({"error": f"{type(e).__name__}: {e}"}, 502)

    door = FrontDoor(app.wsgi_app)
    app.wsgi_app = app.extensions["fnmap_front_door"] = door
    return app


def _guard(app: Flask, token: str) -> None:
    """Refuse every request without the token; trade a URL's ``?token=`` for a cookie."""

    @app.before_request
    def check_token():
        given, from_url = auth.presented(request.cookies, request.headers, request.args)
        if not auth.matches(given, token):
            return Response("this fnmap dashboard needs its token: open the URL `fnmap dashboard` printed "
                            "(it ends in ?token=...), or send the token of its token file as "
                            "'Authorization: Bearer TOKEN'\n", 401,
                            {"WWW-Authenticate": 'Bearer realm="fnmap dashboard"'}, mimetype="text/plain")
        if from_url and not request.path.startswith(("/api/", "/metrics", "/static/")):
            answer = redirect(request.path, 303)  # the token leaves the address bar and the history
            answer.set_cookie(auth.COOKIE, token, httponly=True, samesite="Strict", path="/")
            return answer
        return None

    @app.after_request
    def harden(response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        return response


def _file(files: dict[str, bytes], name: str, content_type: str) -> Response:
    return Response(files[name], content_type=content_type)


def _json(data, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status=status, mimetype="application/json")


class _JobPages:
    """Job pages as JSON.  Reading a 100,000-call record takes about a second, so: the page's JSON
    is started as soon as its HTML is asked for (:meth:`prefetch`), while the browser loads the
    scripts that will ask for it; a page asked for while it is being made waits for that one; an
    ended job's page is kept for :data:`.listing.RECHECK_SECONDS`, a few pages at most."""

    KEEP = 8

    def __init__(self, store, recheck: float | None = None):
        from .listing import RECHECK_SECONDS

        self.store = store
        self.recheck = RECHECK_SECONDS if recheck is None else recheck
        self._kept: dict[str, tuple[float, bytes]] = {}
        self._making: dict[str, Future] = {}
        self._lock = threading.Lock()

    def prefetch(self, job_id: str) -> None:
        """Start making ``job_id``'s page in the background (its errors are the API's to report)."""
        threading.Thread(target=self._quietly, args=(job_id,), daemon=True, name="fnmap-dashboard-prefetch").start()

    def _quietly(self, job_id: str) -> None:
        with contextlib.suppress(Exception):
            self.page(job_id)

    def page(self, job_id: str) -> bytes:
        with self._lock:
            kept = self._kept.get(job_id)
            if kept is not None and time.monotonic() - kept[0] < self.recheck:
                return kept[1]
            making = self._making.get(job_id)
            if making is None:
                making = self._making[job_id] = Future()
                mine = True
            else:
                mine = False
        if not mine:
            return making.result()
        try:
            body = self._make(job_id)
        except BaseException as e:
            making.set_exception(e)
            raise
        finally:
            with self._lock:
                self._making.pop(job_id, None)
        making.set_result(body)
        return body

    def _make(self, job_id: str) -> bytes:
        record = records.load(self.store, job_id)
        body = json.dumps(views.job_page(record), separators=(",", ":")).encode()
        if record["summary"]["status"] in FINAL:
            with self._lock:
                self._kept[job_id] = self._kept[record["job_id"]] = (time.monotonic(), body)
                while len(self._kept) > self.KEEP:
                    self._kept.pop(next(iter(self._kept)))
        return body
