"""Main of one emulator worker process: answer signed requests from the emulator over a pipe.

The emulator's pool (:class:`fnmap.emulator.pool.WorkerProcess`) forks each worker from a fork
server that has imported this module already (fast worker replacement, issue 3) and runs
:func:`serve` in it: one request is one message (:data:`REQUEST_HEAD`, the
signature, the body; a large body comes as a second message), the answer is one message, a
4-byte status then the worker's response.  User code's ``print`` goes to stderr; the end of the
pipe (the emulator exited, even by SIGKILL) ends the process.
"""

from __future__ import annotations

import os
import struct

_LEN = struct.Struct(">I")
#: A request to a worker: flags, the signature's length, the signature, then the body (in the
#: same message up to INLINE_BODY bytes: one write and one read less per call; else the next one).
REQUEST_HEAD = struct.Struct(">BI")
#: Flag: the emulator verified the request's signature with the worker's own secret (see
#: :meth:`fnmap.emulator.app.Emulator.execute`); the worker does not verify it again.
VERIFIED = 1
#: Flag: the body follows the signature in the same message.
BODY_INLINE = 2
INLINE_BODY = 1 << 16


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
            message = conn.recv_bytes()
            flags, length = REQUEST_HEAD.unpack_from(message)
            start = REQUEST_HEAD.size + length
            signature = message[REQUEST_HEAD.size:start].decode()
            body = message[start:] if flags & BODY_INLINE else conn.recv_bytes()
            # VERIFIED: the emulator that is this process's parent, the only writer of this pipe,
            # checked the signature with this process's secret (Emulator.execute says why that is enough)
            status, out = worker.handle(body, signature or None, secret, verified=bool(flags & VERIFIED))
            conn.send_bytes(_LEN.pack(status) + out)
    except (EOFError, OSError):  # the emulator closed the pipe, or died: nothing left to serve
        return
