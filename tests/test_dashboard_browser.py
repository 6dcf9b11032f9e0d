"""``fnmap dashboard`` in a real browser: Debian's headless Chromium driven by Selenium.

The front page lists a finished job with a failed item and a running job, and follows them live
(a job appears and ends without a reload); a job's page draws its timeline and shows the failed
item's traceback and output; a function named ``<script>alert(1)</script>`` and a traceback full
of markup show as text, and no alert opens.  Each page's screenshot is saved (into a folder named
by ``DASHBOARD_SCREENSHOTS``, e.g. ``docs``, when set: the README's pictures).

Chromium comes from Debian (``apt-get install chromium chromium-driver``).  CI runs exactly the
README's two commands, so where it is missing on CI (``CI`` set, root, apt-get at hand) the
first browser test installs it; elsewhere the tests are skipped, saying how to install it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile

import pytest
from dashboard_jobs import MARKUP_ERROR, MARKUP_NAME, failed_job, markup_job, running_map, serving

#: Where the pages' screenshots go besides the test's folder (the tests' variable, not fnmap's).
SCREENSHOTS = os.environ.get("DASHBOARD_SCREENSHOTS")
TOKEN = "a-browser-test-token-of-enough-length"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
WAIT = 30


def _chromium() -> tuple[str | None, str | None]:
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def _install_chromium() -> None:
    """On CI, as root: Debian's chromium and chromium-driver (one installer at a time across the
    test processes); an apt list too old to have them is updated first."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
    with open(os.path.join(tempfile.gettempdir(), "fnmap-chromium-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(_chromium()):
            return
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
            done = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"apt-get could not install Chromium: {done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not all(_chromium()):
        if os.environ.get("CI") and os.geteuid() == 0 and shutil.which("apt-get"):
            _install_chromium()
        else:
            pytest.skip("needs Debian's Chromium: apt-get install chromium chromium-driver")
    binary, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument("--window-size=1280,1000")
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)  # a driver of its own: nothing fetched
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return tmp_path_factory.mktemp("dashboard-browser-storage").as_uri()


@pytest.fixture(scope="module")
def jobs(storage, tmp_path_factory):
    """The failed job and the markup job, finished before the dashboard starts."""
    return {"failed": failed_job(storage, str(tmp_path_factory.mktemp("marker")), items=24),
            "markup": markup_job(storage)}


@pytest.fixture(scope="module")
def dashboard(storage, jobs):
    with serving(storage, TOKEN) as d:
        yield d


def _until(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(lambda d: condition(d), message=what)


def _row(driver, job_id: str):
    return driver.execute_script("""
        return [...document.querySelectorAll('#jobs tbody tr')].find((r) => r.dataset.job === arguments[0]) || null;""",
                                 job_id)


def _cell_texts(driver, job_id: str) -> list[str] | None:
    """The texts of a job's row, read in one go (the page may redraw the table between two reads)."""
    return driver.execute_script("""
        const row = [...document.querySelectorAll('#jobs tbody tr')].find((r) => r.dataset.job === arguments[0]);
        return row ? [...row.cells].map((td) => td.innerText) : null;""", job_id)


def _no_alert(driver) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 -- reading it is what raises when no alert is open


def _console_errors(driver) -> list[str]:
    """SEVERE console lines: a script error, or the page's policy refusing one of its own files."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _screenshot(driver, tmp_path, name: str, height: int) -> None:
    driver.set_window_size(1280, height)
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(str(tmp_path / name))
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        driver.save_screenshot(os.path.join(SCREENSHOTS, name))
    driver.set_window_size(1280, 1000)


def test_the_front_page_lists_jobs_and_follows_a_running_one_live(browser, dashboard, jobs, storage, tmp_path):
    browser.get(dashboard.url_with_token)
    assert "token=" not in browser.current_url  # traded for a cookie
    failed = _until(browser, lambda d: _cell_texts(d, jobs["failed"]), "the failed job's row")
    assert failed[1] == "failed" and "1 failed" in failed[3] and "24 (1 failed)" == failed[4]
    _until(browser, lambda d: d.find_element("id", "count").text == "2 jobs", "two jobs counted")
    browser.execute_script("window.fnmapNotReloaded = true")
    with running_map(storage, str(tmp_path / "release"), WAIT) as results:
        _until(browser, lambda d: d.find_element("id", "count").text == "3 jobs", "the new job listed, live")
        listed = browser.execute_script(
            "return [...document.querySelectorAll('#jobs tbody tr')].map((r) => r.dataset.job)")
        new = next(job_id for job_id in listed if job_id not in jobs.values())
        running = _until(browser, lambda d: (t := _cell_texts(d, new)) and "1 done" in t[3] and t,
                         "the running job's first call done, live")
        assert running[1] == "running" and "1 done, 3 running of 4" in running[3]
        _screenshot(browser, tmp_path, "dashboard-jobs.png", 560)
    assert results == [0, 1, 2, 3]
    ended = _until(browser, lambda d: (t := _cell_texts(d, new)) and t[1] == "succeeded" and t, "the job's end, live")
    assert "4 succeeded of 4" in ended[3]
    assert browser.execute_script("return window.fnmapNotReloaded") is True  # no reload in between
    assert _console_errors(browser) == []


def test_the_filters_narrow_the_list(browser, dashboard, jobs):
    browser.get(dashboard.url_with_token)
    _until(browser, lambda d: _row(d, jobs["failed"]), "the failed job's row")
    browser.find_element("id", "function-filter").send_keys("work")
    _until(browser, lambda d: _row(d, jobs["markup"]) is None, "the other function filtered out")
    assert _row(browser, jobs["failed"]) is not None
    browser.find_element("id", "function-filter").clear()
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "status-filter")).select_by_value("succeeded")
    _until(browser, lambda d: _row(d, jobs["failed"]) is None, "failed jobs filtered out")


def _timeline_pixels(driver, colour: str) -> int:
    """Pixels of ``colour`` (``#rrggbb``) drawn on the timeline's canvas."""
    return driver.execute_script("""
        const c = document.getElementById('timeline'), hex = arguments[0];
        const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < px.length; i += 4)
          if (px[i] === want[0] && px[i + 1] === want[1] && px[i + 2] === want[2]) n++;
        return n;""", colour)


def test_a_job_page_draws_its_timeline_and_shows_the_traceback(browser, dashboard, jobs, tmp_path):
    browser.get(dashboard.url_with_token)
    _until(browser, lambda d: _row(d, jobs["failed"]), "the failed job's row")
    _row(browser, jobs["failed"]).find_element("css selector", "a").click()
    traceback = _until(browser, lambda d: d.find_elements("css selector", "#failures pre.traceback"),
                       "the traceback")[0]
    assert "ValueError: item 3 is <b>not</b> welcome" in traceback.text
    assert 'raise ValueError(f"item {x} is <b>not</b> welcome")' in traceback.text
    assert browser.find_elements("css selector", "#failures b") == []  # the markup stayed text
    for colour, kind in (("#4f9a5f", "ok"), ("#c44e52", "failed"), ("#dd8452", "retried")):
        assert _timeline_pixels(browser, colour) > 0, f"no {kind} bar drawn"
    assert "25 attempts" in browser.find_element("id", "timeline-note").text
    browser.find_element("css selector", "#failures details button").click()
    _until(browser, lambda d: "item 3 says hello" in d.find_element("id", "output").text, "call 3's output")
    commands = browser.find_element("id", "commands").text
    assert f"fnmap logs {jobs['failed'][:12]}" in commands
    _screenshot(browser, tmp_path, "dashboard-job.png", 1900)
    assert _console_errors(browser) == []


def test_markup_in_a_name_or_a_traceback_stays_text(browser, dashboard, jobs):
    browser.get(dashboard.url_with_token)
    name = _until(browser, lambda d: (t := _cell_texts(d, jobs["markup"])) and t[2], "the markup job's row")
    assert name == MARKUP_NAME
    _no_alert(browser)
    assert browser.execute_script("return document.scripts.length") == 2  # common.js, list.js: no other
    browser.get(dashboard.url + "jobs/" + jobs["markup"])
    traceback = _until(browser, lambda d: d.find_elements("css selector", "#failures pre.traceback"),
                       "the traceback")[0]
    assert MARKUP_ERROR in traceback.text
    assert MARKUP_NAME in browser.find_element("id", "title").text
    assert MARKUP_NAME in browser.title
    _no_alert(browser)
    assert browser.find_elements("css selector", "main img, main b, main script") == []
    with contextlib.suppress(Exception):
        browser.get_log("browser")  # clear what the previous pages logged


def test_a_page_without_the_token_shows_nothing(browser, dashboard, jobs):
    browser.delete_all_cookies()
    browser.get(dashboard.url + "jobs/" + jobs["failed"])
    assert "needs its token" in browser.find_element("tag name", "body").text
    assert browser.find_elements("id", "failures") == []
