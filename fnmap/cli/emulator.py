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
    f = p.add_argument_group(
        "fault injection",
        "Make the emulator an unreliable platform on purpose; every choice is deterministic under --seed.",
    )
    f.add_argument("--fail-rate", type=float, default=0.0, metavar="P", help="answer 500 without running the call, for this fraction of calls")
    f.add_argument("--kill-rate", type=float, default=0.0, metavar="P", help="kill the worker process (SIGKILL) in the middle of this fraction of calls")
    f.add_argument("--drop-rate", type=float, default=0.0, metavar="P", help="accept this fraction of calls and never answer them (lost calls)")
    f.add_argument("--cold-start-ms", type=float, default=0.0, metavar="MS", help="extra delay of the first call on each new worker process")
    f.add_argument("--latency-ms", type=float, default=0.0, metavar="MS", help="extra delay of every call")
    f.add_argument("--max-concurrency", type=int, default=None, metavar="N", help="answer 429 to calls beyond N running at once (as Lambda throttles)")
    f.add_argument("--straggler-rate", type=float, default=0.0, metavar="P", help="run this fraction of calls --straggler-factor times slower")
    f.add_argument("--straggler-factor", type=float, default=10.0, metavar="F", help="how many times slower a straggler runs (default 10)")
    f.add_argument("--seed", type=int, default=0, help="seed of every fault choice (default 0)")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..emulator.faults import FaultPlan
    from ..emulator.server import serve

    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"fnmap emulator: --workers={args.workers} must be at least 1")
    try:
        faults = FaultPlan(
            fail_rate=args.fail_rate, kill_rate=args.kill_rate, drop_rate=args.drop_rate,
            cold_start_ms=args.cold_start_ms, latency_ms=args.latency_ms,
            max_concurrency=args.max_concurrency, straggler_rate=args.straggler_rate,
            straggler_factor=args.straggler_factor, seed=args.seed,
        )
    except ValueError as e:
        raise SystemExit(f"fnmap emulator: {e}") from None
    serve(host=args.host, port=args.port, workers=args.workers, watch_stdin=args.watch_stdin,
          faults=faults)
    return 0
