"""WSGI entry for any HTTP function host: ``handlers.http:app``.

The same app the emulator serves (``fnmap.runtime.http_app``), running each call in
this process through the worker routine.  The deployment's secret comes from
``FNMAP_SECRET``; without it every request is answered 500 with that fix.

    waitress-serve --listen=127.0.0.1:8080 handlers.http:app
"""

from __future__ import annotations

from fnmap.runtime.http_app import create_app, in_process_execute
from fnmap.runtime.signing import secret_from_env

app = create_app(in_process_execute(secret_from_env()), name="fnmap-handler")
#: The name some WSGI hosts look for.
application = app
