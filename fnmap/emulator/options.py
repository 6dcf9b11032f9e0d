"""The options of ``fnmap emulator``: its argument parser, and the check of ``emulator_options``.

The emulator's own module (the command line registers it, :mod:`fnmap.config` checks the extra
options of an auto-started emulator with it), so that neither reaches into the other.  Only
argparse at import.
"""

from __future__ import annotations

import argparse

DESCRIPTION = (
    "Serve the fnmap emulator: an HTTP function host that runs each call in a pool of warm "
    "worker processes. Point clients at it with FNMAP_EMULATOR_URL and FNMAP_SECRET."
)
#: Options fnmap sets for an emulator it starts; ``emulator_options`` cannot.
OWNED = {"--host", "--port", "--workers", "--watch-stdin", "--idle-exit", "--state-file", "--start-lock-fd", "-h",
         "--help"}


def add_arguments(p: argparse.ArgumentParser, commands: bool = True) -> None:
    """Every option of ``fnmap emulator``, on ``p``; ``commands``: its ``status``/``stop`` too (not
    for the options of an emulator fnmap starts)."""
    _add_serving(p)
    _add_connections(p)
    if commands:
        p.add_argument("action", nargs="?", choices=("serve", "status", "stop"), default="serve",
                       help="serve (default); status: list the emulators shared by your processes (the ones "
                            "fnmap.map starts by itself), the processes and folders each serves, calls in "
                            "flight, memory and idle time left; stop: stop them (not one serving another "
                            "process's calls, unless --force)")
        p.add_argument("--force", action="store_true",
                       help="with stop: stop even an emulator serving other processes' calls (they start "
                            "or find another and send their unfinished calls again)")
    p.add_argument("--watch-stdin", action="store_true",
                   help="stop when standard input closes (used when a client starts the emulator)")
    p.add_argument("--idle-exit", type=float, default=None, metavar="S",
                   help="stop once no request came for S seconds (a shared emulator: FNMAP_EMULATOR_IDLE)")
    p.add_argument("--stop-on-hangup", action="store_true",
                   help="stop a call whose client closed its connection before the answer (a shared emulator; "
                        "Lambda, and this emulator by default, run it to its end)")
    p.add_argument("--state-file", metavar="PATH",
                   help="write the URL and pid to PATH once listening, remove it when stopping (a shared emulator)")
    # The start lock's descriptor, passed by the process that starts a shared emulator (.shared).
    p.add_argument("--start-lock-fd", type=int, default=None, help=argparse.SUPPRESS)
    _add_faults(p)


def _add_serving(p) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others are reachable from the network)")
    p.add_argument("--port", type=int, default=8765, help="port to bind; 0 picks a free one (default 8765)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: 2 x CPU cores, at least 4)")
    p.add_argument("--wsgi-server", choices=("fnmap", "waitress"), default="fnmap",
                   help="HTTP server: fnmap's own, a thread per keep-alive connection (default; about half "
                        "the CPU per call), or waitress")
    p.add_argument("--lambda-runtime", choices=("ric", "pool"), default=None,
                   help="how the Lambda API runs events: ric, AWS's runtime interface client (awslambdaric) over "
                        "the deployment package, in Lambda execution environments (default when installed); or "
                        "pool, the emulator's worker pool")
    p.add_argument("--aws", action="store_true",
                   help="also serve S3 on loopback (moto's server; pip install 'fnmap[aws-offline]') with a "
                        "bucket, and print the `export` lines that point fnmap's aws backend, boto3 and the "
                        "storage at this emulator: the whole AWS path offline (see --env-file)")
    p.add_argument("--env-file", metavar="PATH",
                   help="with --aws: also write the export lines to PATH, mode 0600 (then: source PATH); a folder "
                        "it makes for PATH is 0700 with a .gitignore of * (e.g. .fnmap/offline.env)")
    p.add_argument("--detach", action="store_true",
                   help="with --aws --env-file: run in the background and return once PATH is written, so a "
                        "script's next line can source it; stop it with kill $OFFLINE_EMULATOR_PID")
    # What --detach starts: its output is a log, so the export lines (the secrets) go to --env-file only.
    p.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)


def _add_connections(p) -> None:
    c = p.add_argument_group(
        "connections",
        "Bounds on what one connection may hold, so that silent or slow clients cannot lock others out.",
    )
    c.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name (NAME or NAME:PORT) clients may reach the emulator by, besides its "
                        "address, 127.0.0.1, localhost and [::1], each on any port (a port forward's too; "
                        "repeatable); requests naming any other Host are refused (DNS rebinding)")
    c.add_argument("--idle-timeout", type=float, default=10.0, metavar="S",
                   help="close a keep-alive connection silent for S seconds between requests (default 10)")
    c.add_argument("--head-timeout", type=float, default=10.0, metavar="S",
                   help="a request's line and headers must arrive within S seconds of its first byte (default 10); "
                        "its body then gets S seconds plus one per MiB")
    c.add_argument("--max-connections", type=int, default=2048, metavar="N",
                   help="connections held at once; past it, the one idle longest is closed (default 2048)")


def _add_faults(p) -> None:
    f = p.add_argument_group(
        "fault injection",
        "Make the emulator an unreliable platform on purpose; every choice is deterministic under --seed.",
    )
    f.add_argument("--fail-rate", type=float, default=0.0, metavar="P",
                   help="answer 500 without running the call, for this fraction of calls")
    f.add_argument("--kill-rate", type=float, default=0.0, metavar="P",
                   help="kill the worker process (SIGKILL) in the middle of this fraction of calls")
    f.add_argument("--drop-rate", type=float, default=0.0, metavar="P",
                   help="accept this fraction of calls and never answer them (lost calls)")
    f.add_argument("--cold-start-ms", type=float, default=0.0, metavar="MS",
                   help="extra delay of the first call on each new worker process")
    f.add_argument("--latency-ms", type=float, default=0.0, metavar="MS", help="extra delay of every call")
    f.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="answer 429 to calls beyond N running at once (as Lambda throttles)")
    f.add_argument("--scaling-rate", type=int, default=None, metavar="N",
                   help="Lambda API: start at most N new execution environments per function per 10 s, as "
                        "Lambda scales (its own rate is 1000); calls beyond answer 429 or, as events, wait")
    f.add_argument("--straggler-rate", type=float, default=0.0, metavar="P",
                   help="run this fraction of calls --straggler-factor times slower")
    f.add_argument("--straggler-factor", type=float, default=10.0, metavar="F",
                   help="how many times slower a straggler runs (default 10)")
    f.add_argument("--seed", type=int, default=0, help="seed of every fault choice (default 0)")


def time_limits(args):
    """The connection bounds the options ask for; ValueError naming the option that is wrong."""
    from ..runtime.deadlines import TimeLimits

    for option, value in (("--idle-timeout", args.idle_timeout), ("--head-timeout", args.head_timeout)):
        if not value > 0:
            raise ValueError(f"{option}={value} must be a positive number of seconds")
    if args.max_connections < 1:
        raise ValueError(f"--max-connections={args.max_connections} must be at least 1")
    return TimeLimits(idle=args.idle_timeout, head=args.head_timeout)


def fault_plan(args):
    from .faults import FaultPlan

    return FaultPlan(
        fail_rate=args.fail_rate, kill_rate=args.kill_rate, drop_rate=args.drop_rate,
        cold_start_ms=args.cold_start_ms, latency_ms=args.latency_ms,
        max_concurrency=args.max_concurrency, straggler_rate=args.straggler_rate,
        straggler_factor=args.straggler_factor, seed=args.seed,
    )


class _Refused(ValueError):
    pass


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def check_options(options: str) -> None:
    """Raise ValueError naming what is wrong with extra options for an auto-started emulator."""
    import shlex

    parser = _CheckingParser(prog="fnmap emulator", add_help=False)
    add_arguments(parser, commands=False)
    try:
        words = shlex.split(options)
    except ValueError as e:
        raise ValueError(f"cannot split it into options ({e})") from None
    clash = sorted(w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in OWNED)
    if clash:
        raise ValueError(
            f"{', '.join(clash)} cannot be set here: fnmap sets them for the emulator it starts "
            "(use workers=... for the worker count)"
        )
    try:
        args = parser.parse_args(words)
    except _Refused as e:
        raise ValueError(f"{e}; see `fnmap emulator --help` for the fault-injection options") from None
    fault_plan(args)
    time_limits(args)
