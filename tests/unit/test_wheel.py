"""The wheel users install holds the whole package: every module, the log's Alembic migrations,
the OpenLineage facets' schemas and the Transactions page's templates and assets (package data
that a move between folders can leave behind without any import failing in the source tree)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_txn_provider"


def _shipped(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    return "__pycache__" not in rel.parts and path.is_file() and path.suffix != ".pyc"


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed: `make install` puts it in .venv/bin")
    source = tmp_path / "source"  # a copy: the build leaves build/ and egg-info behind
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "var", "test-artifacts", "__pycache__", "*.egg-info", "build"
        ),
    )
    subprocess.run(
        # offline: setuptools comes from uv's cache, where `make install`'s build of the
        # package put it (a test sends nothing beyond loopback)
        [uv, "build", "--wheel", "--offline", "-o", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = {name for name in archive.namelist() if not name.endswith("/")}
    expected = {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*") if _shipped(path)}
    assert len(expected) > 100, sorted(expected)
    for folder in ("log/migrations/versions/", "utils/lineage_schemas/", "ui/templates/"):
        assert any(f"airflow_txn_provider/{folder}" in name for name in inside), folder
    missing = expected - inside
    assert not missing, f"the wheel lacks: {sorted(missing)}"
