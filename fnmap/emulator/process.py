"""Main of one emulator worker process: read framed requests on stdin, answer on stdout.

Frames are ``4-byte length | bytes``; a request is two frames (signature,
body), a response is a 4-byte status then one frame.  The protocol owns the
original stdout; user code's ``print`` goes to stderr.  End of stdin (the
emulator exited, even by SIGKILL) ends the process.

The emulator's pool runs :func:`serve` instead: the same loop over a
:mod:`multiprocessing` pipe, in a process forked from a fork server that has
imported this module already (fast worker replacement, issue 3).
"""

from __future__ import annotations

import os
import struct
import sys

_LEN = struct.Struct(">I")


def _read_exact(f, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        data = f.read(left)  # a pipe may return fewer bytes than asked
        if not data:
            return None
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def read_frame(f) -> bytes | None:
    head = _read_exact(f, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    return _read_exact(f, n) if n else b""


def main() -> None:
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # user prints go to stderr, never into the protocol
    protocol_in = os.fdopen(os.dup(0), "rb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    from ..runtime import worker
    from ..runtime.signing import secret_from_env

    secret = secret_from_env()
    protocol_out.write(b"R")  # ready: imports done
    protocol_out.flush()
    while True:
        signature = read_frame(protocol_in)
        body = read_frame(protocol_in) if signature is not None else None
        if body is None:
            return
        status, out = worker.handle(body, signature.decode() or None, secret)
        protocol_out.write(_LEN.pack(status) + _LEN.pack(len(out)))
        protocol_out.write(out)
        protocol_out.flush()


def serve(conn, env: dict | None) -> None:
    """Main of a forked worker (see :class:`fnmap.emulator.pool.WorkerProcess`): the same loop over
    a :mod:`multiprocessing` connection, one message per frame.  End of the pipe ends it."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.dup2(2, 1)  # user prints go to stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    import socket

    from ..runtime import worker
    from ..runtime.signing import secret_from_env

    worker.WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"  # imported before the fork
    secret = secret_from_env()
    try:
        conn.send_bytes(b"R")
        while True:
            signature = conn.recv_bytes()
            body = conn.recv_bytes()
            status, out = worker.handle(body, signature.decode() or None, secret)
            conn.send_bytes(_LEN.pack(status) + out)
    except (EOFError, OSError):  # the emulator closed the pipe, or died: nothing left to serve
        return


if __name__ == "__main__":
    sys.exit(main())
