"""One word for each rule, counted: a rule said in one place cannot drift into two wordings.

Each count is over ``fnmap/`` as it is on disk; each checker is also run on a probe of the wording
it replaced (the old code's own lines), so a checker that finds nothing cannot pass by being blind.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
from test_imports import import_graph

ROOT = pathlib.Path(__file__).resolve().parent.parent
FNMAP = ROOT / "fnmap"
REPORT = "fnmap/observe/report.py"
#: The words of job and call states (a tuple of only these is a definition of states).
STATE_WORDS = {"succeeded", "failed", "cancelled", "capped", "incomplete", "abandoned", "running", "pending",
               "unknown", "done", "ok", "retried"}


def sources() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted(FNMAP.rglob("*.py"))}


def state_tuples(source: str) -> list[str]:
    """Names assigned a tuple of two or more state words at module level."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and len(node.value.elts) > 1:
            words = [e.value if isinstance(e, ast.Constant) else e.id.lower()  # ABANDONED names "abandoned"
                     for e in node.value.elts if isinstance(e, (ast.Constant, ast.Name))]
            if len(words) == len(node.value.elts) and set(words) <= STATE_WORDS:
                found += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return found


def test_job_and_call_states_are_defined_in_the_report_layer_only():
    defined = {path: names for path, text in sources().items() if (names := state_tuples(text))}
    assert list(defined) == [REPORT], defined
    assert sorted(defined[REPORT]) == ["CALL_STATES", "JOB_STATUSES", "UNFINISHED"], defined
    old = ('FINAL = ("succeeded", "failed", "cancelled", "capped", "incomplete", ABANDONED)\n'
           'UNFINISHED = ("pending", "running")\nKINDS = ("ok", "failed", "slow")\n')
    assert state_tuples(old) == ["FINAL", "UNFINISHED"]


#: A test of a call's status against call states: ``c["status"] not in ("ok", ...)``, ``in UNFINISHED``.
CALL_FILTER = re.compile(r'status"\)?\]?\s+(not\s+)?in\s+\(?\s*'
                         r'(\*?UNFINISHED|"(ok|pending)"|"cancelled",\s*("pending"|\*UNFINISHED))')


def test_which_calls_ended_or_failed_is_said_by_the_report_layer_and_the_records_only():
    found = [f"{path}:{n}" for path, text in sources().items() if path not in (REPORT, "fnmap/observe/records.py")
             for n, line in enumerate(text.splitlines(), 1) if CALL_FILTER.search(line)]
    assert found == [], found
    old = ('failed = [c for c in calls if c["status"] not in ("ok", "cancelled", *UNFINISHED)]\n'
           'if call.get("status") in UNFINISHED:\nif c["status"] in ("cancelled", "pending", "running")\n'
           'if detail["status"] in _TERMINAL:\nif summary["status"] in ("running", "unknown", ABANDONED):\n')
    assert len([line for line in old.splitlines() if CALL_FILTER.search(line)]) == 3


#: An amount of money formatted in place: ``f"${spent:.6f}"``.
MONEY = re.compile(r"\$\{[^}]*:\.\d+f\}")


def test_money_is_formatted_by_one_function():
    found = [f"{path}:{n}" for path, text in sources().items()
             for n, line in enumerate(text.splitlines(), 1) if MONEY.search(line)]
    assert len(found) == 1 and found[0].startswith("fnmap/cost/pricing.py:"), found
    assert MONEY.search('f"job stopped: ${spent:.6f} spent"') and not MONEY.search('f"max_cost=${cap:g}"')
    scripts = "".join(p.read_text() for p in (FNMAP / "dashboard" / "static").glob("*.js"))
    assert "usd(" not in scripts  # the dashboard is sent the formatted text


def _defined(name: str, kind) -> list[str]:
    return [path for path, text in sources().items() for node in ast.parse(text).body
            if isinstance(node, kind) and name in ([node.name] if hasattr(node, "name") else
                                                  [t.id for t in node.targets if isinstance(t, ast.Name)])]


def test_one_default_region_and_one_public_estimate():
    assert _defined("DEFAULT_REGION", ast.Assign) == ["fnmap/cost/prices.py"]
    assert _defined("estimate", ast.FunctionDef) == ["fnmap/cost/forecast.py"]


def _closure(graph: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for name in graph[todo.pop()] - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_the_scheduler_imports_no_observe_module_and_the_dashboard_not_the_command_line():
    assert sorted(m for m in _closure(import_graph(), "fnmap.scheduler") if m.startswith("fnmap.observe")) == []
    assert "fnmap.cost.budget" in import_graph()["fnmap.scheduler"]
    upward = sorted(f"{m} -> {d}" for m, deps in import_graph().items() if m.startswith("fnmap.dashboard")
                    for d in deps if d.startswith("fnmap.cli"))
    assert upward == [], upward
    probe = {"fnmap/cost/budget.py": (FNMAP / "cost" / "budget.py").read_text() + "\nfrom ..observe import history\n"}
    assert "fnmap.observe.history" in _closure(import_graph(probe), "fnmap.scheduler")


#: What a front end did by hand around its SharedCap: appended to its jobs, told its error.
CAP_BOOKKEEPING = re.compile(r"\.jobs\.append\(|cap\.reached\(|_cap\.jobs = ")


def test_front_ends_use_the_shared_cap_as_one_construct():
    found = [f"{path}:{n}" for path in ("fnmap/api.py", "fnmap/joblib.py", "fnmap/cubed.py")
             for n, line in enumerate((ROOT / path).read_text().splitlines(), 1) if CAP_BOOKKEEPING.search(line)]
    assert found == [], found
    assert CAP_BOOKKEEPING.search("        cap.jobs.append(map_job)")


CITATION = re.compile(r"\bissues? \d+", re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(sources()))
def test_no_issue_numbers_in_the_code(path):
    """History belongs in git: a docstring says what a thing is for, not which issue made it."""
    cited = [f"{n}: {line.strip()}" for n, line in enumerate((ROOT / path).read_text().splitlines(), 1)
             if CITATION.search(line)]
    assert cited == [], cited


def test_the_layout_page_names_every_top_level_module_and_folder_and_only_real_paths():
    page = (ROOT / "docs" / "layout.md").read_text()
    named = set(re.findall(r"`([^`\s]+)`", page))
    tops = [p for p in FNMAP.iterdir() if p.name not in ("__init__.py", "__main__.py", "py.typed", "__pycache__")]
    missing = sorted(p.name for p in tops if not ({p.stem, p.name} & named if p.is_file()
                                                  else {f"{p.name}/", f"fnmap/{p.name}/"} & named))
    assert missing == [], f"docs/layout.md does not name {missing}"
    paths = [n for n in named if n.endswith((".py", "/"))]
    stale = sorted(n for n in paths if not ((FNMAP / n).exists() or (ROOT / n).exists()))
    assert stale == [], f"docs/layout.md names paths that do not exist: {stale}"
    assert {"emulator/sessions.py", "runtime/forks.py"} <= named
