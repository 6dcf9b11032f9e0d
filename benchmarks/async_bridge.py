"""What the asyncio twins cost: ``python benchmarks/async_bridge.py [--runs N]``.

1. The bridge's per-result cost: ``fnmap.map`` against ``await fnmap.map.aio``, and iterating
   ``fnmap.imap`` against ``async for`` over ``fnmap.imap.aio``, over 1,000 and 100,000 tiny items
   (``abs`` of an int, automatic chunking) on the default emulator; the difference of the medians,
   divided by the items, is what the bridge adds per result.  ``wakeups``: how often the caller's
   loop was woken for ``imap.aio``'s results (one ``call_soon_threadsafe`` per batch).
2. The caller's loop while fnmap works: a heartbeat coroutine sleeps 1 ms at a time during an
   ``await fnmap.map.aio`` of 1,000 calls (``chunksize=1``); its longest stall (the longest gap
   between two beats, less the 1 ms asked for) and its 99th percentile; beside it the same map
   run blocking on a thread of asyncio's (``asyncio.to_thread``: the threads' share of the GIL
   without fnmap's bridge) and a plain sleep (the machine's own noise).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import fnmap
from fnmap import loop as fnmap_loop


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bridge_cost(n: int, runs: int) -> dict:
    items = range(-n, 0)
    expected = [abs(x) for x in items]
    wakeups = []
    take = fnmap_loop.Inbox._take_arrived

    def counting(self):
        wakeups[-1] += 1
        return take(self)

    async def aio_imap():
        wakeups.append(0)
        got = [r async for r in fnmap.imap.aio(abs, items)]
        assert got == expected

    times: dict[str, list[float]] = {"map": [], "map.aio": [], "imap": [], "imap.aio": []}
    fnmap_loop.Inbox._take_arrived = counting
    try:
        for _ in range(runs):
            times["map"].append(_timed(lambda: fnmap.map(abs, items)))
            times["map.aio"].append(_timed(lambda: asyncio.run(fnmap.map.aio(abs, items))))
            times["imap"].append(_timed(lambda: list(fnmap.imap(abs, items))))
            times["imap.aio"].append(_timed(lambda: asyncio.run(aio_imap())))
    finally:
        fnmap_loop.Inbox._take_arrived = take
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "items": n, **{f"{k}_s": round(v, 4) for k, v in med.items()},
        "map_aio_extra_us_per_result": round((med["map.aio"] - med["map"]) / n * 1e6, 2),
        "imap_aio_extra_us_per_result": round((med["imap.aio"] - med["imap"]) / n * 1e6, 2),
        "imap_aio_wakeups": statistics.median(wakeups),
    }


def heartbeat_stall(how: str, calls: int = 1000) -> dict:
    """The heartbeat during ``await fnmap.map.aio`` (``how="aio"``), during the blocking map on a
    thread of asyncio's (``"to_thread"``: the same work, without fnmap's bridge), or during a sleep
    as long as the last map (``"idle"``: what this machine's load alone does to the heartbeat)."""
    async def work():
        if how == "aio":
            return await fnmap.map.aio(abs, range(calls), chunksize=1)
        if how == "to_thread":
            return await asyncio.to_thread(fnmap.map, abs, range(calls), chunksize=1)
        await asyncio.sleep(0.5)
        return list(range(calls))

    async def main():
        beats = []
        stop = asyncio.Event()

        async def heartbeat():
            while not stop.is_set():
                beats.append(time.perf_counter())
                await asyncio.sleep(0.001)

        task = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.02)
        started = time.perf_counter()
        out = await work()
        ended = time.perf_counter()
        stop.set()
        await task
        assert out == list(range(calls))
        during = [b for b in beats if started <= b <= ended]
        gaps = sorted(b - a - 0.001 for a, b in zip(during, during[1:], strict=False))
        return {"how": how, "calls": calls, "map_s": round(ended - started, 3), "beats": len(during),
                "longest_stall_ms": round(gaps[-1] * 1e3, 2),
                "p99_stall_ms": round(gaps[int(len(gaps) * 0.99)] * 1e3, 2)}

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    fnmap.map(abs, range(10))  # the emulator is up before anything is timed
    out = {"bridge": [bridge_cost(n, args.runs) for n in (1_000, 100_000)],
           "heartbeat": [heartbeat_stall(how) for _ in range(args.runs) for how in ("aio", "to_thread", "idle")]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
