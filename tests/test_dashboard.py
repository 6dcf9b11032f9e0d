"""``fnmap dashboard`` over HTTP: a real dashboard on loopback over real jobs' storage.

Its safety (the token on every route, the front door's Host, Origin and body rules, read-only),
what its JSON and ``/metrics`` say of a finished job, the token file, the command line.  What a
browser makes of the pages is tests/test_dashboard_browser.py.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import requests
from dashboard_jobs import failed_job, running_map, running_with_a_failure, serving, wait_for_file
from prometheus_client.parser import text_string_to_metric_families

import fnmap
from fnmap.cost.pricing import usd
from fnmap.dashboard import auth, views
from fnmap.dashboard.listing import JobList
from fnmap.errors import ConfigError
from fnmap.observe import records
from fnmap.storage import open_store

TOKEN = "a-test-token-of-enough-length"


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return tmp_path_factory.mktemp("dashboard-storage").as_uri()


@pytest.fixture(scope="module")
def job_id(storage, tmp_path_factory):
    return failed_job(storage, str(tmp_path_factory.mktemp("marker")))


@pytest.fixture(scope="module")
def dashboard(storage, job_id):
    with serving(storage, TOKEN) as d:
        yield d


def _get(dashboard, path: str, **kwargs) -> requests.Response:
    return requests.get(dashboard.url.rstrip("/") + path, timeout=30, allow_redirects=False, **kwargs)


def _authed(dashboard, path: str, **kwargs) -> requests.Response:
    return _get(dashboard, path, cookies={auth.COOKIE: TOKEN}, **kwargs)


ROUTES = ["/", "/jobs/{job}", "/static/list.js", "/static/dashboard.css", "/api/jobs", "/api/jobs/{job}",
          "/api/jobs/{job}/summary", "/api/jobs/{job}/calls/3", "/metrics", "/no-such-page"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_needs_the_token(dashboard, job_id, route):
    path = route.format(job=job_id)
    assert _get(dashboard, path).status_code == 401
    assert _get(dashboard, path, cookies={auth.COOKIE: TOKEN + "x"}).status_code == 401
    assert _get(dashboard, path, headers={"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
    ok = _authed(dashboard, path)
    assert ok.status_code == (404 if route == "/no-such-page" else 200), ok.text
    assert _get(dashboard, path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == ok.status_code


def test_the_url_token_is_traded_for_a_cookie(dashboard, job_id):
    """The printed URL's token leaves the address bar: a redirect to the same page sets a cookie
    that scripts cannot read and other sites' requests do not carry."""
    first = _get(dashboard, f"/jobs/{job_id}?token={TOKEN}")
    assert first.status_code == 303 and first.headers["Location"] == f"/jobs/{job_id}"
    cookie = first.headers["Set-Cookie"]
    assert f"{auth.COOKIE}={TOKEN}" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert _get(dashboard, "/?token=wrong-token-wrong-token").status_code == 401


def test_every_answer_forbids_inline_scripts_and_framing(dashboard):
    answer = _authed(dashboard, "/")
    csp = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert "<script src=\"/static/list.js\"" in answer.text and "innerHTML" not in _authed(
        dashboard, "/static/list.js").text


def test_a_foreign_host_is_refused_on_any_port(dashboard):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 sends its own name as Host."""
    port = dashboard.server.port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example:80"):
        answer = _authed(dashboard, "/api/jobs", headers={"Host": host})
        assert answer.status_code == 403, host
        assert "Host" in answer.text
    for host in (f"localhost:{port}", "localhost:9999", f"127.0.0.1:{port}"):  # a port forward's port too
        assert _authed(dashboard, "/api/jobs", headers={"Host": host}).status_code == 200, host


def test_cross_origin_and_form_posts_are_refused_and_nothing_writes(dashboard):
    url = dashboard.url + "api/jobs"
    cookies = {auth.COOKIE: TOKEN}
    foreign = requests.post(url, cookies=cookies, headers={"Origin": "http://evil.example"}, json={}, timeout=30)
    assert foreign.status_code == 403 and "cross-origin" in foreign.text
    site = requests.get(url, cookies=cookies, headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
    assert site.status_code == 403
    form = requests.post(url, cookies=cookies, data="a=1", timeout=30,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    plain = requests.post(url, cookies=cookies, data="x", headers={"Content-Type": "text/plain"}, timeout=30)
    assert form.status_code == plain.status_code == 415
    own = dashboard.url.rstrip("/")
    same_origin = requests.post(url, cookies=cookies, json={}, headers={"Origin": own}, timeout=30)
    assert same_origin.status_code == 405  # read-only: no route takes a body


def test_a_failed_job_page_has_its_traceback_and_output(dashboard, job_id):
    page = _authed(dashboard, f"/api/jobs/{job_id}").json()
    assert page["summary"]["status"] == "failed"
    failures = page["failures"]
    assert failures["total"] == 1 and failures["calls"][0]["call"] == 3
    traceback = failures["calls"][0]["traceback"]
    assert "ValueError: item 3 is <b>not</b> welcome" in traceback
    assert 'raise ValueError(f"item {x} is <b>not</b> welcome")' in traceback  # the user's source line
    kinds = page["timeline"]["kinds"]
    bars = {(bar[0], kinds[bar[3]]) for bar in page["timeline"]["bars"]}
    assert {(1, "retried"), (1, "ok"), (3, "failed"), (0, "ok")} <= bars
    assert page["progress"]["points"][-1][1] == 6
    assert any(c["command"].startswith("fnmap logs ") for c in page["commands"])
    output = _authed(dashboard, f"/api/jobs/{job_id[:10]}/calls/3").json()
    assert any("item 3 says hello" in a["text"] for a in output["attempts"])
    assert output["reported"] == [1] and output["failed_items"] == 1  # its status record, not the job's record
    summary = _authed(dashboard, f"/api/jobs/{job_id[:8]}/summary").json()["summary"]
    assert summary["job_id"] == job_id and summary["states"] == page["summary"]["states"]
    missing = _authed(dashboard, "/api/jobs/0123456789abcdef")
    assert missing.status_code == 404 and "no job id starts with" in missing.json()["error"]


def test_metrics_parse_as_prometheus_text(dashboard, job_id):
    answer = _authed(dashboard, "/metrics")
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("fnmap_jobs", (("status", "failed"),))] == 1
    mine = (("function", "failed_job.<locals>.work"), ("job_id", job_id))
    assert samples[("fnmap_job_calls", (*mine, ("state", "failed")))] == 1
    assert samples[("fnmap_job_calls", (*mine, ("state", "succeeded")))] == 5
    assert samples[("fnmap_job_items", mine)] == 6
    assert samples[("fnmap_job_failed_items", mine)] == 1
    assert samples[("fnmap_job_retries_total", mine)] == 1
    assert samples[("fnmap_job_cost_usd", mine)] > 0
    assert ("fnmap_job_call_duration_seconds", (*mine, ("quantile", "0.95"))) in samples
    assert families["fnmap_job_retries"].type == "counter"


def test_the_list_sees_new_jobs_and_running_ones_change(storage, tmp_path):
    """The front page's list keeps ended jobs' entries, but reads new ones and running ones again."""
    store = open_store(storage, "test", create=False)
    listing = JobList(store, recheck=3600)  # an ended job's entry is not read again during the test
    before = {row["job_id"] for row in listing.rows()}
    release = str(tmp_path / "release")
    held = fnmap.Executor(storage=storage)
    future = held.submit(wait_for_file(release), 7)
    try:
        running = _wait_for(lambda: [r for r in listing.rows() if r["job_id"] not in before], "the new job")
        assert running[0]["status"] == "running"
    finally:
        open(release, "w").close()
        assert future.result(timeout=60) == 7
        held.shutdown()
    ended = _wait_for(lambda: [r for r in listing.rows() if r["job_id"] == running[0]["job_id"]
                               and r["status"] == "succeeded"], "the job's end")
    assert ended[0]["states"]["succeeded"] == 1
    assert ended[0]["usd_text"] == usd(ended[0]["usd"])  # the money is sent as text, formatted once
    # An ended job's entry is kept, not read again: rewritten in storage, the list still shows what it read.
    summary = next(s for s in listing.summaries() if s["job_id"] == ended[0]["job_id"])
    records.write_index(store, {**summary, "function": "rewritten"})
    assert [r["function"] for r in listing.rows() if r["job_id"] == summary["job_id"]] == [summary["function"]]
    fresh = JobList(store, recheck=0)  # one that keeps nothing reads the rewritten entry
    assert [r["function"] for r in fresh.rows() if r["job_id"] == summary["job_id"]] == ["rewritten"]


def _wait_for(probe, what: str, timeout: float = 30.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not show within {timeout} s")


def test_the_token_file_is_private_and_kept(tmp_path):
    path = str(tmp_path / "run" / "dashboard.token")
    token = auth.load_or_create_token(path)
    assert len(token) >= 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert auth.load_or_create_token(path) == token  # kept across restarts: bookmarks, scrapers
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        auth.load_or_create_token(path)


def test_attempt_kinds():
    """How each attempt shows: a fault followed by another attempt is a retry, a copy is a copy,
    an attempt another one decided is stopped, one not ended is running."""
    call = {"copies": [3]}
    kind = views.attempt_kind
    assert kind(call, {"attempt": 1, "ended": 2.0, "outcome": "crashed"}, later=True) == "retried"
    assert kind(call, {"attempt": 1, "ended": 2.0, "outcome": "crashed"}, later=False) == "failed"
    assert kind(call, {"attempt": 2, "ended": 2.0, "outcome": "error"}, later=False) == "failed"
    assert kind(call, {"attempt": 3, "ended": 2.0, "outcome": "ok"}, later=False) == "copy"
    assert kind(call, {"attempt": 2, "ended": 2.0, "outcome": "superseded"}, later=True) == "stopped"
    assert kind(call, {"attempt": 2, "ended": 2.0, "outcome": "cancelled"}, later=False) == "stopped"
    assert kind(call, {"attempt": 4, "ended": None, "outcome": None}, later=False) == "running"
    assert kind(call, {"attempt": 1, "ended": 2.0, "outcome": "ok"}, later=False) == "ok"


def _calls(n: int, failed_every: int, retried_every: int) -> list[dict]:
    """``n`` calls of one ok attempt, but every ``failed_every``-th failed and every
    ``retried_every``-th ok after a crash (0: none)."""
    calls = []
    for i in range(n):
        attempts = [{"attempt": 1, "sent": 1.0 + i, "ended": 2.0 + i, "outcome": "ok"}]
        if failed_every and i % failed_every == 3:
            attempts[0]["outcome"] = "error"
        elif retried_every and i % retried_every == 7:
            attempts.insert(0, {"attempt": 1, "sent": 1.0 + i, "ended": 1.5 + i, "outcome": "crashed"})
            attempts[1]["attempt"] = 2
        calls.append({"call": i, "attempts": attempts})
    return calls


def _drawn(calls: list[dict], kind: str) -> list[int]:
    drawn = views.timeline({"created": 0.0, "calls": calls, "summary": {}}, now=5000.0)
    return [bar[0] for bar in drawn["bars"] if drawn["kinds"][bar[3]] == kind]


def test_a_big_timeline_keeps_every_failure_and_samples_the_rest(monkeypatch):
    """Past MAX_BARS the successes are sampled, and past half of it the other notable bars too
    (a retried call has two: the crash and the ok after it), never a failure."""
    monkeypatch.setattr(views, "MAX_BARS", 100)
    calls = _calls(1000, failed_every=100, retried_every=10)  # 10 failed, 100 retried calls
    drawn = views.timeline({"created": 0.0, "calls": calls, "summary": {}}, now=5000.0)
    assert drawn["total"] == 1100 and len(drawn["bars"]) <= 100
    assert _drawn(calls, "failed") == [i for i in range(1000) if i % 100 == 3]
    assert 0 < len(_drawn(calls, "retried")) < 100
    assert drawn["last_call"] == 999


def test_a_timeline_of_more_failures_than_its_bars_keeps_every_failure(monkeypatch):
    monkeypatch.setattr(views, "MAX_BARS", 100)
    calls = _calls(1000, failed_every=4, retried_every=0)  # 250 failed calls
    assert _drawn(calls, "failed") == [i for i in range(1000) if i % 4 == 3]


def test_the_command_prints_the_url_and_serves(storage, job_id, tmp_path):
    token_file = tmp_path / "token"
    proc = subprocess.Popen([sys.executable, "-m", "fnmap", "dashboard", "--storage", storage, "--port", "0",
                             "--token-file", str(token_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = proc.stdout.readline().strip()
        token = token_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/?token={token}")
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        session = requests.Session()
        assert session.get(url, timeout=30).status_code == 200  # the redirect set the cookie
        jobs = session.get(url.split("?")[0] + "api/jobs", timeout=30).json()["jobs"]
        assert job_id in [j["job_id"] for j in jobs]
        assert records.load(open_store(storage, "t", create=False), job_id)["summary"]["status"] == "failed"
    finally:
        proc.terminate()
        assert proc.wait(20) == 0, proc.stderr.read()
    helped = subprocess.run([sys.executable, "-m", "fnmap", "dashboard", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0 and "--token-file" in helped.stdout and "/metrics" in helped.stdout


def test_a_running_job_page_offers_cancel_and_spans_every_call(dashboard, storage, tmp_path):
    """While a map runs, its page is rebuilt from the workers' reports: it says so (not that items
    have no result), offers `fnmap cancel`, and its timeline spans all the job's calls."""
    with running_map(storage, str(tmp_path / "release")) as results:
        rows = _wait_for(lambda: [r for r in _authed(dashboard, "/api/jobs").json()["jobs"]
                                  if r["status"] == "running"], "the running job")
        page = _authed(dashboard, f"/api/jobs/{rows[0]['job_id']}").json()
        assert page["summary"]["status"] == "running"
        assert len(page["notes"]) == 1 and page["notes"][0].startswith("running: ")
        assert any(c["command"].startswith("fnmap cancel ") for c in page["commands"])
        assert page["timeline"]["last_call"] == 3
    assert results == [0, 1, 2, 3]


def test_a_running_jobs_failed_call_shows_its_error_and_traceback(dashboard, storage, tmp_path):
    """While a job runs (call 2 waits), its page lists call 1's failure with its error and remote
    traceback (where the call's output answer sends the reader): not ``error: ?`` and ``null``."""
    with running_with_a_failure(storage, str(tmp_path / "release")) as job:
        page = _authed(dashboard, f"/api/jobs/{job.id}").json()
    assert page["summary"]["status"] == "running"
    (failed,) = page["failures"]["calls"]
    assert (failed["call"], failed["error"]) == (1, "KeyError: 'no such thing as 1'")
    assert "raise KeyError" in failed["traceback"]
