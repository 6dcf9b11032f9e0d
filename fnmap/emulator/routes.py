"""Route tables: each emulator API lists its routes as ``(methods, path, handler)``.

A handler takes the API's shared state first (``handler(api, **path_parameters)``); the table is
what a newcomer reads to see what an API serves, and :func:`add_routes` puts it on the Flask app.
"""

from __future__ import annotations

import functools


def add_routes(app, routes, state) -> None:
    """Add each ``(methods, path, handler)`` of ``routes`` to ``app``, ``handler`` called with
    ``state`` first.  ``methods`` is ``"GET"`` or ``"PUT,DELETE"``; the endpoint is the handler's name."""
    for methods, path, handler in routes:
        view = functools.partial(handler, state)
        app.add_url_rule(path, endpoint=handler.__name__, view_func=functools.update_wrapper(view, handler),
                         methods=methods.split(","))
