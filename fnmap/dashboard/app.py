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

import json
from importlib import resources

from flask import Flask, Response, redirect, request

from ..errors import FnmapError
from ..observe import history
from ..observe.history import JobNotFound
from ..runtime.frontdoor import FrontDoor
from . import auth, metrics
from .listing import JobList
from .pages import JobPages

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


def create_app(store, token: str, pages: JobPages | None = None) -> Flask:
    """The dashboard over ``store``, answering only requests that carry ``token``.
    ``app.extensions["fnmap_front_door"]`` is its front door (the server tells it its addresses);
    ``pages`` makes the job pages (by default in this process; :class:`.server.Dashboard` gives one
    that makes them in a process of their own)."""
    app = Flask(__name__, static_folder=None)
    files = _files()
    jobs = JobList(store)
    pages = pages or JobPages(store)
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

    @app.get("/api/jobs/<job_id>/summary")
    def api_summary(job_id: str):
        return _json({"summary": _summary(store, job_id)})

    @app.get("/api/jobs/<job_id>/calls/<int:call>")
    def api_call(job_id: str, call: int):
        return Response(pages.call(job_id, call), mimetype="application/json")

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


def _summary(store, job_id: str) -> dict:
    """A job's summary from its index entry (one small GET): what its page shows while the record
    of a big job is read."""
    full = history.resolve_id(store, job_id)
    entry = history.started_entry(store, full)
    if entry is None:
        raise JobNotFound(f"job {full} has no index entry in {store.url}")
    return history.judge_entry(store, entry)


def _file(files: dict[str, bytes], name: str, content_type: str) -> Response:
    return Response(files[name], content_type=content_type)


def _json(data, status: int = 200) -> Response:
    return Response(json.dumps(data, separators=(",", ":")), status=status, mimetype="application/json")
