"""Google functions-framework entry (Cloud Functions, or any host running the framework).

    functions-framework --source=handlers/gcf.py --target=invoke

The framework hands ``invoke`` a Flask request; it is answered by the shared
WSGI app (``fnmap.runtime.http_app``), so the routes, the signature check and the
answers are exactly those of every other HTTP host.  The secret comes from
``FNMAP_SECRET``.  Imports only ``fnmap``: the framework loads this file by
path, and on Cloud Functions it is deployed as ``main.py``.
"""

from __future__ import annotations

from fnmap.runtime.http_app import create_app, in_process_execute
from fnmap.runtime.signing import secret_from_env

app = create_app(in_process_execute(secret_from_env()), name="fnmap-gcf")


def invoke(request):
    """Serve one request of the framework with the shared app."""
    with app.request_context(request.environ):
        return app.full_dispatch_request()
