"""Serve the WSGI handler on ``$PORT``: Cloud Run, Knative, Function Compute and SCF web functions.

    PORT=9000 python -m handlers.web

Containers must listen on every interface, so ``HOST`` defaults to
``0.0.0.0`` here (set ``HOST=127.0.0.1`` to keep it on this machine); every
request must still carry a signature made with ``FNMAP_SECRET``.  One thread
per container by default: platforms scale by containers, and a call's CPU work
would only contend with another's (``THREADS`` changes it).
"""

from __future__ import annotations

import os


def main() -> None:
    from waitress import serve

    from handlers.http import app

    port = int(os.environ.get("PORT", "8080"))
    host = os.environ.get("HOST", "0.0.0.0")
    threads = int(os.environ.get("THREADS", "1"))
    print(f"fnmap handler listening on http://{host}:{port}", flush=True)
    serve(app, host=host, port=port, threads=threads, channel_timeout=960)


if __name__ == "__main__":
    main()
