"""The manual, checked: the README stays a front door, and the pages under docs/ build into a site
with no broken link, no missing heading and no page left out of ``mkdocs.yml``'s nav.

MkDocs itself runs (``mkdocs build --strict``, with every check of ``validation:`` raised to a
warning), so a link is judged the way the site resolves it. The README is not part of the site;
its links into docs/ are checked here against the pages' headings, slugged as MkDocs slugs them.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import yaml
from markdown.extensions.toc import slugify

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_LINES = 400
#: What CI runs (.ci/run), as the README's first lines tell a newcomer to run it.
CI_COMMANDS = ('pip install -e ".[test]" && python examples/quickstart.py', "python -m pytest -n 2")


def nav_pages(nav: list) -> list[str]:
    """Every page file a MkDocs nav lists, nested sections included."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            pages += nav_pages(value)
        elif not re.match(r"[a-z]+://", value):
            pages.append(value)
    return pages


def headings(page: pathlib.Path) -> set[str]:
    """The anchors of a page's headings (code blocks skipped), as MkDocs' toc extension makes them."""
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(slugify(m.group(1).replace("`", ""), "-"))
    return anchors


def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "security" / "index.html").exists(), sorted(p.name for p in site.iterdir())


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), listed
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing, unknown = sorted(pages - set(listed)), sorted(set(listed) - pages)
    assert not missing and not unknown, f"pages not in nav: {missing}; nav entries with no page: {unknown}"


def test_the_readme_is_a_front_door():
    text = README.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES}): move a topic to docs/"
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    for command in CI_COMMANDS:
        assert command in first_block, command
        assert command in (ROOT / ".ci" / "run").read_text(), command


def test_the_readmes_links_lead_somewhere():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local), links
    broken = []
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in headings(target):
            broken.append(f"{link}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, broken


def section_code(page: pathlib.Path, heading: str) -> str:
    """The first ```python block under ``heading`` (a line ``## heading``) of ``page``, before the next heading."""
    text = page.read_text().split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{2,6} ", text, maxsplit=1)[0]  # not "# ": a comment in a code block
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"{page.name}: no python example under {heading!r}"
    return found.group(1)


def test_the_fault_example_of_the_operations_guide_runs(tmp_path):
    """It plays an unreliable platform on a fresh emulator with chunksize=1: its retries must carry it
    through (the default retries=2 failed one such run in five)."""
    script = tmp_path / "faults.py"
    script.write_text(section_code(DOCS / "operations.md", "## Faults on purpose"))
    env = dict(os.environ, FNMAP_STORAGE=(tmp_path / "store").as_uri())  # its emulator ends with it (conftest)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
