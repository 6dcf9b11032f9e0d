"""How fast ``fnmap dashboard`` opens on big storage: 1,000 jobs listed, a 100,000-call job's page.

    python benchmarks/dashboard.py [--jobs 1000] [--calls 100000] [--no-browser]

Writes, into a temporary folder, ``--jobs`` finished jobs (10 calls each, 5 of them still running)
and one job of ``--calls`` calls (one call in 997 retried after a crash, one in 2,000 failed with
a traceback) with a status record per attempt as its workers would leave, each record through
fnmap's own writer (:func:`fnmap.observe.records.write`), so the dashboard reads what a real job
leaves.  Then it serves the dashboard on loopback and times:

* the JSON answers a page fetches, first (nothing read yet) and again (a poll);
* with Debian's Chromium (Selenium), on a dashboard that has read nothing yet, the time from
  asking for each page until it shows: every row of the front page; the job page's summary, then
  its timeline drawn.

Each first opening is the median over ``--rounds`` fresh dashboards.

The targets: each page opens within 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

from fnmap.dashboard.server import Dashboard
from fnmap.observe import identity, records
from fnmap.observe.history import write_index
from fnmap.runtime import keys
from fnmap.storage import open_store

TOKEN = "benchmark-token-benchmark-token"


def _call(i: int, sent: float, rnd: random.Random) -> dict:
    started = sent + 0.01
    finished = started + rnd.uniform(0.05, 0.3)
    written = finished + 0.005
    attempts = [{"attempt": 1, "sent": sent, "ended": written + 0.002, "outcome": "ok"}]
    if i % 997 == 996:  # a crashed worker, retried
        attempts = [{"attempt": 1, "sent": sent, "ended": sent + 0.5, "outcome": "crashed"},
                    {"attempt": 2, "sent": sent + 0.5, "ended": written + 0.5, "outcome": "ok"}]
    failed = i % 2000 == 1999
    return {
        "call": i, "first_item": i, "items": 1, "status": "error" if failed else "ok",
        "error": "ValueError: bad item" if failed else None,
        "traceback": (f'Traceback (most recent call last):\n  File "work.py", line 3, in f\n    raise '
                      f'ValueError("bad item")\nValueError: bad item {i}\n') if failed else None,
        "submitted": sent, "ended": attempts[-1]["ended"], "attempt": attempts[-1]["attempt"],
        "attempts": attempts, "failed_items": 1 if failed else 0, "worker": f"w{i % 64}", "cold": i < 64,
        "started": started, "loaded": started + 0.001, "finished": finished, "written": written,
        "bytes_in": 120, "bytes_out": 80, "peak_memory_kb": 50_000, "log_tail": None,
    }


def job_record(calls: int, created: float, seed: int = 0) -> dict:
    """A finished map job's record of ``calls`` calls, as :func:`fnmap.observe.records.build` makes them."""
    rnd = random.Random(seed)
    record = {
        "format": records.FORMAT, "job_id": uuid.UUID(int=rnd.getrandbits(128)).hex, "kind": "map",
        "function": f"bench_{seed % 7}", "origin": "benchmarks/dashboard.py", "client": identity.client_process(),
        "error": None, "shared": [], "backend": "emulator", "storage": "", "created": created, "raised": None,
        "options": {"chunksize": 1, "timeout": None, "retries": 2, "memory": None, "gpu": None, "region": None,
                    "retry_on": [], "instance_type": None},
        "calls": [_call(i, created + i * 0.001, rnd) for i in range(calls)],
    }
    record["finished"] = max(c["ended"] for c in record["calls"])
    record["summary"] = records.summarize(record)
    return record


def fill(store, jobs: int, calls: int) -> str:
    """Write the jobs; the id of the big one."""
    now = time.time()
    for n in range(jobs):
        record = job_record(10, now - 86_400 + n * 60, seed=n)
        if n >= jobs - 5:  # still running: only the entry a job writes when it starts
            summary = dict(record["summary"], status="running", finished=None, calls=10, calls_done=0)
            write_index(store, summary)
        else:
            records.write(store, record)
    big = job_record(calls, now - 3_600, seed=10**6)
    _status_records(store, big)
    records.write(store, big)
    return big["job_id"]


def _status_records(store, record: dict) -> None:
    """The status record each attempt's worker writes (a reader lists them all)."""

    def put(call: dict) -> None:
        for attempt in call["attempts"]:
            stats = {"call_id": call["call"], "attempt": attempt["attempt"], "first_item": call["first_item"],
                     "items": call["items"], **{k: call[k] for k in ("worker", "started", "finished", "written")}}
            store.put(keys.status_key(record["job_id"], call["call"], attempt["attempt"]), json.dumps(stats).encode())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, record["calls"]))


def timed_get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    answer = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120)
    answer.raise_for_status()
    return time.perf_counter() - start, len(answer.content)


def _median(timings: list[tuple[float, int]]) -> tuple[float, int]:
    return statistics.median(t for t, _ in timings), timings[0][1]


def browser_times(store, big: str, jobs: int, rounds: int) -> dict[str, float]:
    """Seconds from asking for each page until it shows, in headless Chromium, median of ``rounds``
    dashboards that have read nothing yet (none if Chromium or Selenium is absent)."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return {}
    if not chromium or not driver_path:
        return {}
    options = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tempfile.mkdtemp()}", "--window-size=1280,1000"):
        options.add_argument(flag)
    options.binary_location = chromium
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    found: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            with Dashboard(store, TOKEN, port=0) as fresh:
                time.sleep(2)  # its page-making process has started and imported, as a dashboard left open has
                for name, seconds in _open_pages(driver, fresh, big, jobs).items():
                    found.setdefault(name, []).append(seconds)
    finally:
        driver.quit()
    return {name: statistics.median(values) for name, values in found.items()}


def _open_pages(driver, dashboard, big: str, jobs: int) -> dict[str, float]:
    from selenium.webdriver.support.ui import WebDriverWait

    out = {}
    driver.get(f"{dashboard.url}jobs/0?token={TOKEN}")  # the cookie, on a page that reads no job
    rows = f"return document.querySelectorAll('#jobs tbody tr').length === {jobs + 1}"
    summary = "return document.getElementById('facts').children.length > 0"
    drawn = "return document.getElementById('timeline-note').textContent.includes('attempts')"
    pages = ((dashboard.url, ((f"front page, its {jobs} rows shown", rows),)),
             (dashboard.url + "jobs/" + big, (("job page, its summary shown", summary),
                                              ("job page, its timeline drawn", drawn))))
    for url, steps in pages:
        start = time.perf_counter()
        driver.get(url)
        for name, shown in steps:
            WebDriverWait(driver, 60, poll_frequency=0.02).until(lambda d, shown=shown: d.execute_script(shown))
            out[name] = time.perf_counter() - start
        fetched = driver.execute_script(
            "const e = performance.getEntriesByType('resource').filter((r) => r.name.includes('/api/'));"
            "return e.length ? e[e.length - 1].responseEnd / 1000 : null")
        if fetched is not None:
            out[f"{steps[0][0].split(',')[0]}, its JSON received"] = fetched
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="fresh dashboards per measurement (median)")
    args = parser.parse_args()
    load = os.getloadavg()
    folder = tempfile.mkdtemp(prefix="fnmap-dashboard-bench-")
    try:
        store = open_store(f"file://{folder}", "benchmark")
        start = time.perf_counter()
        big = fill(store, args.jobs, args.calls)
        size = os.path.getsize(os.path.join(folder, "jobs", big, "job.json"))
        print(f"wrote {args.jobs} jobs and a {args.calls}-call job ({size / 1e6:.1f} MB record) "
              f"in {time.perf_counter() - start:.1f} s")
        firsts: dict[str, list] = {}
        for _ in range(args.rounds):  # a fresh dashboard each: the first opening, nothing read yet
            with Dashboard(store, TOKEN, port=0) as dashboard:
                time.sleep(2)  # its page-making process has started and imported
                firsts.setdefault("list", []).append(timed_get(dashboard.url + "api/jobs"))
                firsts.setdefault("job", []).append(timed_get(dashboard.url + f"api/jobs/{big}"))
                polls = [timed_get(dashboard.url + "api/jobs") for _ in range(3)]
                again = timed_get(dashboard.url + f"api/jobs/{big}")
                metrics = [timed_get(dashboard.url + "metrics") for _ in range(3)]
        rows = [("front page JSON, first", *_median(firsts["list"])),
                ("front page JSON, a later poll", *_median(polls)),
                (f"{args.calls}-call job JSON, first", *_median(firsts["job"])),
                (f"{args.calls}-call job JSON, again", *again),
                ("/metrics", *_median(metrics))]
        shown = {} if args.no_browser else browser_times(store, big, args.jobs, args.rounds)
        print("| what | seconds | bytes |\n| --- | --- | --- |")
        for name, seconds, size in rows:
            print(f"| {name} | {seconds:.3f} | {size:,} |")
        for name, seconds in shown.items():
            print(f"| Chromium, nothing read yet: {name} | {seconds:.3f} | |")
        print(f"medians of {args.rounds} fresh dashboards")
        print(f"load average before: {load[0]:.1f}; after: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
