"""The asyncio twins (``fnmap.map.aio`` ...), awaitable Executor futures, the warning for a blocking
form in a coroutine, cancelling through asyncio, and ``imap(buffersize=)``, on the real emulator."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import subprocess
import sys
import time
import traceback
import warnings

import pytest
from naps import fails_on_two, nap, nap_then_mark

import fnmap
from fnmap.observe import history
from fnmap.storage import open_store

pytestmark = pytest.mark.timeout(240)
BlockingCallWarning = fnmap.BlockingCallWarning


def square(x):
    return x * x


async def numbers(n):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


def test_each_twin_gives_what_its_blocking_form_gives():
    async def main():
        return (await fnmap.map.aio(square, range(20)), await fnmap.starmap.aio(pow, [(2, 3), (3, 2)]),
                await fnmap.map_reduce.aio(square, range(20), sum),
                [r async for r in fnmap.imap.aio(square, range(20))],
                sorted([r async for r in fnmap.imap_unordered.aio(square, numbers(20))]),
                await fnmap.map.aio(square, numbers(5)),
                await fnmap.map.aio(fails_on_two, range(4), return_exceptions=True))

    mapped, starred, reduced, streamed, unordered, from_async, with_errors = asyncio.run(main())
    assert mapped == fnmap.map(square, range(20)) == streamed == unordered
    assert starred == fnmap.starmap(pow, [(2, 3), (3, 2)])
    assert reduced == fnmap.map_reduce(square, range(20), sum)
    assert from_async == [0, 1, 4, 9, 16]
    assert with_errors[:2] == [0, 1] and isinstance(with_errors[2], ValueError)


def test_a_remote_error_is_raised_at_the_await_as_the_blocking_form_raises_it():
    async def main():
        await fnmap.map.aio(fails_on_two, range(4))

    with pytest.raises(ValueError, match="two") as info:
        asyncio.run(main())
    assert any("item 2" in note for note in info.value.__notes__)
    assert "fails_on_two" in str(info.value.__cause__)  # the remote traceback, as with fnmap.map
    frames = "".join(traceback.format_tb(info.value.__traceback__))
    assert "concurrent/futures" not in frames and "fnmap/api.py" not in frames, frames  # from the await


@pytest.mark.parametrize("stream", ["imap", "imap_unordered"])
def test_async_for_yields_each_result_as_its_call_finishes(tmp_path, stream):
    slow_done = tmp_path / "slow-call-ended"
    items = [(0.0, str(tmp_path / "quick")), (6.0, str(slow_done))]

    async def main():
        got = []
        async for value in getattr(fnmap, stream).aio(nap_then_mark, items, workers=2, chunksize=1):
            got.append((value, slow_done.exists()))
        return got

    assert asyncio.run(main()) == [(0.0, False), (6.0, True)]  # the first came while the slow call ran


def test_executor_futures_are_real_futures_that_asyncio_awaits():
    async def main(ex):
        futures = [ex.submit(nap, d) for d in (1.5, 0.0, 0.3)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        order = [await f for f in asyncio.as_completed(futures)]
        done, _ = await asyncio.wait([ex.submit(square, 3)])
        gathered = await asyncio.gather(ex.submit(square, 4), ex.submit(square, 5))
        return order, [t.result() for t in done], gathered, await ex.submit(square, 6)

    with fnmap.Executor(workers=3) as ex:
        order, done, gathered, one = asyncio.run(main(ex))
    assert order[0] == 0.0 and order[-1] == 1.5
    assert done == [9] and gathered == [16, 25] and one == 36


def test_cancelling_the_await_of_a_queued_executor_future_cancels_its_call(tmp_path):
    async def main(ex):
        ex.submit(nap, 1.5)  # takes the one worker
        queued = ex.submit(start_and_nap, (0, str(tmp_path)))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(queued, 0.2)
        return queued

    with fnmap.Executor(workers=1) as ex:
        queued = asyncio.run(main(ex))
    assert queued.cancelled() and not list(tmp_path.glob("started-*"))


def test_the_loop_keeps_running_during_a_thousand_call_map():
    """A heartbeat coroutine ticks while 1,000 calls run (its longest stall is measured by
    benchmarks/async_bridge.py, not asserted here)."""
    async def main():
        ticks = []
        stop = asyncio.Event()

        async def heartbeat():
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        job = await fnmap.map.aio(square, range(1000), chunksize=1, return_job=True)
        assert await fnmap.job(job.id).wait.aio(60)
        out = await fnmap.job(job.id).results.aio()
        ended = time.monotonic()
        stop.set()
        await beating
        return out, job, [t for t in ticks if started <= t <= ended], started, ended

    out, job, during, started, ended = asyncio.run(main())
    assert out == [x * x for x in range(1000)] and job.summary()["calls"] == 1000
    assert len(during) >= 20, (len(during), ended - started)
    third = (ended - started) / 3  # it ticked in each third of the map, not only around one stall
    assert all(any(started + k * third <= t <= started + (k + 1) * third for t in during) for k in range(3))


def blocking_map_in_a_coroutine(**options):
    async def main():
        return fnmap.map(square, range(3), return_exceptions=True, **options)  # the line the warning names

    return asyncio.run(main())


def helper_that_blocks():
    return fnmap.map(square, range(2))


def test_a_blocking_form_in_a_coroutine_works_and_warns_at_the_callers_line(monkeypatch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert blocking_map_in_a_coroutine() == [0, 1, 4]
        assert fnmap.map(square, range(3)) == [0, 1, 4]  # no loop here: no warning

        async def via_a_helper():
            return helper_that_blocks()

        assert asyncio.run(via_a_helper()) == [0, 1]
    found = [w for w in caught if issubclass(w.category, BlockingCallWarning)]
    assert len(found) == 2, [(w.filename, w.lineno, str(w.message)[:30]) for w in caught]
    first, second = found
    assert first.filename == __file__ and "return fnmap.map(square, range(3), return_exceptions=True" in \
        open(__file__).read().splitlines()[first.lineno - 1]
    assert "await fnmap.map.aio(...)" in str(first.message)
    assert second.lineno == helper_that_blocks.__code__.co_firstlineno + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blocking_map_in_a_coroutine(blocking_warning=False)
        monkeypatch.setenv("FNMAP_BLOCKING_WARNING", "0")
        blocking_map_in_a_coroutine()
    assert not [w for w in caught if issubclass(w.category, BlockingCallWarning)]


async def waits_in_a_coroutine() -> list:
    """Waits on a running job (``return_job=True``'s) and on an Executor future that has not finished,
    then on both again, done: what the blocking waits return."""
    job = fnmap.map(nap, [0.3] * 2, return_job=True)  # starting it blocks a moment: warned too
    got = [job.results()]  # waits for the job
    with fnmap.Executor() as ex:
        future = ex.submit(nap, 0.3)
        got.append(future.result())  # waits for the call
    job.wait()
    return [*got, job.results(), future.result()]  # done: nothing to wait for, no warning


def test_waiting_on_a_job_or_an_executor_future_in_a_coroutine_warns_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(waits_in_a_coroutine()) == [[0.3, 0.3], 0.3, [0.3, 0.3], 0.3]
    found = [(w.lineno, str(w.message)) for w in caught if issubclass(w.category, BlockingCallWarning)]
    lines = open(__file__).read().splitlines()
    assert [lines[lineno - 1].strip().split("  #")[0] for lineno, _ in found] == [
        "job = fnmap.map(nap, [0.3] * 2, return_job=True)", "got = [job.results()]",
        "got.append(future.result())"], found
    assert "`await job.results.aio()`" in found[1][1] and "`await future`" in found[2][1]


SCRIPT = """\
import asyncio, fnmap

async def main():
    return fnmap.map(abs, [-1, -2])

print(asyncio.run(main()))
"""


def test_a_script_shows_the_warning_at_its_line_under_the_default_filters(tmp_path):
    script = tmp_path / "service.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "[1, 2]\n", done.stdout + done.stderr
    assert f"{script}:4: BlockingCallWarning" in done.stderr, done.stderr
    assert "await fnmap.map.aio(...)" in done.stderr and "return fnmap.map(abs, [-1, -2])" in done.stderr


def start_and_nap(args):
    index, folder = args
    import pathlib

    pathlib.Path(folder, f"started-{index}").touch()
    time.sleep(0.5)
    return index


def _only_job(storage: str):
    jobs = history.list_jobs(open_store(storage))
    assert len(jobs) == 1, jobs
    return fnmap.job(jobs[0]["job_id"], storage=storage)


async def _cancel_after_two_started(how: str, folder, storage: str):
    items = [(i, str(folder)) for i in range(40)]
    options = {"workers": 2, "chunksize": 1, "storage": storage, "speculation": False}
    if how == "aclose":
        stream = fnmap.imap.aio(start_and_nap, items, **options)
        await stream.__anext__()
        await stream.aclose()
        return
    work = fnmap.map.aio(start_and_nap, items, **options)
    if how == "wait_for":
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(work, 1.0)
        return
    task = asyncio.ensure_future(work)
    while len(list(folder.glob("started-*"))) < 2:
        await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("how", ["cancel", "wait_for", "aclose"])
def test_cancelling_the_awaiting_task_cancels_the_job(tmp_path, how):
    folder = tmp_path / "side"
    folder.mkdir()
    storage = (tmp_path / "storage").as_uri()
    asyncio.run(_cancel_after_two_started(how, folder, storage))
    job = _only_job(storage)
    assert job.wait(60)
    started = {p.name for p in folder.glob("started-*")}
    assert job.status == "cancelled", job.summary()
    time.sleep(1.5)  # three calls' time: a queued call sent after the cancel would have started
    assert {p.name for p in folder.glob("started-*")} == started
    assert len(started) < 10, started
    calls = job.record()["calls"]
    assert sum(1 for c in calls if c["status"] == "cancelled") >= 40 - len(started)


def test_cancelling_map_reduce_aio_stops_its_map_and_starts_no_reduce(tmp_path):
    folder = tmp_path / "side"
    folder.mkdir()
    storage = (tmp_path / "storage").as_uri()

    async def main():
        task = asyncio.ensure_future(fnmap.map_reduce.aio(
            start_and_nap, [(i, str(folder)) for i in range(20)], sum, workers=2, chunksize=1, storage=storage))
        while not list(folder.glob("started-*")):
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    job = _only_job(storage)  # the map's: no reduce level was started
    assert job.wait(60) and job.status == "cancelled", job.summary()


def test_shield_keeps_the_job_running(tmp_path):
    storage = (tmp_path / "storage").as_uri()

    async def main():
        inner = asyncio.ensure_future(fnmap.map.aio(nap, [0.3] * 6, workers=2, chunksize=1, storage=storage))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(inner), 0.2)
        return await inner

    assert asyncio.run(main()) == [0.3] * 6
    job = _only_job(storage)
    assert job.wait(60) and job.status == "succeeded"


def test_buffersize_reads_an_endless_generator_at_most_n_ahead():
    read = []

    def endless():
        for i in itertools.count():
            read.append(i)
            yield i

    taken = []
    stream = fnmap.imap(square, endless(), buffersize=4)
    for value in stream:
        taken.append(value)
        assert len(read) - len(taken) <= 4
        if len(taken) == 40:
            break
    stream.close()
    assert taken == [x * x for x in range(40)]

    async def from_async():
        pulled = []

        async def endless_async():
            for i in itertools.count():
                pulled.append(i)
                yield i

        got = []
        async with contextlib.aclosing(fnmap.imap_unordered.aio(square, endless_async(), buffersize=3)) as results:
            async for value in results:
                got.append(value)
                await asyncio.sleep(0.5 if len(got) % 5 == 0 else 0.02)  # room to read ahead, if it would
                assert len(pulled) - len(got) <= 3, (len(pulled), len(got))
                if len(got) == 30:
                    break
        return got

    assert sorted(asyncio.run(from_async())) == [x * x for x in range(30)]


def test_a_bad_buffersize_is_refused_with_the_fix():
    with pytest.raises(fnmap.ConfigError, match="buffersize=0 must be an integer >= 1"):
        fnmap.imap(square, range(3), buffersize=0)
    with pytest.raises(fnmap.ConfigError, match="chunksize=8 is above buffersize=2"):
        fnmap.imap(square, range(3), buffersize=2, chunksize=8)
