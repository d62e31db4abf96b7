"""One public API (issue 43): ``airflow_txn_provider.API`` lists it, each name resolves from the
package's top, type checkers see the same names, every import shown in README.md, docs/ and
dags/ works, and what README.md and docs/ import comes from the top."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_txn_provider
from airflow_txn_provider import API

ROOT = Path(__file__).resolve().parents[2]
IMPORT = re.compile(r"^\s*from (airflow_txn_provider[\w.]*) import (\([^)]*\)|[^\n]+)", re.M)


def shown_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``from airflow_txn_provider… import …`` in ``path`` (a
    Markdown page's or a Python file's text, code blocks and docstrings included)."""
    found = []
    for match in IMPORT.finditer(path.read_text(encoding="utf-8")):
        statement = ast.parse(match.group(0).strip()).body[0]
        assert isinstance(statement, ast.ImportFrom) and statement.module
        found.append((statement.module, [alias.name for alias in statement.names]))
    return found


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


@pytest.mark.parametrize("name", sorted(API))
def test_each_public_name_resolves_from_the_top(name):
    value = getattr(airflow_txn_provider, name)
    assert value is getattr(importlib.import_module(API[name]), name)


def test_type_checkers_see_exactly_the_public_names():
    tree = ast.parse(Path(airflow_txn_provider.__file__).read_text(encoding="utf-8"))
    [block] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == API


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        airflow_txn_provider.NoSuchThing  # noqa: B018
    from airflow_txn_provider.log import schema  # a submodule is still importable from the top

    assert schema.__name__ == "airflow_txn_provider.log.schema"


def test_importing_the_package_imports_no_public_module():
    code = (
        "import sys, airflow_txn_provider; "
        "print(sorted(m for m in sys.modules if m.startswith('airflow_txn_provider.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_pages_and_the_dags_show_imports_at_all():
    assert sum(len(shown_imports(page)) for page in PAGES) >= 6
    assert sum(len(shown_imports(dag)) for dag in DAG_FILES) >= 7


@pytest.mark.parametrize("path", PAGES + DAG_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_shown_works(path):
    for module, names in shown_imports(path):
        imported = importlib.import_module(module)
        missing = [name for name in names if not hasattr(imported, name)]
        assert not missing, f"{path.name}: from {module} import {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_readme_and_the_docs_import_the_public_api(page):
    for module, names in shown_imports(page):
        assert module == "airflow_txn_provider", f"{page.name}: from {module} import {names}"
        assert set(names) <= set(API), f"{page.name}: {sorted(set(names) - set(API))}"
