"""The house's figures at one or more git revisions, side by side (issue 58's before/after table):
modules and lines per feature, the Parquet discovery's lines, in-function imports of the
package's own modules, module docstring lines, modules with a test at the mirrored path, and
scenario files left flat in ``tests/integration``.

    python scripts/house_figures.py 0aa0a3f HEAD
    python scripts/house_figures.py --discovery-parts HEAD

Reads the revisions through ``git`` (nothing is checked out); prints a Markdown table. With
``--discovery-parts``: the Parquet discovery's lines at one revision by what they do (each line
counted once: blank lines and comments with the statement after them).
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


_PARTS = {
    "the source's settings and checks": "PartitionedParquetSource __post_init__ partitions"
    " catalog_key lineage_dataset",
    "the begin (latest offsets, the next ranges)": "latest_offsets initialize_transaction",
    "listing changed folders, reading new files' footers": "log _PartitionLook lists"
    " _known_names look _listing _folder_of _stat discover file_offsets",
    "offset-named files looked up by name (file_name_template)": "RELIST_NAMED_NS check_template"
    " _by_name",
    "a look reused (under the lock; a waker's idle polls)": "PREFETCH_REUSE_S prefetch _stamp"
    " _Seen",
    "a batch's files, found for its job": "_batch_files _files_holding",
    "the batch's read in Spark (one scan, counts, footer proof, malformed records)": "Ranges Files"
    " FOOTER_PROOF_FILES read_batch _located _read_by_partition _ranges records batch_counts"
    " counts_mismatch malformed_records describe_location _rows_match read_with_partition_column"
    " _reads_back",
    "the catalog in the log's Postgres (its SQL)": "NAME_SEGMENTS ANALYZE_AFTER PostgresCatalog"
    " _LOCK_CLASS _columns _partition _RECORD_FILES _RECORD_PARTITIONS _FORGET",
    "the catalog's model, its in-memory copy, a source's binding": "MARGIN_NS Folder FileFacts"
    " trusted listing_holds Partition Look FileCatalog MemoryCatalog S UsesCatalog"
    " with_log_catalog",
}
PART_OF = {name: part for part, names in _PARTS.items() for name in names.split()}
SPLIT = {"PartitionedParquetSource", "_PartitionLook"}  # classes whose methods are parts' own
HEAD_PART = "module docstrings and imports"


def _units(source: str) -> list[tuple[int, int, str]]:
    """Each statement's first and last line and its part, in order (a class in ``SPLIT``: its
    header, fields and docstring as one, each method as one)."""
    units = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom | ast.If) or (
            isinstance(node, ast.Expr) and not units  # the module docstring
        ):
            units.append((node.lineno, node.end_lineno or node.lineno, HEAD_PART))
            continue
        if isinstance(node, ast.Expr) and units:  # an attribute docstring: its assignment's
            units[-1] = (units[-1][0], node.end_lineno or node.lineno, units[-1][2])
            continue
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        name = getattr(node, "name", None) or next(t.id for t in targets if t is not None)
        if name not in PART_OF:
            raise SystemExit(f"--discovery-parts: {name} has no part (add it to _PARTS)")
        if name not in SPLIT:
            units.append((_first_line(node), node.end_lineno or node.lineno, PART_OF[name]))
            continue
        methods = [f for f in node.body if isinstance(f, ast.FunctionDef)]
        units.append((node.lineno, _first_line(methods[0]) - 1, PART_OF[name]))
        units += [(_first_line(f), f.end_lineno or f.lineno, PART_OF[f.name]) for f in methods]
    return units


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return decorators[0].lineno if decorators else node.lineno


def discovery_parts(rev: str) -> dict[str, int]:
    """The lines of the discovery's modules at ``rev``, by part."""
    lines: dict[str, int] = dict.fromkeys([HEAD_PART, *_PARTS], 0)
    for module, text in package_modules(rev).items():
        if module not in DISCOVERY:
            continue
        counted = 0
        for _, last, part in _units(text):  # a statement takes the lines before it (blank, #)
            lines[part] += last - counted
            counted = last
        lines[HEAD_PART] += text.count("\n") - counted
    return lines


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
    parser.add_argument(
        "--discovery-parts", action="store_true", help="the discovery's lines by part"
    )
    args = parser.parse_args(argv)
    revs = args.revs
    if args.discovery_parts:
        parts = {rev: discovery_parts(rev) for rev in revs}
        print("| Parquet discovery's lines, by part | " + " | ".join(revs) + " |")
        print("|---|" + "---|" * len(revs))
        for part in (*_PARTS, HEAD_PART, "in all"):
            cells = [str(sum(p.values()) if part == "in all" else p[part]) for p in parts.values()]
            print(f"| {part} | " + " | ".join(cells) + " |")
        return 0
    table = {rev: figures(rev) for rev in revs}
    rows = list(next(iter(table.values())))
    print("| | " + " | ".join(revs) + " |")
    print("|---|" + "---|" * len(revs))
    for row in rows:
        print(f"| {row} | " + " | ".join(table[rev][row] for rev in revs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
