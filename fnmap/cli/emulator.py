"""``fnmap emulator``: serve the local emulator."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "emulator",
        help="serve the local emulator (plays the cloud on this machine)",
        description=(
            "Serve the fnmap emulator: an HTTP function host that runs each call in a pool of warm "
            "worker processes. Point clients at it with FNMAP_EMULATOR_URL and FNMAP_SECRET."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others are reachable from the network)")
    p.add_argument("--port", type=int, default=8765, help="port to bind; 0 picks a free one (default 8765)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: 2 x CPU cores, at least 4)")
    p.add_argument("--watch-stdin", action="store_true", help="stop when standard input closes (used when a client starts the emulator)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..emulator.server import serve

    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"fnmap emulator: --workers={args.workers} must be at least 1")
    serve(host=args.host, port=args.port, workers=args.workers, watch_stdin=args.watch_stdin)
    return 0
