"""``fnmap emulator``: serve the local emulator."""

from __future__ import annotations

import logging
import os
import sys


def register(sub) -> None:
    from ..emulator.options import DESCRIPTION, add_arguments

    p = sub.add_parser(
        "emulator", help="serve the local emulator (plays the cloud on this machine)", description=DESCRIPTION,
    )
    add_arguments(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..emulator.options import time_limits

    if args.action != "serve":
        return _shared_command(args)
    if not args.watch_stdin and sys.stderr.isatty():
        # Someone at a terminal: say when it stopped (an emulator a client started stays quiet).
        log = logging.getLogger("fnmap.emulator")
        log.addHandler(logging.StreamHandler())
        log.setLevel(logging.INFO)
    faults = _checked_faults(args)
    if args.detach:
        from ..emulator.offline_aws import detach

        return detach(sys.argv[sys.argv.index("emulator") + 1:], args.env_file)
    limits = _or_exit(time_limits, args)
    hide_working_folder()
    _serve(args, faults, limits)
    return 0


def _shared_command(args) -> int:
    """``fnmap emulator status|stop``: the emulators fnmap.map started, shared by your processes."""
    from ..emulator import shared

    if args.action == "stop":
        emulators, refused = shared.stop(force=args.force)
    else:
        emulators, refused = [shared.status(emu) for emu in shared.running()], []
    if not emulators and not refused:
        print(f"no shared fnmap emulator is running (folder {shared.state_path()})")
    verb = "stopped" if args.action == "stop" else "running"
    for emu in emulators:
        print(describe(emu, verb))
    for emu in refused:
        print(describe(emu, "not stopped"))
        for client in shared.busy_clients(emu):
            print(f"  process {client['pid']} has {client['in_flight']} calls in flight on it (job "
                  f"{', '.join(client['jobs'])}; folder {client['cwd']}): wait for its end, or stop it "
                  "anyway with `fnmap emulator stop --force` (that process starts another emulator and "
                  "sends its unfinished calls again)")
    return 1 if refused else 0


def describe(emu: dict, verb: str) -> str:
    """What ``fnmap emulator status`` says of one shared emulator (:func:`.shared.status`)."""
    from ..emulator.shared import LOG_FILE

    lines = [f"{verb}: pid {emu['pid']} at {emu['url']} with {emu['workers']} workers per client by default "
             f"(log {os.path.join(emu['folder'], LOG_FILE)})"]
    if "python" in emu:
        memory = f"{emu['memory'] / 2**20:.0f} MB" if emu.get("memory") is not None else "unknown"
        idle = (f"stops after {emu['idle_left']:.0f} s more without requests" if emu.get("idle_left") is not None
                else "no idle stop")
        lines.append(f"  python {emu['python']} ({emu['version']}); {emu['in_flight']} calls in flight; "
                     f"memory {memory} (its processes and workers); {idle}")
        sessions = emu.get("sessions") or []
        if not sessions:
            lines.append("  no client attached")
        for s in sessions:
            jobs = f" (job {', '.join(s['jobs'])})" if s["jobs"] else ""
            lines.append(f"  client pid {s['pid']} in {s['cwd']}: {len(s['workers'])} workers, {s['in_flight']} "
                         f"calls in flight{jobs}, {s['served']} served; {s['command']}")
    return "\n".join(lines)


def _or_exit(check, args):
    """``check(args)``, its ValueError as the command's one-line error."""
    try:
        return check(args)
    except ValueError as e:
        raise SystemExit(f"fnmap emulator: {e}") from None


def _checked_faults(args):
    """The fault plan, after the checks that come before ``--detach`` hands over."""
    from ..emulator.options import fault_plan

    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"fnmap emulator: --workers={args.workers} must be at least 1")
    faults = _or_exit(fault_plan, args)
    if args.scaling_rate is not None and args.scaling_rate < 1:
        raise SystemExit(f"fnmap emulator: --scaling-rate={args.scaling_rate} must be at least 1 "
                         "(new environments per 10 s); leave it out for no limit")
    if args.idle_exit is not None and not args.idle_exit > 0:
        raise SystemExit(f"fnmap emulator: --idle-exit={args.idle_exit:g} must be a positive number of seconds")
    if (args.env_file or args.detach) and not args.aws:
        raise SystemExit("fnmap emulator: --env-file and --detach go with --aws")
    return faults


def _serve(args, faults, limits) -> None:
    from ..emulator.server import serve

    offline = None
    if args.aws:
        from ..emulator.offline_aws import OfflineAws

        offline = OfflineAws(args.host)
    try:
        serve(host=args.host, port=args.port, workers=args.workers, watch_stdin=args.watch_stdin,
              faults=faults, wsgi_server=args.wsgi_server, lambda_runtime=args.lambda_runtime,
              on_listening=offline.announcer(args.env_file, args.detached) if offline else None,
              scaling_rate=args.scaling_rate,
              limits=limits, max_connections=args.max_connections, allow_hosts=tuple(args.allow_host),
              idle_exit=args.idle_exit, state_file=args.state_file, stop_on_hangup=args.stop_on_hangup)
    finally:
        if offline is not None:
            offline.stop()


def hide_working_folder() -> None:
    """Take the folder the emulator was started in off the import path of its workers.

    ``python -m`` puts it first, so a function could import a script's neighbour modules that
    a cloud worker never has: the emulator would hide the error the cloud will give.  fnmap
    itself is already imported (an install, or the checkout through ``PYTHONPATH``).
    """
    here = {"", os.getcwd(), os.path.realpath(os.getcwd())}
    sys.path[:] = [p for p in sys.path if p not in here or p in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
