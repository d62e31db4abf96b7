"""The house's figures at one or more git revisions, side by side (issue 58's before/after table):
modules and lines per feature, the Parquet discovery's lines, in-function imports of the
package's own modules, module docstring lines, modules with a test at the mirrored path, and
scenario files left flat in ``tests/integration``.

    python scripts/house_figures.py 0aa0a3f HEAD

Reads the revisions through ``git`` (nothing is checked out); prints a Markdown table.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import PurePosixPath

PACKAGE = "airflow_txn_provider"
DISCOVERY = {
    # the files that found new Parquet files, as issue 58 counted them, and where that went
    "spark/parquet_source.py",
    "spark/parquet_index.py",
    "spark/parquet_discovery.py",
    "spark/parquet_read.py",
    "spark/file_index.py",
    "sources/parquet.py",
    "sources/parquet_discovery.py",
    "sources/parquet_read.py",
    "sources/catalog.py",
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def files(rev: str) -> list[str]:
    return git("ls-tree", "-r", "--name-only", rev).splitlines()


def package_modules(rev: str) -> dict[str, str]:
    """Each module of the package (path relative to it, migrations left out) and its text."""
    return {
        path.removeprefix(f"{PACKAGE}/"): git("show", f"{rev}:{path}")
        for path in files(rev)
        if path.startswith(f"{PACKAGE}/")
        and path.endswith(".py")
        and "/migrations/" not in path
        and not path.endswith("__init__.py")
    }


def own_imports_in_functions(source: str) -> int:
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith(PACKAGE):
                    count += 1
                elif isinstance(inner, ast.Import) and any(
                    a.name.startswith(PACKAGE) for a in inner.names
                ):
                    count += 1
    return count


def docstring_lines(source: str) -> int:
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return 0 if doc is None else doc.count("\n") + 1


def mirrored(module: str, tests: set[str]) -> bool:
    path = PurePosixPath(module)
    name = f"test_{path.name}"
    return any(
        f"tests/{tier}/{path.parent / name}".replace("/./", "/") in tests
        for tier in ("unit", "integration")
    )


def figures(rev: str) -> dict[str, str]:
    modules = package_modules(rev)
    every = files(rev)
    tests = {f for f in every if f.startswith("tests/")}

    def feature(word: str) -> str:
        found = {m: t for m, t in modules.items() if word in PurePosixPath(m).name}
        folders = {str(PurePosixPath(m).parent) for m in found}
        lines = sum(t.count("\n") for t in found.values())
        return f"{len(found)} in {len(folders)} folders, {lines:,} lines"

    discovery = {m: t for m, t in modules.items() if m in DISCOVERY}
    flat = [
        f
        for f in tests
        if PurePosixPath(f).parent == PurePosixPath("tests/integration")
        and PurePosixPath(f).name.startswith("test_")
    ]

    def count(measure: Callable[[str], int]) -> int:
        return sum(measure(t) for t in modules.values())

    with_test = sum(mirrored(m, tests) for m in modules)
    return {
        "package modules (lines)": f"{len(modules)} ({count(lambda t: t.count(chr(10))):,})",
        "the fill's modules": feature("fill"),
        "rewind's modules": feature("rewind"),
        "Parquet discovery (lines)": f"{len(discovery)} modules, "
        f"{sum(t.count(chr(10)) for t in discovery.values()):,} lines",
        "in-function imports of the package": str(count(own_imports_in_functions)),
        "module docstring lines": f"{count(docstring_lines):,}",
        "modules with a test at the mirrored path": f"{with_test} of {len(modules)}",
        "scenario files flat in tests/integration": str(len(flat)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="git revisions, e.g. 0aa0a3f HEAD")
    revs = parser.parse_args(argv).revs
    table = {rev: figures(rev) for rev in revs}
    rows = list(next(iter(table.values())))
    print("| | " + " | ".join(revs) + " |")
    print("|---|" + "---|" * len(revs))
    for row in rows:
        print(f"| {row} | " + " | ".join(table[rev][row] for rev in revs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
