"""The cost cap (issue 36) where people see it: ``fnmap jobs`` and ``fnmap job`` on a capped job,
``fnmap redrive ID --max-cost USD`` finishing one, and the dashboard's job page; over maps run on
a real emulator with their storage in a temporary folder.

Caps are computed from the pricing (:class:`fnmap.cost.pricing.Pricing`), never written as dollar
figures, so a price update does not break them."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from test_cost_cap import _counted, _ran

import fnmap
from fnmap.cost.pricing import Pricing, usd
from fnmap.dashboard import views

LAMBDA = Pricing.of("emulator", {})
SLEEP = 0.2
#: Calls at 10 GB: their compute is most of their cost, so a cap that allows about a third of the
#: calls is above the least the whole map costs (it is not refused before it starts).
BIG = 10240
ITEMS = 30
STATIC = pathlib.Path(views.__file__).parent / "static"


@pytest.fixture(scope="module")
def emulator(_module_emulator):
    """The module's emulator (conftest), named to the tests: they pass it to the commands they run."""
    return _module_emulator


def _capped_map(storage: str, emu, folder: str) -> fnmap.CostCapReached:
    """A 30-call map whose cap stops it after about a third of its calls: its CostCapReached."""
    per_call = LAMBDA.attempt(SLEEP, memory_mb=BIG, gets=3)
    cap = LAMBDA.job_overhead() + 10 * per_call
    assert LAMBDA.job_overhead() + ITEMS * LAMBDA.minimum(BIG) < cap  # not refused before it starts
    with pytest.raises(fnmap.CostCapReached) as caught:
        fnmap.map(_counted(folder, SLEEP), range(ITEMS), chunksize=1, memory=BIG, max_cost=cap, storage=storage,
                  emulator_url=emu.url, secret=emu.secret)
    assert 0 < caught.value.calls_done < ITEMS and caught.value.calls_not_run > 0, str(caught.value)
    return caught.value


@pytest.fixture(scope="module")
def jobs(emulator, tmp_path_factory):
    """In one storage: a capped job, a job well under its cap, and a job refused before any call."""
    storage = tmp_path_factory.mktemp("cost-cap-storage").as_uri()
    where = {"storage": storage, "emulator_url": emulator.url, "secret": emulator.secret}
    capped = _capped_map(storage, emulator, str(tmp_path_factory.mktemp("ran")))
    under = fnmap.map(abs, range(-3, 0), chunksize=1, max_cost=1.0, return_job=True, **where)
    assert under.results() == [3, 2, 1]
    with pytest.raises(fnmap.CostCapReached, match="refused before any call ran") as refused:
        fnmap.map(abs, range(50), chunksize=1, max_cost=LAMBDA.minimum(), **where)
    plain = fnmap.map(abs, [-1], return_job=True, **where)
    assert plain.results() == [1]
    return {"storage": storage, "capped": capped, "under": under.id, "refused": refused.value.id,
            "plain": plain.id}


def fnmap_cli(*args: str, storage: str, emu=None, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FNMAP_STORAGE": storage, **env}
    if emu is not None:
        env.update(FNMAP_EMULATOR_URL=emu.url, FNMAP_SECRET=emu.secret)
    return subprocess.run([sys.executable, "-m", "fnmap", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _row(listing: str, job_id: str) -> str:
    return next(line for line in listing.splitlines() if line.startswith(job_id[:12]))


def test_fnmap_jobs_shows_capped_and_spent_of_cap(jobs):
    capped = jobs["capped"]
    record = fnmap.job(capped.id, storage=jobs["storage"]).record()
    done = fnmap_cli("jobs", storage=jobs["storage"])
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert header.split()[-1] == "SPENT/CAP"
    row = _row(done.stdout, capped.id)
    assert " capped " in row
    assert row.endswith(f"{usd(record['cost_cap']['spent_usd'])}/{usd(capped.cap)}"), row
    under = fnmap.job(jobs["under"], storage=jobs["storage"]).summary()
    assert _row(done.stdout, jobs["under"]).endswith(f"{usd(under['cost_cap']['spent_usd'])}/$1.00")
    assert " succeeded " in _row(done.stdout, jobs["under"])
    assert _row(done.stdout, jobs["plain"]).endswith(" -")  # no cap: a dash in the column


def test_fnmap_jobs_has_no_cap_column_without_a_capped_job(emulator, tmp_path):
    storage = tmp_path.as_uri()
    assert fnmap.map(abs, [-1, -2], storage=storage, emulator_url=emulator.url, secret=emulator.secret) == [1, 2]
    done = fnmap_cli("jobs", storage=storage)
    assert done.returncode == 0 and "STATUS" in done.stdout, done.stderr
    assert "SPENT/CAP" not in done.stdout and "$" not in done.stdout


def test_fnmap_job_says_where_the_cap_stopped_it_and_how_to_finish(jobs):
    capped = jobs["capped"]
    summary = fnmap.job(capped.id, storage=jobs["storage"]).summary()  # the API shows the cap too
    assert summary["status"] == "capped" and summary["cost_cap"]["max_cost"] == capped.cap
    assert summary["cost_cap"]["reached"]
    done = fnmap_cli("job", capped.id[:10], storage=jobs["storage"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("capped")
    # Spent as the record says (the calls stopped in flight are priced after the exception was
    # made); the calls not run are the calls with no result, as the exception counted them.
    spent = summary["cost_cap"]["spent_usd"]
    line = (f"cost cap {usd(capped.cap)}: {usd(spent)} spent, stopped here ({capped.calls_not_run} calls "
            f"not run; finish with fnmap redrive {capped.id[:12]} --max-cost USD)")
    assert line in done.stdout.splitlines(), done.stdout


def test_fnmap_job_under_its_cap_and_refused_by_it(jobs):
    under = fnmap_cli("job", jobs["under"], storage=jobs["storage"])
    spent = fnmap.job(jobs["under"], storage=jobs["storage"]).summary()["cost_cap"]["spent_usd"]
    assert f"cost cap $1.00: {usd(spent)} spent (not reached)" in under.stdout.splitlines(), under.stdout
    refused = fnmap_cli("job", jobs["refused"], storage=jobs["storage"])
    assert refused.returncode == 0, refused.stderr
    assert f"cost cap {usd(LAMBDA.minimum())}: refused before any call" in refused.stdout
    assert "(50 calls not run; raise max_cost and run the map again)" in refused.stdout
    assert "cost cap" not in fnmap_cli("job", jobs["plain"], storage=jobs["storage"]).stdout
    again = fnmap_cli("redrive", jobs["refused"], storage=jobs["storage"])  # nothing was stored to redrive
    assert again.returncode != 0 and "refused before any call ran" in again.stderr, again.stderr


def test_redrive_help_names_max_cost_and_refuses_a_bad_one(tmp_path):
    done = fnmap_cli("redrive", "--help", storage=tmp_path.as_uri())
    said = " ".join(done.stdout.split())
    assert done.returncode == 0 and "--max-cost USD" in said and "(status capped) is finished with a new cap" in said
    bad = fnmap_cli("redrive", "abc", "--max-cost", "0", storage=tmp_path.as_uri())
    assert bad.returncode == 1 and "--max-cost 0 must be a positive number of US dollars" in bad.stderr


def test_redrive_with_a_bigger_cap_finishes_every_item_once(emulator, tmp_path):
    storage, folder = (tmp_path / "storage").as_uri(), str(tmp_path)
    capped = _capped_map(storage, emulator, folder)
    before = fnmap.job(capped.id, storage=storage, secret=emulator.secret).results(return_exceptions=True)
    kept = [i for i, r in enumerate(before) if r == i * 2]
    assert len(kept) == capped.calls_done and isinstance(before[-1], Exception)
    os.remove(os.path.join(folder, "ran"))
    bigger = 3 * LAMBDA.job_overhead() + ITEMS * LAMBDA.attempt(SLEEP, memory_mb=BIG, gets=3)
    # No speculative copy of the redrive's last call: it would run its item a second time (and
    # commit nothing), and this test counts runs.
    done = fnmap_cli("redrive", capped.id[:10], "--max-cost", str(bigger), storage=storage, emu=emulator,
                     FNMAP_SPECULATION="false")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"cost cap {usd(bigger)}: " in done.stdout and "(not reached)" in done.stdout, done.stdout
    job = fnmap.job(capped.id, storage=storage, secret=emulator.secret)
    assert job.status == "succeeded" and job.summary()["cost_cap"]["max_cost"] == bigger
    assert job.results() == [x * 2 for x in range(ITEMS)]
    # The redrive ran each item that had no result, once, and none that had one.
    assert sorted(_ran(folder)) == sorted(set(range(ITEMS)) - set(kept)), (_ran(folder), kept)


def test_the_dashboard_job_page_shows_the_cap(jobs):
    capped = jobs["capped"]
    record = fnmap.job(capped.id, storage=jobs["storage"]).record()
    page = views.job_page(record)
    assert page["summary"]["status"] == "capped"
    spent = record["cost_cap"]["spent_usd"]
    said = f"cost cap {usd(capped.cap)}: {usd(spent)} spent, stopped here ({capped.calls_not_run} calls"
    assert any(note.startswith(said) for note in page["notes"]), page["notes"]
    assert said in page["cost_text"]
    redrive = [c["command"] for c in page["commands"] if c["command"].startswith("fnmap redrive")]
    assert redrive == [f"fnmap redrive {capped.id[:12]} --max-cost USD"]
    under = views.job_page(fnmap.job(jobs["under"], storage=jobs["storage"]).record())
    assert under["cost_text"].endswith(" spent (not reached)") and under["notes"] == []
    # `capped` has a colour of its own, not the grey of an unknown status.
    assert '"capped"' in (STATIC / "common.js").read_text().partition("STATUSES:")[2].partition("]")[0]
    assert ".status-capped {" in (STATIC / "dashboard.css").read_text()
