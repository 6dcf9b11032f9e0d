"""Main of one emulator worker process: answer signed requests from the emulator over a pipe.

The emulator's pool (:class:`fnmap.emulator.pool.WorkerProcess`) forks each worker from a fork
server that has imported this module already (fast worker replacement, issue 3) and runs
:func:`serve` in it: one request is two messages (signature, body), the answer is one message, a
4-byte status then the worker's response.  User code's ``print`` goes to stderr; the end of the
pipe (the emulator exited, even by SIGKILL) ends the process.
"""

from __future__ import annotations

import os
import struct

_LEN = struct.Struct(">I")


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
