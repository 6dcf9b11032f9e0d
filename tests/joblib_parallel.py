"""Run joblib's own ``test_parallel.py`` with the ``fnmap`` backend among its backends (opt-in script).

    python tests/joblib_parallel.py [--backend emulator|local] [--tests FILE] [-k PATTERN] [--timeout S]

``FILE`` is joblib's ``test/test_parallel.py``: by default the one the installed joblib ships
(``joblib/test/``).  Nothing of joblib's is copied here: its module is imported as pytest would,
after ``import fnmap.joblib`` registered the backend, so ``BACKENDS`` (and the lists joblib copies
from it: ``ALL_VALID_BACKENDS``, ``RETURN_GENERATOR_BACKENDS``, ``test_nested_loop``'s parent and
child backends) hold ``fnmap``; ``fnmap`` is then added to ``PARALLEL_BACKENDS`` (and its copy for
the context-manager cases), which joblib writes out as a literal list.  ``-k`` defaults to
``fnmap``: the cases that run on fnmap, nested ones included (``multiprocessing`` or ``loky``
around ``fnmap`` and the reverse).  Each case gets ``--timeout`` seconds (300, as the issue that
added this script saw ``test_nested_loop[multiprocessing-fnmap]`` hang for), so a hang is a
failure, not a stuck run.  Exit status 0 when every case that did not pass is ``EXPECTED`` below.

Not in the suite's 10-minute budget (it starts process pools and an emulator per forked child),
so a script.  Results (joblib 1.6.0, Python 3.11.7, the default emulator backend): 108 cases,
103 pass and one XPASS (joblib's own xfail) in about 9 s, and the 5 others are ``EXPECTED``
below; none hangs.  Before forked children got a fresh client (:mod:`fnmap.runtime.forks`), the
cases with ``multiprocessing`` around ``fnmap`` hung until their timeout.  With ``--backend local``
the calls run on the caller's own dispatch threads: ``fnmap`` nested in ``fnmap``
(``test_nested_loop[fnmap-fnmap]``, ``test_backend_nesting_level[*-fnmap-fnmap]``) waits for
threads its outer calls hold, and times out (the script's exit then waits for those calls, as an
executor's exit does); the other cases give 101 passed, the 4 loky ones
``EXPECTED`` (the Manager case passes: the tasks run in the caller's process).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)

#: Test id fragment -> why the case cannot pass on fnmap (an expected failure).
EXPECTED = {
    # loky starts its workers as fresh interpreters: "fnmap" is registered only in the caller's
    # process (by its `import fnmap.joblib`), so a Parallel naming it inside a loky task is refused
    # ("Invalid backend: fnmap").  back_compat_backend is joblib's LokyBackend subclass.
    "test_nested_loop[loky-fnmap]": "a Parallel naming fnmap inside a loky worker, which never imported fnmap.joblib",
    "test_nested_loop[back_compat_backend-fnmap]": "a Parallel naming fnmap inside a loky worker (joblib's "
                                                   "back_compat_backend is loky)",
    "test_backend_nesting_level[parallel_config-fnmap-loky]": "a parallel_config naming fnmap inside a loky worker",
    "test_backend_nesting_level[parallel_backend-fnmap-loky]": "a parallel_backend naming fnmap inside a loky worker",
    # The tasks append to a multiprocessing.Manager list: its proxy authenticates with the caller's
    # authkey, which a worker process of the emulator does not have.
    "test_dispatch_multiprocessing[fnmap]": "a multiprocessing.Manager list shared between the caller and the tasks",
}


class FnmapInJoblibTests:
    """pytest plugin: ``fnmap`` registered and added to the backend lists before collection."""

    def __init__(self, test_file: str):
        self.test_file = test_file

    def pytest_configure(self, config):
        for mark in ("thread_unsafe", "no_cover"):  # joblib's own marks (its conftest registers them)
            config.addinivalue_line("markers", f"{mark}: joblib's")

    def pytest_sessionstart(self, session):
        import importlib.util

        import fnmap.joblib  # noqa: F401 - registers the backend in joblib.parallel.BACKENDS

        name = "joblib.test.test_parallel"
        if os.path.samefile(self.test_file, _installed_test_file()):
            module = importlib.import_module(name)  # the module pytest then collects (same file)
        else:  # a joblib checkout's file: loaded under the same name, so pytest finds it imported
            spec = importlib.util.spec_from_file_location(name, self.test_file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        for listed in (module.PARALLEL_BACKENDS, module.all_backends_for_context_manager):
            if "fnmap" not in listed:
                listed.append("fnmap")


def _installed_test_file() -> str:
    import joblib

    return os.path.join(os.path.dirname(joblib.__file__), "test", "test_parallel.py")


def _expected(test_id: str) -> str | None:
    return next((why for fragment, why in EXPECTED.items() if fragment in test_id), None)


class _Outcomes:
    """pytest plugin: every case's outcome, by id."""

    def __init__(self):
        self.failed: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report):
        if report.failed and report.nodeid not in self.failed:
            self.failed.append(report.nodeid)
        elif report.when == "call" and report.passed:
            self.passed += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="emulator", help="fnmap backend the cases run on (FNMAP_BACKEND)")
    parser.add_argument("--tests", help="joblib's test/test_parallel.py (default: the installed joblib's)")
    parser.add_argument("-k", dest="pattern", default="fnmap", help="pytest -k expression (default: fnmap)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per case before it counts as hung")
    args = parser.parse_args()
    import pytest

    test_file = os.path.abspath(args.tests or _installed_test_file())
    if not os.path.isfile(test_file):
        sys.exit(f"no joblib test file at {test_file}: pass --tests FILE, joblib's test/test_parallel.py")
    os.environ["FNMAP_BACKEND"] = args.backend
    os.environ.setdefault("FNMAP_PROGRESS", "false")
    outcomes = _Outcomes()
    with tempfile.TemporaryDirectory(prefix="fnmap-joblib-") as scratch:
        os.environ.setdefault("FNMAP_STORAGE", "file://" + os.path.join(scratch, "storage"))
        pytest.main([test_file, "-k", args.pattern, "-q", "-p", "no:cacheprovider", "--rootdir", scratch,
                     "-c", os.devnull, f"--timeout={args.timeout}"],
                    plugins=[FnmapInJoblibTests(test_file), outcomes])
    unexpected = [test_id for test_id in outcomes.failed if _expected(test_id) is None]
    print(f"\n{outcomes.passed} passed, {len(outcomes.failed)} not passed "
          f"({len(outcomes.failed) - len(unexpected)} expected: they do not apply), {len(unexpected)} unexpected")
    for test_id in outcomes.failed:
        print(f"  {test_id}: {_expected(test_id) or 'UNEXPECTED'}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
