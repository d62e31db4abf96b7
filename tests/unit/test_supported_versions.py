"""The supported versions are said in three places that must agree: pyproject.toml's ranges, the
cells `make test-matrix` builds (scripts/test_matrix.py), and the tables of docs/deployment.md
and the README; the last matrix run's table in the docs names every cell."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DASH = " \N{EN DASH} "  # as the tables write a range


def _matrix():
    spec = importlib.util.spec_from_file_location(
        "test_matrix", ROOT / "scripts" / "test_matrix.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _project() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _range(name: str) -> SpecifierSet:
    found = [Requirement(r) for r in _project()["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, name
    return found[0].specifier


def _ends(spec: SpecifierSet) -> tuple[str, str]:
    """The floor and the newest minor below the ceiling of a ``>=a,<b`` range, as the docs say
    them: (``3.1.1``, ``3.3``) for ``>=3.1.1,<3.4``."""
    floor = next(s.version for s in spec if s.operator == ">=")
    ceiling = Version(next(s.version for s in spec if s.operator == "<"))
    return floor, f"{ceiling.major}.{ceiling.minor - 1}"


def test_the_tables_say_pyprojects_ranges():
    python = SpecifierSet(_project()["requires-python"])
    wanted = {
        "Python": DASH.join(_ends(python)),
        "Airflow": DASH.join(_ends(_range("apache-airflow"))),
        "PySpark beside Airflow": DASH.join(_ends(_range("pyspark"))),
    }
    assert wanted == {
        "Python": DASH.join(("3.10", "3.13")),
        "Airflow": DASH.join(("3.1.1", "3.3")),
        "PySpark beside Airflow": DASH.join(("3.5.2", "4.3")),
    }
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for what, versions in wanted.items():
        assert re.search(rf"^\| {re.escape(what)} \| {re.escape(versions)} \|", deployment, re.M)
    readme = (ROOT / "README.md").read_text()
    assert "| " + " | ".join(wanted.values()) + " |" in readme


def test_every_cell_lies_in_the_ranges_and_the_corners_are_cells():
    cells = _matrix().CELLS
    python = SpecifierSet(_project()["requires-python"])
    airflow, pyspark = _range("apache-airflow"), _range("pyspark")
    for cell in cells:
        assert Version(cell.python) in python, cell
        # a minor's newest patch is what the cell installs
        assert Version(f"{cell.airflow}.99") in airflow, cell
        assert Version(f"{cell.pyspark}.99") in pyspark, cell
    corners = {(c.airflow, c.pyspark) for c in cells}
    oldest, newest = _ends(airflow)[0].rsplit(".", 1)[0], _ends(airflow)[1]
    spark_oldest, spark_newest = _ends(pyspark)[0].rsplit(".", 1)[0], _ends(pyspark)[1]
    assert corners >= {(a, s) for a in (oldest, newest) for s in (spark_oldest, spark_newest)}
    assert {c.python for c in cells} >= {_ends(python)[0], _ends(python)[1]}
    assert [c.name for c in cells if c.lock] == ["lock"]


def test_the_docs_show_the_last_matrix_run_of_every_cell():
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    block = deployment.split("<!-- matrix results -->")[1].split("<!-- /matrix results -->")[0]
    for cell in _matrix().CELLS:
        assert re.search(rf"^\| `{re.escape(cell.name)}` \|", block, re.M), cell.name
