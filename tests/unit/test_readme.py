"""The README is a front door (at most 12 KB; the figures and the architecture live in docs/), the
architecture page's table names every module of the package (and nothing that is gone), and the
README's screenshots (and the docs' pages') are those the browser test retakes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_txn_provider"


def _architecture_table() -> str:
    page = (ROOT / "docs" / "architecture.md").read_text()
    return page.split("\nNot in the wheel", 1)[0]


def _named_modules() -> set[str]:
    """Paths (relative to the package) of the first column's `...` names."""
    names: set[str] = set()
    for line in _architecture_table().splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names.update(re.findall(r"`([^`]+)`", first))
    return names


def _package_modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" or "/migrations/" in f"/{rel}":
            continue
        found.add(rel)
    return found


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 12 * 1024, f"README.md is {len(readme)} bytes; figures go to docs/"
    text = readme.decode()
    assert text.index("make demo") < 600 and text.index("make test") < 600  # the two commands


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """Moving sections between pages must not leave a link pointing at nothing (anchors aside)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if not path or "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_every_module_has_its_room_in_the_architecture_page():
    named = _named_modules()
    files = {n for n in named if n.endswith(".py")}
    missing = _package_modules() - files
    assert not missing, f"modules docs/architecture.md's table does not name: {missing}"
    gone = {n for n in named if not (PACKAGE / n).exists()}
    assert not gone, f"docs/architecture.md's table names what does not exist: {gone}"


def test_the_readmes_screenshots_are_those_the_browser_test_retakes():
    """``make screenshots`` retakes what the README shows: the same names, each file present."""
    from tests.browser import README_SCREENSHOTS

    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"\(docs/screenshots/([\w-]+)\.png\)", readme)
    assert sorted(shown) == sorted(README_SCREENSHOTS)
    assert all((ROOT / "docs" / "screenshots" / f"{name}.png").is_file() for name in shown)


def test_the_docs_screenshots_are_those_the_browser_test_retakes():
    """The pages under docs/ show the screenshots ``make screenshots`` retakes for them."""
    from tests.browser import DOCS_SCREENSHOTS

    for page in sorted((ROOT / "docs").glob("*.md")):
        shown = re.findall(r"\(screenshots/([\w-]+)\.png\)", page.read_text())
        assert sorted(shown) == sorted(DOCS_SCREENSHOTS.get(page.name, ())), page.name
        assert all((ROOT / "docs" / "screenshots" / f"{name}.png").is_file() for name in shown)
