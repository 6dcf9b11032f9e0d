"""``fnmap dashboard``: a local, token-protected, read-only web page over every job in storage."""

from __future__ import annotations

import signal
import sys

from .jobs import _STORAGE_HELP, _storage_errors, _store

DESCRIPTION = (
    "Serve a read-only web page over every job in the storage (any process's or machine's, running "
    "or finished): a live list of jobs, and per job its progress, timeline of attempts, failed items "
    "with their tracebacks, captured output, options, cost and the commands that act on it; plus "
    "Prometheus metrics at /metrics. It listens on loopback and prints the URL to open, token "
    "included; every request needs that token (kept in a file only you can read; Prometheus can "
    "send it from there as a bearer token)."
)


def register(sub) -> None:
    from ..dashboard import DEFAULT_PORT

    p = sub.add_parser("dashboard", help="serve a local web page (and Prometheus /metrics) over every job in storage",
                       description=DESCRIPTION)
    p.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 for any free port)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another name browsers reach the page by (e.g. a port forward's); others are refused")
    p.add_argument("--token-file", metavar="PATH",
                   help="file holding the token, made (mode 0600) if absent "
                   "(default: dashboard.token in $XDG_RUNTIME_DIR/fnmap)")
    p.add_argument("--open", action="store_true", help="also open the page in a web browser")
    p.set_defaults(run=_storage_errors(run))


def run(args) -> int:
    from ..dashboard import auth
    from ..dashboard.server import Dashboard

    if not 0 <= args.port <= 65535:
        raise SystemExit(f"fnmap dashboard: --port={args.port} is not a port (0 for any free one)")
    store = _store(args)
    path = args.token_file or auth.default_token_path()
    token = auth.load_or_create_token(path)
    try:
        dashboard = Dashboard(store, token, host=args.host, port=args.port, allow_hosts=tuple(args.allow_host))
    except OSError as e:
        raise SystemExit(f"fnmap dashboard: cannot listen on {args.host}:{args.port} ({e.strerror}): another "
                         "dashboard may be there; choose another --port, or --port 0 for any free one") from None
    if not dashboard.loopback:
        print(f"fnmap dashboard: listening on {args.host}, beyond this machine: anyone who can reach it and "
              "has the token can read every job's output and tracebacks", file=sys.stderr)
    print(f"fnmap dashboard over {store.url} (token in {path}); open:", file=sys.stderr)
    print(dashboard.url_with_token, flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(dashboard.url_with_token)
    signal.signal(signal.SIGTERM, lambda *_: dashboard.close())
    try:
        dashboard.serve_forever()
    finally:
        dashboard.close()
    return 0
