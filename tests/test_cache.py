"""The result cache (``cache=True``): every scenario in fresh processes, as a user re-runs a script.

Each run is a script in its own process (its own ``PYTHONHASHSEED``, its own imports), sharing the
storage and one emulator; the function appends a line to a side file per item it computes, so a
run's invocations are counted, not inferred.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import fnmap
from fnmap.cache.key import Uncacheable, encode, function_digest
from fnmap.runtime import keys
from fnmap.storage import open_store

SCRIPT = '''
import json, os, sys, warnings
import fnmap
{defs}

if __name__ == "__main__":
    warnings.simplefilter("always")
    options = json.loads(sys.argv[1])
    cache = options.pop("cache_knobs", None)
    if cache is not None:
        options["cache"] = fnmap.Cache(**cache)
    job = {call}
    results = job.results(return_exceptions=True)
    print(json.dumps({{"results": [repr(r) if isinstance(r, Exception) else r for r in results],
                      "job": job.id, "attempts": job.summary()["attempts"],
                      "hits": job.record()["summary"]["cache_hits"]}}))
'''

SQUARE = '''
def work(x):
    with open(os.environ["CALLS_FILE"], "a") as f:
        f.write(f"{x!r}\\n")
    return x * x
'''


class Runs:
    """Runs scripts in a folder of their own, counting what their function computed."""

    def __init__(self, folder, storage: str):
        self.folder = folder
        self.storage = storage
        self.calls = folder / "calls.txt"

    def write(self, name: str, text: str) -> None:
        (self.folder / name).write_text(textwrap.dedent(text))

    def script(self, defs: str, call: str = "fnmap.map(work, ITEMS, return_job=True, **options)",
               items: str = "list(range(12))") -> None:
        defs = textwrap.dedent(defs).replace('os.environ["CALLS_FILE"]', repr(str(self.calls)))  # the worker's too
        self.write("job.py", SCRIPT.format(defs=defs + f"\nITEMS = {items}\n", call=call))

    def start(self, seed: int = 0, env: dict | None = None, **options) -> subprocess.Popen:
        environment = {**os.environ, "CALLS_FILE": str(self.calls), "PYTHONHASHSEED": str(seed),
                       "FNMAP_STORAGE": self.storage, **(env or {})}
        return subprocess.Popen([sys.executable, "job.py", json.dumps({"cache": True, **options})],
                                cwd=self.folder, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def run(self, seed: int = 0, env: dict | None = None, **options) -> dict:
        """One run; its output, with ``computed``: the items its function computed."""
        before = self.computed()
        done = self.start(seed, env, **options)
        out, err = done.communicate(timeout=180)
        assert done.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        result["computed"] = self.computed()[len(before):]
        result["stderr"] = err
        return result

    def computed(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.fixture
def runs(tmp_path, module_emulator):
    return Runs(tmp_path, (tmp_path / "store").as_uri())


def entry_keys(storage: str) -> list[str]:
    return [k for k in open_store(storage).list(keys.CACHE_PREFIX) if not k.endswith(".json")]


# -- hits and misses ---------------------------------------------------------------------------

def test_the_same_map_run_again_invokes_nothing_and_returns_the_same(runs):
    runs.script(SQUARE)
    first = runs.run()
    assert first["results"] == [x * x for x in range(12)] and len(first["computed"]) == 12
    assert first["hits"] == 0
    again = runs.run(progress=True)
    assert again["computed"] == [] and again["attempts"] == {}  # no item computed, no call sent
    assert "cached=12" in again["stderr"]  # the progress bar counts the hits
    assert again["results"] == first["results"] and again["hits"] == 12
    attached = fnmap.job(again["job"], storage=runs.storage)  # from this process: the results are in storage
    assert attached.results() == first["results"]
    record = attached.record()
    assert [c["cached_from"] for c in record["calls"]] == [[[0, 12, first["job"]]]]
    assert record["summary"]["cost"]["s3_gets"] >= 12  # a hit is priced as the GET it is


def test_a_fresh_process_with_another_hash_seed_hits_for_sets_dicts_numpy_and_pandas(runs):
    runs.script('''
        import numpy as np
        import pandas as pd
        TAGS = {"alpha", "beta", "gamma", "delta", "epsilon"}
        def work(item):
            with open(os.environ["CALLS_FILE"], "a") as f:
                f.write("x\\n")
            return len(TAGS & item["tags"]) + float(item["array"].sum()) + float(item["frame"]["b"].sum())
        ''', items='''[{"tags": {f"t{i}", "alpha", "beta", "zeta", "omega"}, "meta": {"b": 2, "a": 1, f"k{i}": {i}},
                 "array": np.arange(i, i + 50, dtype=np.float64).reshape(5, 10),
                 "frame": pd.DataFrame({"a": [f"s{i}", "x"], "b": [i, 2.5]}, index=["r1", "r2"])}
                for i in range(6)]''')
    first = runs.run(seed=1)
    assert len(first["computed"]) == 6
    again = runs.run(seed=2)
    assert again["computed"] == [] and again["results"] == first["results"]


def test_a_hit_after_a_comment_or_blank_lines_misses_after_each_edit_that_changes_the_result(runs):
    runs.write("helpers.py", "OFFSET = 1\n\ndef shift(x):\n    return x + OFFSET\n")
    body = '''{preamble}
        import helpers
        SCALE = {scale}
        def make(factor):
            def work(x):{comment}
                with open(os.environ["CALLS_FILE"], "a") as f:
                    f.write("x\\n")
                return helpers.shift(x) * SCALE * factor * {literal} + len(os.environ.get("EXTRA", ""))
            return work
        work = make({factor})
        '''
    base = {"scale": 2, "comment": "", "literal": 1, "factor": 3, "preamble": ""}

    def computed_after(edit: dict | None = None, helper: str | None = None, **options) -> int:
        runs.script(body.format(**{**base, **(edit or {})}))
        if helper is not None:
            runs.write("helpers.py", helper)
        return len(runs.run(**options)["computed"])

    assert computed_after() == 12
    moved = {"comment": "\n\n                # a comment\n", "preamble": "\n        # lines above move it down\n\n"}
    assert computed_after(moved) == 0  # the same code, on other lines: a hit
    assert computed_after({"literal": 2}) == 12  # the body
    assert computed_after({"literal": 2}, helper="OFFSET = 1\n\ndef shift(x):\n    return x + OFFSET + 1\n") == 12
    assert computed_after({"literal": 2}, helper="OFFSET = 5\n\ndef shift(x):\n    return x + OFFSET + 1\n") == 12
    assert computed_after({"literal": 2, "scale": 3}) == 12  # a global it reads
    assert computed_after({"literal": 2, "scale": 3, "factor": 4}) == 12  # a closure's value
    assert computed_after({"literal": 2, "scale": 3, "factor": 4}, extra_env={"EXTRA": "x"}) == 12  # an option
    assert computed_after({"literal": 2, "scale": 3, "factor": 4}, extra_env={"EXTRA": "x"}, retries=5) == 0


def test_a_partly_cached_map_runs_only_its_misses(runs):
    runs.script(SQUARE, items="list(range(0, 24, 2))")
    assert len(runs.run()["computed"]) == 12
    for chunking in ({}, {"chunksize": 3}):  # automatic chunks, and fixed ones
        runs.script(SQUARE, items="list(range(24))" if not chunking else "list(range(30))")
        out = runs.run(**chunking)
        expected = 12 if not chunking else 6  # the odd ones; then 24..29
        assert len(out["computed"]) == expected and len(set(out["computed"])) == expected
        assert out["results"] == [x * x for x in range(24 if not chunking else 30)]


def test_a_failing_item_is_not_cached(runs):
    runs.script('''
        def work(x):
            with open(os.environ["CALLS_FILE"], "a") as f:
                f.write(f"{x}\\n")
            if x == 3:
                raise ValueError("three")
            return x
        ''', items="list(range(6))")
    first = runs.run()
    assert "ValueError" in first["results"][3] and len(first["computed"]) == 6
    again = runs.run()
    assert again["computed"] == ["3"] and again["results"][:3] == [0, 1, 2]


def test_expire_and_refresh(runs):
    runs.script('''
        def work(x):
            with open(os.environ["CALLS_FILE"], "a") as f:
                f.write(f"{x}\\n")
            with open(os.environ["CALLS_FILE"]) as f:
                return sum(1 for _ in f)  # which computation this was: a changed value when run again
        ''', items="[0, 1]")
    first = runs.run()["results"]
    assert runs.run(cache_knobs={"expire": "1h"})["results"] == first  # young enough: hits
    expired = runs.run(cache_knobs={"expire": 0.001})
    assert len(expired["computed"]) == 2 and expired["results"] != first
    assert runs.run()["results"] == expired["results"]  # the expired entries were replaced
    refreshed = runs.run(cache_knobs={"refresh": True})
    assert len(refreshed["computed"]) == 2 and refreshed["results"] != expired["results"]
    assert runs.run()["results"] == refreshed["results"]


def test_two_processes_writing_the_same_keys_at_once_leave_one_entry_each(runs):
    runs.script(SQUARE, items="list(range(40))")
    both = [runs.start(seed=seed) for seed in (1, 2)]
    outs = [json.loads(p.communicate(timeout=180)[0].strip().splitlines()[-1]) for p in both]
    assert all(p.returncode == 0 for p in both)
    assert outs[0]["results"] == outs[1]["results"] == [x * x for x in range(40)]
    assert len(entry_keys(runs.storage)) == 40
    assert runs.run()["computed"] == []


def test_a_planted_entry_is_refused_never_unpickled_and_replaced(runs):
    runs.script(SQUARE, items="[5, 6]")
    runs.run()
    store = open_store(runs.storage)
    planted = sorted(entry_keys(runs.storage))[0]
    import pickle

    store.put(planted, b"FNS1" + b"\0" * 32 + b'{"job":"x","created":0}\n' + pickle.dumps(999))
    out = runs.run()
    assert out["results"] == [25, 36] and len(out["computed"]) == 1
    assert "refused" in out["stderr"] and planted in out["stderr"]
    assert runs.run()["computed"] == []  # the refused entry was replaced by the recomputed one


def test_max_cost_admits_hits_without_reserving_a_call(runs):
    runs.script(SQUARE, items="[1, 2, 3]")
    runs.run()
    from fnmap.cost.pricing import Pricing

    pricing = Pricing.of("emulator", {})
    cap = pricing.job_overhead() + 3 * pricing.per_get + pricing.minimum() / 2  # less than one call
    out = runs.run(max_cost=cap)
    assert out["results"] == [1, 4, 9] and out["computed"] == []
    runs.script(SQUARE, items="[1, 2, 3, 4]")  # one miss: a call that does not fit
    done = runs.start(max_cost=cap)
    assert done.wait(timeout=180) == 1 and "CostCapReached" in done.communicate()[1]


def test_starmap_executor_imap_and_map_reduce_use_the_cache(runs):
    for call in ("fnmap.starmap(work, [(x,) for x in ITEMS], return_job=True, **options)",
                 "fnmap.map(work, ITEMS, return_job=True, **options)"):
        runs.script(SQUARE, call=call, items="[7, 8]")
        runs.run()
    assert len(runs.computed()) == 2  # starmap's (args, kwargs) are map's item: one key
    runs.write("other.py", textwrap.dedent('''
        import json, os, sys
        import fnmap
        from job import work
        with fnmap.Executor(cache=True) as ex:
            futures = [ex.submit(work, x) for x in (7, 8, 9)]
            print(json.dumps([f.result() for f in futures] + list(fnmap.imap(work, [7, 9], cache=True))
                             + [fnmap.map_reduce(work, [7, 8, 9], sum, cache=True)]))
        '''))
    env = {**os.environ, "CALLS_FILE": str(runs.calls), "FNMAP_STORAGE": runs.storage}
    done = subprocess.run([sys.executable, "other.py"], cwd=runs.folder, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [49, 64, 81, 49, 81, 194]
    assert runs.computed()[2:] == ["9"]  # only 9 was new


def test_the_cache_on_s3_is_shared_by_two_machines(runs, s3_env, tmp_path):
    bucket = s3_env("fnmap-cache-shared")
    runs.storage = f"s3://{bucket}/team"
    runs.script(SQUARE, items="list(range(8))")
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    for home in homes:
        (home / "config").mkdir(parents=True)

    def machine(home) -> dict:  # its own home and calls run in it (local backend); the team's secret
        return {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "FNMAP_BACKEND": "local",
                "FNMAP_SECRET": "team-secret", "FNMAP_EMULATOR_URL": ""}

    first = runs.run(seed=1, env=machine(homes[0]))
    assert len(first["computed"]) == 8
    second = runs.run(seed=2, env=machine(homes[1]))
    assert second["computed"] == [] and second["results"] == first["results"]
    assert len(entry_keys(runs.storage)) == 8


# -- the key, in this process ------------------------------------------------------------------

class Opaque:
    pass


LOG = logging.getLogger("fnmap-cache-test")


def reads_a_logger(x):
    LOG.debug("computing %s", x)
    return x + 1


def test_an_item_with_no_deterministic_encoding_is_refused_naming_its_type_and_key():
    with pytest.raises(Uncacheable, match=r"test_cache\.Opaque.*key="):
        encode({"a": [Opaque()]})
    assert encode({"b": {1, 2}, "a": (1.5, "x")}) == encode({"a": (1.5, "x"), "b": {2, 1}})
    assert encode([1]) != encode((1,)) and encode(1) != encode(1.0) and encode(True) != encode(1)


def test_key_and_ignore_choose_what_identifies_a_call(module_emulator, tmp_path):
    storage = (tmp_path / "store").as_uri()
    seen = []

    def inc(x, log=None):
        return x + 1

    with pytest.raises(Uncacheable, match="Opaque"):
        fnmap.map(inc, [Opaque()], cache=True, storage=storage)
    knobs = fnmap.Cache(key=lambda x: "same")
    assert fnmap.map(inc, [1], cache=knobs, storage=storage) == [2]
    assert fnmap.map(inc, [2], cache=knobs, storage=storage) == [2]  # the same key: the first result
    ignoring = fnmap.Cache(ignore=["log"])
    job = fnmap.starmap(inc, [(5, Opaque())], cache=ignoring, storage=storage, return_job=True)
    assert job.results() == [6]
    again = fnmap.starmap(inc, [(5, Opaque())], cache=ignoring, storage=storage, return_job=True)
    assert again.results() == [6] and again.summary()["attempts"] == {}
    assert not seen
    with pytest.raises(Uncacheable, match="global 'LOG' read by function reads_a_logger: a logging.Logger"):
        fnmap.map(reads_a_logger, [1], cache=True, storage=storage)
    assert fnmap.map(reads_a_logger, [1], cache=fnmap.Cache(ignore=["LOG"]), storage=storage) == [2]


def test_function_identity_sees_code_not_comments_nor_line_numbers():
    def define(source: str):
        namespace: dict = {}
        exec(compile(textwrap.dedent(source), "user.py", "exec"), namespace)
        return namespace["f"]

    plain = define("def f(x):\n    return x + 1\n")
    commented = define("\n\n# moved down\ndef f(x):\n    # a comment\n\n    return x + 1  # and another\n")
    edited = define("def f(x):\n    return x + 2\n")
    assert function_digest(plain) == function_digest(commented) != function_digest(edited)


def test_cache_ls_clear_and_gc(runs):
    runs.script(SQUARE, items="[1, 2, 3]")
    runs.run()

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "fnmap", *args, "--storage", runs.storage],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(cli("cache", "ls", "--json"))
    assert [(r["function"], r["entries"]) for r in listed] == [("work", 3)]
    assert "left alone the result cache: 3 entries" in cli("gc", "--older-than", "0s")
    assert len(entry_keys(runs.storage)) == 3
    assert "deleted 0 cache entries" in cli("cache", "clear", "--function", "work", "--older-than", "1d")
    assert "deleted 3 cache entries" in cli("cache", "clear", "--function", "work")
    assert entry_keys(runs.storage) == [] and "empty" in cli("cache", "ls")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(runs.run()["computed"]) == 3


def test_estimate_prices_hits_as_gets_and_calls_only_for_misses(runs):
    runs.script(SQUARE, items="[1, 2, 3]")
    runs.run()
    runs.write("estimate.py", textwrap.dedent('''
        import json, sys
        import fnmap
        from job import work
        print(json.dumps([fnmap.estimate(work, [1, 2, 3, 4, 5], cache=True, chunksize=1),
                          fnmap.estimate(work, [1, 2, 3, 4, 5], chunksize=1)]))
        '''))
    env = {**os.environ, "FNMAP_STORAGE": runs.storage}
    done = subprocess.run([sys.executable, "estimate.py"], cwd=runs.folder, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    cached, uncached = json.loads(done.stdout)
    assert (cached["calls"], cached["cache_hits"], cached["items"]) == (2, 3, 5) and uncached["calls"] == 5
    assert cached["usd"] < uncached["usd"]


def test_fnmap_job_the_dashboard_and_metrics_show_hits(runs):
    import requests
    from dashboard_jobs import serving
    from prometheus_client.parser import text_string_to_metric_families

    from fnmap.dashboard import auth

    runs.script(SQUARE, items="[1, 2, 3]")
    first = runs.run()
    runs.script(SQUARE, items="[1, 2, 3, 4]")
    second = runs.run()
    shown = subprocess.run([sys.executable, "-m", "fnmap", "job", second["job"], "--storage", runs.storage],
                           capture_output=True, text=True, timeout=60)
    assert f"cache    3 of 4 items from the result cache (no call sent), written by job(s) {first['job'][:12]}" \
        in shown.stdout, shown.stdout + shown.stderr
    token = "a-test-token-of-enough-length"
    with serving(runs.storage, token) as dashboard:
        base = dashboard.url.rstrip("/")
        metrics = requests.get(base + "/metrics", cookies={auth.COOKIE: token}, timeout=30).text
        page = requests.get(f"{base}/api/jobs/{second['job']}", cookies={auth.COOKIE: token}, timeout=30).json()
    samples = {(s.name, s.labels.get("job_id")): s.value
               for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples[("fnmap_job_cache_hits", second["job"])] == 3
    assert samples[("fnmap_job_cache_hits", first["job"])] == 0
    assert samples[("fnmap_cache_hits", None)] == 3
    assert any("3 of 4 items from the result cache" in note for note in page["notes"])


def test_cache_is_an_option_like_any_other(tmp_path, monkeypatch):
    from fnmap.config import resolve
    from fnmap.errors import ConfigError

    assert resolve().cache is None and resolve(cache=True).cache == fnmap.Cache()
    monkeypatch.setenv("FNMAP_CACHE", "1")
    assert resolve().cache == fnmap.Cache() and resolve(cache=False).cache is None  # the keyword wins
    monkeypatch.delenv("FNMAP_CACHE")
    (tmp_path / "fnmap.toml").write_text('[fnmap.cache]\nexpire = "2h"\nignore = ["log"]\n')
    monkeypatch.chdir(tmp_path)
    assert resolve().cache == fnmap.Cache(expire=7200, ignore=("log",))
    with pytest.raises(ConfigError, match=r"cache='yes' \(from keyword\) must be True, False or fnmap.Cache"):
        resolve(cache="yes")
    with pytest.raises(ConfigError, match="expire='soon'.*e.g. 12h"):
        fnmap.Cache(expire="soon")


def test_numpy_and_pandas_keys_change_with_values_dtypes_names_and_index():
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "t": pd.date_range("2026-01-01", periods=2, tz="UTC")})
    assert encode(frame) == encode(frame.copy())
    variants = [frame.assign(a=[1, 3]), frame.assign(a=[1.0, 2.0]), frame.rename(columns={"b": "c"}),
                frame.set_axis([5, 6]), frame.assign(b=["x", "z"]), frame[["b", "a", "t"]]]
    assert len({encode(v) for v in [frame, *variants]}) == 1 + len(variants)
    series = pd.Series([1, 2], name="s")
    assert encode(series) != encode(series.rename("r")) != encode(pd.Index([1, 2], name="s"))
    array = np.arange(6)
    assert encode(array) != encode(array.reshape(2, 3)) != encode(array.astype(np.int32))
    assert encode(array[::2]) == encode(np.array([0, 2, 4]))  # a view by its values, not its strides


def test_a_map_returns_once_its_entries_are_written(module_emulator, tmp_path):
    storage = (tmp_path / "store").as_uri()
    items = list(range(300))
    assert fnmap.map(abs, items, cache=True, storage=storage, chunksize=100) == items
    again = fnmap.map(abs, items, cache=True, storage=storage, chunksize=100, return_job=True)
    assert again.results() == items and again.summary()["attempts"] == {}  # the same process, at once
    assert list(fnmap.imap(abs, [-1, -2], cache=True, storage=storage)) == [1, 2]
    assert fnmap.map(abs, [-1, -2], cache=True, storage=storage, return_job=True).summary()["attempts"] == {}


def test_an_imap_returns_once_its_entries_are_written_whichever_thread_waits_for_them(module_emulator, tmp_path):
    """The job's own end waits for its entries on a dispatch thread while imap's last ``next()`` waits
    on the caller's: each must wait for every write, not only those it took (one that found them
    taken returned at once, before they were in storage, 7 rounds in 10)."""
    for round_ in range(6):
        storage = (tmp_path / f"store{round_}").as_uri()
        assert list(fnmap.imap(abs, [-1, -2], cache=True, storage=storage)) == [1, 2]
        written = [key for key in open_store(storage).list(keys.CACHE_PREFIX) if not key.endswith(".json")]
        assert len(written) == 2, (round_, written)


class Scaler:
    """A callable object: its state is part of what it computes."""

    def __init__(self, factor):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


def test_a_callable_objects_state_is_in_its_key():
    assert function_digest(Scaler(2)) == function_digest(Scaler(2)) != function_digest(Scaler(3))


def test_the_async_twins_and_the_decorator_take_the_cache_option(module_emulator, tmp_path):
    import asyncio

    storage = (tmp_path / "store").as_uri()
    assert fnmap.map(abs, [-3, -4], cache=True, storage=storage) == [3, 4]

    async def main():
        return await fnmap.map.aio(abs, [-3, -4], cache=True, storage=storage, return_job=True)

    job = asyncio.run(main())
    assert job.results() == [3, 4] and job.summary()["attempts"] == {}
    decorated = fnmap.function(cache=True, storage=storage)(abs)
    job = decorated.map([-3, -4], return_job=True)
    assert job.results() == [3, 4] and job.summary()["attempts"] == {}


def test_dataclass_items_and_classes_of_main_key_the_same_in_every_run(runs):
    runs.script('''
        import dataclasses
        import enum

        class Unit(enum.Enum):
            M = "m"
            KM = "km"

        @dataclasses.dataclass(frozen=True)
        class Point:
            x: float
            tags: frozenset
            unit: Unit = Unit.M

            def norm(self):
                return abs(self.x)

        def work(p):
            with open(os.environ["CALLS_FILE"], "a") as f:
                f.write("x\\n")
            return Point(p.x * 2, p.tags, p.unit).norm()
        ''', items='[Point(i, frozenset({"a", f"t{i}", "b"}), Unit.KM if i % 2 else Unit.M) for i in range(5)]')
    first = runs.run(seed=3)
    assert len(first["computed"]) == 5
    again = runs.run(seed=4)
    assert again["computed"] == [] and again["results"] == first["results"]
