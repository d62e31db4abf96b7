"""The README: its architecture table names every module of the package (and nothing that is
gone), and its screenshots (and the docs' pages') are those the browser test retakes."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_txn_provider"


def _architecture_table() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Architecture\n", 1)[1]
    return section.split("\nNot in the wheel", 1)[0]


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
        if path.name == "__init__.py" or rel.startswith("migrations/"):
            continue
        found.add(rel)
    return found


def test_every_module_has_its_room_in_the_readme():
    named = _named_modules()
    files = {n for n in named if n.endswith(".py")}
    missing = _package_modules() - files
    assert not missing, f"modules the README's architecture table does not name: {missing}"
    gone = {n for n in named if not (PACKAGE / n).exists()}
    assert not gone, f"the README's architecture table names what does not exist: {gone}"


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
