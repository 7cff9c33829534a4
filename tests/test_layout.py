"""The package's shape: stage packages that import only downwards, no import circles, one
owner of the run directory's files, and rooms a person reads in a sitting (no module over
MAX_MODULE_LINES lines, no class over MAX_CLASS_LINES).

``python tests/test_layout.py`` prints the picture: the largest modules and classes, and
which packages each package imports (``make test`` prints it before the tests).

Every import of a workbench module counts, at module level or inside a function, under
``if TYPE_CHECKING:`` too: a function-level import that dodges a circle is still a circle.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import workbench

PACKAGE = Path(workbench.__file__).resolve().parent

# Lower layers first; a module may import its own package and any package of a lower layer.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    {"__init__", "errors", "compiling", "loops"},
    {"profiles", "resources", "text", "sketch", "modes"},
    {"config", "tokenizer"},
    {"chat"},
    {"rundir", "sim"},
    {"server"},
    {"generate", "analyze"},
    {"watch", "export", "report"},
    {"tune"},
    {"demo", "jobfolder"},
    {"cli"},
    {"__main__"},
))

MAX_MODULE_LINES = 800  # past this, a module holds two concerns: split it by concern
MAX_CLASS_LINES = 300

# Function-level imports of workbench modules, each for a reason other than a circle (a
# package's entry covers its modules too).
DEFERRED = {
    "workbench.cli": "each verb imports only its own stage, so a quick verb starts quickly",
    "workbench.report.explorer": "ipywidgets only in JupyterLab, never in a papermill report",
    "workbench.sim": "the app on first use: every verb builds the simulator's flags",
    "workbench.rundir.id_arrays": "numba's parser where installed, imported on first use",
    "workbench.sketch.compiled": "numba's loops where installed, imported on first use",
    "workbench.analyze.id_facts": "numba's pass where installed, imported on first use",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imported(name: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> Iterator[str]:
    """The workbench modules an import statement of module `name` imports."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name.startswith("workbench"))
        return
    base = node.module or ""
    if node.level:
        parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    if not base.startswith("workbench"):
        return
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        yield candidate if candidate in MODULES else base


def _imports(name: str) -> Iterator[tuple[str, bool]]:
    """(imported module, whether the import is inside a function) for every import."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside |= {id(child) for child in ast.walk(node) if child is not node}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in _imported(name, node, path.name == "__init__.py"):
                if target != name:
                    yield target, id(node) in inside


GRAPH = {name: sorted({target for target, _ in _imports(name)}) for name in MODULES}


def _package(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(name: str) -> int:
    package = _package(name)
    return next(index for index, layer in enumerate(LAYERS) if package in layer)


def test_every_package_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert {_package(name) for name in MODULES} <= placed


def test_imports_only_go_down() -> None:
    upward = [f"{name} -> {target}" for name, targets in GRAPH.items() for target in targets
              if _package(target) != _package(name) and _layer(target) >= _layer(name)]
    assert upward == []


def test_no_import_circles() -> None:
    """Tarjan's strongly connected components of the module graph are all single modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in GRAPH.get(name, []):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert circles == []


def test_function_level_imports_only_where_deferred_on_purpose() -> None:
    allowed = set(DEFERRED) | {name for name in MODULES if name.rpartition(".")[0] in DEFERRED}
    deferred = sorted({f"{name} -> {target}" for name in MODULES
                       for target, inside in _imports(name) if inside and name not in allowed})
    assert deferred == []


def test_the_graph_sees_function_level_and_type_checking_imports() -> None:
    assert "workbench.report.widgets" in GRAPH["workbench.report.explorer"]  # inside methods
    assert "workbench.analyze.scan" in GRAPH["workbench.analyze.subset"]  # under TYPE_CHECKING


def _string_constants(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


@pytest.mark.parametrize("file_name", ["run.json", "raw_responses.jsonl", "prompts.jsonl",
                                       "errors.jsonl", ".writer.lock", ".workbench-cache"])
def test_only_the_run_directory_names_its_files(file_name: str) -> None:
    """The run directory's file names are spelled in rundir/layout.py alone: every other
    module asks the owner (a name inside a longer message is fine)."""
    spelled = [name for name, path in MODULES.items()
               if name != "workbench.rundir.layout" and file_name in set(_string_constants(path))]
    assert spelled == []


def test_run_json_is_read_and_written_by_its_owner_only() -> None:
    """Only rundir.manifest reads or writes run.json (everyone else calls it)."""
    users = sorted(name for name in MODULES if name != "workbench.rundir.manifest"
                   and any(target == "workbench.rundir.layout" and "MANIFEST_FILE" in
                           MODULES[name].read_text(encoding="utf-8") for target in GRAPH[name]))
    assert users == ["workbench.rundir.run"]  # the run check names it in its messages


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_says_what_it_exports(name: str) -> None:
    module = importlib.import_module(name) if not name.endswith("__main__") else None
    if module is None or MODULES[name].name == "__init__.py":
        return
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{name} has no __all__"
    assert [n for n in exported if not hasattr(module, n)] == []


def _lines(name: str) -> int:
    return MODULES[name].read_text(encoding="utf-8").count("\n")


def _classes() -> Iterator[tuple[str, int]]:
    """(module.Class, lines) of every class, nested ones too."""
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                yield f"{name}.{node.name}", node.end_lineno - node.lineno + 1  # type: ignore[operator]


def test_no_module_is_past_its_size() -> None:
    big = {name: _lines(name) for name in MODULES if _lines(name) > MAX_MODULE_LINES}
    assert big == {}, f"split by concern: modules over {MAX_MODULE_LINES} lines"


def test_no_class_is_past_its_size() -> None:
    big = {name: lines for name, lines in _classes() if lines > MAX_CLASS_LINES}
    assert big == {}, f"split by concern: classes over {MAX_CLASS_LINES} lines"


def test_the_size_check_sees_every_class() -> None:
    classes = dict(_classes())
    assert "workbench.generate.dispatch.Runner" in classes
    assert 0 < classes["workbench.generate.dispatch.Runner"] <= MAX_CLASS_LINES


def picture(largest: int = 8) -> str:
    """The largest modules and classes against their limits, and each package's imports of
    other packages (module imports counted)."""
    modules = sorted(((_lines(name), name) for name in MODULES), reverse=True)
    classes = sorted(((lines, name) for name, lines in _classes()), reverse=True)
    total = sum(n for n, _ in modules)
    lines = [f"{len(MODULES)} modules, {total} lines; largest (limit {MAX_MODULE_LINES}):"]
    lines += [f"  {n:5d}  {name}" for n, name in modules[:largest]]
    lines.append(f"{len(classes)} classes; largest (limit {MAX_CLASS_LINES}):")
    lines += [f"  {n:5d}  {name}" for n, name in classes[:largest]]
    lines.append("imports between packages (layer: package -> packages, module imports):")
    edges: dict[str, Counter[str]] = {}
    for name, targets in GRAPH.items():
        for target in targets:
            if _package(target) != _package(name):
                edges.setdefault(_package(name), Counter())[_package(target)] += 1
    for package in sorted(edges, key=lambda p: (_layer(f"workbench.{p}"), p)):
        used = ", ".join(f"{target} {count}" for target, count in sorted(edges[package].items()))
        lines.append(f"  {_layer(f'workbench.{package}')}: {package} -> {used}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(picture() + "\n")
