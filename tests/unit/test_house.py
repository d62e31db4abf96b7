"""The house stays readable: no module of the provider grows past 500 lines (issue 28 split the
ones that had; a module that needs more has two jobs)."""

from __future__ import annotations

from pathlib import Path

import airflow_txn_provider

MAX_LINES = 500
PACKAGE = Path(airflow_txn_provider.__file__).parent


def test_no_module_of_the_provider_is_over_500_lines():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert len(sizes) > 50, sizes  # the package was found
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
