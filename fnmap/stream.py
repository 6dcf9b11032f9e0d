"""``imap(..., buffersize=N)``: a map over an iterable read at most N items ahead of its results.

``fnmap.imap`` without it makes the job's calls at its start: it reads every item (to name one
that does not pickle before anything runs, and to size the chunks), so an endless generator
never starts.  With ``buffersize`` (the name and meaning of Python 3.14's
``Executor.map(buffersize=)``) the items are read as the results are taken: at most N items are
read and not yet handed to the caller, so an endless generator, or a stream of items an
``async for`` reads (``fnmap.imap.aio``), runs in bounded memory.  Each call takes ``chunksize``
items (1 unless given; at most N), and is sent as soon as its items are read; a result is let go
once it was handed out.  The job keeps each call's bookkeeping (a few hundred bytes a call), as an
``fnmap.Executor`` does.  No progress bar: the number of items is not known.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from .client import get_client
from .errors import ConfigError
from .jobs import ResultSlot


class _TakenSlot(ResultSlot):
    """A call's result slot that lets its results go once they were handed out."""

    __slots__ = ()

    def release(self) -> None:
        self._value = None


def check_buffersize(buffersize, chunksize: int | None) -> int:
    """The items per call of a map with ``buffersize``; ConfigError naming a bad value."""
    if isinstance(buffersize, bool) or not isinstance(buffersize, int) or buffersize < 1:
        raise ConfigError(f"buffersize={buffersize!r} must be an integer >= 1 (the most items read ahead of "
                          "the results taken), or None to read every item at the start")
    size = chunksize or 1
    if size > buffersize:
        raise ConfigError(f"chunksize={size} is above buffersize={buffersize}: a call could never be filled; "
                          f"use chunksize <= {buffersize}, or a larger buffersize")
    return size


def start(func: Callable, items: Iterable, config, buffersize: int, ordered: bool, mode: str, recorder) -> tuple:
    """Start the job and send its first calls (up to ``buffersize`` items); ``(job, its calls in
    input order or as they are done)``, reading more items as each call is handed on."""
    chunksize = check_buffersize(buffersize, config.chunksize)
    client = get_client(config)
    job = client.new_job(config, "map", function=func, stream=True, recorder=recorder)
    try:
        func_key = client.upload_function(func, job)
        feed = _Feed(client, job, func_key, iter(items), mode, chunksize, buffersize)
        feed.fill()
    except BaseException as e:
        client.setup_failed(job, e)  # nothing runs; the record says why
        raise
    if not feed.sealed:  # its "running" entry with the calls made so far
        job.save_record(final=False)
    return job, (feed.in_order() if ordered else feed.as_completed())


class _Feed:
    """Makes the calls of a buffered map as its results are taken."""

    def __init__(self, client, job, func_key: str, items, mode: str, chunksize: int, buffersize: int):
        self.client, self.job, self.func_key, self.items, self.mode = client, job, func_key, items, mode
        self.chunksize, self.buffersize = chunksize, buffersize
        #: Items read from the caller's iterable, and items whose results were handed on.
        self.read = 0
        self.taken = 0
        self.exhausted = False
        self.sealed = False

    def fill(self) -> None:
        """Read items and send calls while fewer than ``buffersize`` items are read ahead."""
        states = []
        try:
            while not self.exhausted and self.read - self.taken < self.buffersize:
                room = self.buffersize - (self.read - self.taken)
                chunk = list(itertools.islice(self.items, min(self.chunksize, room)))
                if not chunk:
                    self.exhausted = True
                    break
                states.append(self.client.add_call(self.job, self.func_key, (self.mode, chunk), self.read,
                                                   len(chunk), _TakenSlot()))
                self.read += len(chunk)
        finally:
            if states:  # those made before an item failed still run (and are cancelled with the job)
                self.client.submit(self.job, states)
        if self.exhausted and not self.sealed:
            self.sealed = True
            self.client.seal(self.job)

    def _handed(self, state) -> None:
        self.taken += state.n_items
        state.future.release()

    def in_order(self):
        """The calls in input order, each once it and those before it are done."""
        run = self.job.run
        index = 0
        while True:
            self.fill()
            if index == len(run.calls):  # every item read, every call handed on
                return
            state = run.calls[index]
            while not state.future.done():
                run.completed.get()  # some call finished: look again
            yield state
            self._handed(state)
            index += 1

    def as_completed(self):
        """The calls as they are done."""
        run = self.job.run
        handed = 0
        while True:
            self.fill()
            if handed == len(run.calls):
                return
            state = run.completed.get()
            yield state
            self._handed(state)
            handed += 1
