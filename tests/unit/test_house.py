"""The house stays readable: no module of the provider grows past 500 lines (issue 28 split the
ones that had; a module that needs more has two jobs); no import circle, not even through an
import inside a function (issue 43): a circle means two modules that cannot be read, tested or
moved apart; and the folders are layers whose imports only go down (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_txn_provider

MAX_LINES = 500
PACKAGE = Path(airflow_txn_provider.__file__).parent
NAME = airflow_txn_provider.__name__


def test_no_module_of_the_provider_is_over_500_lines():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert len(sizes) > 50, sizes  # the package was found
    over = {name: lines for name, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def _module_name(path: Path) -> str:
    parts = [NAME, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _skipped(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (no import at run time) and ``if __name__ == "__main__":`` (a module
    run as a program is the top of it, not a library edge)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return True
    return isinstance(test, ast.Compare) and ast.unparse(test) == "__name__ == '__main__'"


def _imported(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere (functions included)."""
    found: set[str] = set()
    own = _module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if _skipped(node):
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules} - {own}


def import_graph() -> dict[str, set[str]]:
    paths = {
        _module_name(path): path
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.relative_to(PACKAGE).parts
    }
    return {name: _imported(path, set(paths)) for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert len(graph) > 50
    # run_context imports the log's hook inside a function (a DAG file's parse stays light)
    assert f"{NAME}.hooks.txn_log" in graph[f"{NAME}.run_context"]


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, f"import circles: {found}"


LAYERS = {
    "compat": -1,
    "rules": 0,
    "utils": 1,
    "log": 2,
    "state": 3,
    "sinks": 3,
    "sources": 3,
    "transactions": 4,
    "spark": 5,
}
"""Each internal folder's height (docs/architecture.md, "Layers"): a module imports its own folder
or a lower one. ``state``, ``sinks`` and ``sources`` stand side by side: none imports another."""
FACE = {"hooks", "operators", "sensors", "triggers", "ui"}
"""The Airflow face, with the package's top-level modules: above every layer, imported by none."""
FACE_HEIGHT = max(LAYERS.values()) + 1


def layer_of(module: str) -> tuple[str, int]:
    """The folder (layer) of ``module`` and its height; a top-level module is the face's."""
    parts = module.split(".")
    if len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").exists():
        return "face", FACE_HEIGHT
    folder = parts[1]
    if folder in FACE:
        return "face", FACE_HEIGHT
    if folder not in LAYERS:
        raise AssertionError(f"{module}: its folder {folder}/ is in no layer: add it to LAYERS")
    return folder, LAYERS[folder]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a layer at its own height but another folder, or higher."""
    found = []
    for module, imported in sorted(graph.items()):
        if module == NAME:
            continue
        folder, height = layer_of(module)
        for target in sorted(imported - {NAME}):
            other, other_height = layer_of(target)
            if other != folder and other_height >= height:
                found.append(f"{module} ({folder}) imports {target} ({other})")
    return found


def test_the_package_top_imports_nothing_at_run_time():
    """The public API is imported on first use (PEP 562): a layer that reads ``__version__`` from
    the top imports no module of the face with it."""
    assert import_graph()[NAME] == set()


def test_every_module_is_in_a_layer():
    layers = {layer_of(m)[0] for m in import_graph() if m != NAME}
    assert layers == {*LAYERS, "face"}, layers


def test_imports_only_go_down():
    found = upward_imports(import_graph())
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_the_rules_import_nothing_but_themselves():
    """...and the standard library's Python 3.11 names backported (``compat.python``)."""
    graph = import_graph()
    rules = {m: graph[m] for m in graph if m.startswith(f"{NAME}.rules")}
    assert len(rules) >= 10, sorted(rules)
    allowed = (f"{NAME}.rules", f"{NAME}.compat.python")
    outside = {m: sorted(t for t in ts if not t.startswith(allowed)) for m, ts in rules.items()}
    assert not {m: ts for m, ts in outside.items() if ts}


def test_the_layer_check_finds_an_upward_import():
    graph = {
        f"{NAME}.rules.coordinator": {f"{NAME}.log.models"},
        f"{NAME}.log.models": {f"{NAME}.rules.vocabulary"},
        f"{NAME}.rules.vocabulary": set(),
        f"{NAME}.state.maps": {f"{NAME}.sinks.base"},
        f"{NAME}.sinks.base": set(),
        f"{NAME}.spark.job": {f"{NAME}.hooks.txn_log"},
        f"{NAME}.hooks.txn_log": {f"{NAME}.spark.job"},
    }
    assert upward_imports(graph) == [
        f"{NAME}.rules.coordinator (rules) imports {NAME}.log.models (log)",
        f"{NAME}.spark.job (spark) imports {NAME}.hooks.txn_log (face)",
        f"{NAME}.state.maps (state) imports {NAME}.sinks.base (sinks)",
    ]
