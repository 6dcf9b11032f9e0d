"""Main of one emulator worker process: answer signed requests from the emulator over a pipe.

The emulator's pool (:class:`fnmap.emulator.pool.WorkerProcess`) forks each worker from a fork
server that has imported this module already (fast worker replacement) and runs
:func:`serve` in it: one request is one message (:data:`REQUEST_HEAD`, the signature, the body),
the answer is one message, a 4-byte status then the worker's response.  A message is framed as
:mod:`multiprocessing` frames it (a 4-byte length, then the bytes) but written with one
``writev`` and read with one ``read`` when it is small: ``send_bytes``/``recv_bytes`` took two
system calls a side and a selector per poll.  User code's ``print`` goes to stderr; the end of the
pipe (the emulator exited, even by SIGKILL) ends the process.
"""

from __future__ import annotations

import io
import os
import struct

from ..runtime.local_modules import install_roots
from . import fresh_imports  # imported in the fork server: its snapshot of the .pth files

install_roots()  # found once in the fork server, not by each worker at its first look at its modules

#: The length before each message on a worker's pipe, and the status before its answer.
LENGTH = struct.Struct(">I")
#: A request to a worker: flags and the signature's length, then the signature and the body.
REQUEST_HEAD = struct.Struct(">BI")
#: Flag: the emulator verified the request's signature with the worker's own secret (see
#: :meth:`fnmap.emulator.app.Emulator.execute`); the worker does not verify it again.
VERIFIED = 1
#: Flag: the message holds several calls (:func:`fnmap.runtime.batch_frames.pack_calls`), answered
#: one message each, in order (the pool's ``execute_many``).
MANY = 2
#: Bytes asked for by the first read of a message (most are far smaller: one read).
FIRST_READ = 1 << 16


def write_message(fd: int, *parts) -> None:
    """Write one framed message made of ``parts`` (bytes-like), without joining them."""
    views = [memoryview(LENGTH.pack(sum(len(p) for p in parts))), *(memoryview(p).cast("B") for p in parts)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views.pop(0))
        if views and written:
            views[0] = views[0][written:]


def read_message(fd: int) -> bytes:
    """Read one framed message (blocking); EOFError at the end of the pipe."""
    data = os.read(fd, FIRST_READ)
    while 0 < len(data) < LENGTH.size:
        data += os.read(fd, LENGTH.size - len(data)) or b"!"  # "!": ended inside the length, said below
    if len(data) < LENGTH.size:
        raise EOFError
    (size,) = LENGTH.unpack_from(data)
    if len(data) == LENGTH.size + size:
        return data[LENGTH.size:]
    chunks, have = [data[LENGTH.size:]], len(data) - LENGTH.size
    while have < size:
        chunk = os.read(fd, min(size - have, 1 << 24))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        have += len(chunk)
    if have > size:  # a peer that writes one message at a time never gets here
        raise OSError("fnmap worker pipe out of step: more bytes than the message's length")
    return b"".join(chunks)


def serve(conn, env: dict | None, client: dict | None = None) -> None:
    """Main of a forked worker (see :class:`fnmap.emulator.pool.WorkerProcess`): the same loop over
    a :mod:`multiprocessing` connection, one message per frame.  End of the pipe ends it.

    ``client``: the client process this worker serves alone (:mod:`.sessions`), as the client
    would have started it: its working folder, its stderr (``live`` output reaches the client's
    terminal or notebook cell) and the import path its interpreter would have."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if client is not None:
        _become_clients(client)
    os.dup2(2, 1)  # user prints go to stderr
    _whole_lines()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    import socket

    from ..runtime import worker
    from ..runtime.batch_frames import unpack_calls
    from ..runtime.heap import keep_freed_memory
    from ..runtime.signing import secret_from_env

    keep_freed_memory()

    worker.WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"  # imported before the fork
    worker.reimport_changed_modules()  # it serves its client for long: an edited module is seen
    secret = secret_from_env()
    fd = conn.fileno()
    try:
        write_message(fd, b"R")
        while True:
            message = read_message(fd)
            flags, length = REQUEST_HEAD.unpack_from(message)
            start = REQUEST_HEAD.size + length
            signature = message[REQUEST_HEAD.size:start].decode()
            body = message[start:]
            # VERIFIED: the emulator that is this process's parent, the only writer of this pipe,
            # checked the signature with this process's secret (Emulator.execute says why that is enough)
            verified = bool(flags & VERIFIED)
            if flags & MANY:
                for signature, call in unpack_calls(body):
                    status, out = worker.handle(call, signature, secret, verified=verified)
                    _flush_output()
                    write_message(fd, LENGTH.pack(status), out)
                continue
            status, out = worker.handle(body, signature or None, secret, verified=verified)
            _flush_output()
            write_message(fd, LENGTH.pack(status), out)
    except (EOFError, OSError):  # the emulator closed the pipe, or died: nothing left to serve
        return


def _whole_lines() -> None:
    """``sys.stdout`` and ``sys.stderr`` that write whole lines (:class:`_LineWriter`)."""
    import sys

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, _LineWriter(io.BufferedWriter(raw, buffer_size=1 << 16),
                                       encoding=getattr(old, "encoding", None) or "utf-8",
                                       errors="backslashreplace"))


class _LineWriter(io.TextIOWrapper):
    """A text stream that writes up to its last end of line in one ``write(2)``, and keeps the rest.

    The workers of a client share its stderr: a line written in pieces (``print`` writes its text
    and its end apart when unbuffered; line buffering writes a text's unfinished last line with it)
    was cut into by another call's line.  A pipe takes a write of up to ``PIPE_BUF`` (4 KiB) whole;
    what a call leaves without its end of line goes when the call ends (:func:`_flush_output`)."""

    def write(self, s: str) -> int:
        cut = s.rfind("\n") + 1
        if not cut:
            return super().write(s)
        super().write(s[:cut])
        self.flush()
        if cut < len(s):
            super().write(s[cut:])
        return len(s)


def _flush_output() -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _become_clients(client: dict) -> None:
    """Take the client's folder, stderr and import path (see :func:`serve`).

    The fork server this process came from imported only fnmap and the standard library, and may
    be older than packages installed since: the ``.pth`` files added since it started are read
    (an editable install's finder or folder) and the import system forgets what it listed of the
    folders on the path, so a package installed a moment ago is found."""
    import importlib
    import sys

    stderr = client.get("stderr")
    if stderr is not None:
        os.dup2(stderr.fd, 2)
        os.close(stderr.fd)
    try:
        os.chdir(client["cwd"])
    except (OSError, KeyError, TypeError):
        pass  # the folder is gone: the call runs where the emulator runs, as a fresh shell would
    dropped = set(client.get("drop", ()))  # the emulator's own PYTHONPATH, which the client has not
    sys.path[:] = [p for p in sys.path if p not in dropped]
    sys.path[1:1] = [p for p in client.get("pythonpath", ()) if p not in sys.path]
    fresh_imports.read_new_pth_files()
    importlib.invalidate_caches()
