"""fnmap.locks.YieldingLock: a mutex first, whatever it does to avoid lock convoys (issue 9)."""

from __future__ import annotations

import threading
import time

from fnmap.locks import YieldingLock


def test_mutual_exclusion_under_contention():
    lock, state = YieldingLock(), {"n": 0, "inside": 0, "overlap": False}

    def work():
        for _ in range(2000):
            with lock:
                state["inside"] += 1
                state["overlap"] |= state["inside"] > 1
                n = state["n"]
                time.sleep(0) if n % 97 == 0 else None  # give up the GIL inside, now and then
                state["n"] = n + 1
                state["inside"] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["n"] == 8 * 2000 and not state["overlap"]


def test_a_waiter_blocks_until_a_slow_holder_releases():
    lock, order = YieldingLock(), []
    lock.acquire()

    def waiter():
        with lock:
            order.append("waiter")

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)  # far past the waiter's yielding tries: it is blocked, not spinning forever
    assert t.is_alive() and lock.locked()
    order.append("holder")
    lock.release()
    t.join(5)
    assert order == ["holder", "waiter"] and not lock.locked()
