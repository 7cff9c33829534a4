"""Report notebooks and their parameters: which notebook, which values, checked before a run.

A notebook declares its parameters in the cell tagged ``parameters``, one plain literal each
(``name = literal`` or ``name: type = literal``): :func:`notebook_parameters` reads them.
A parameter file is a YAML mapping of some of them; ``-p key=value`` overrides are YAML
scalars. Unknown keys and values of the wrong type raise ConfigError naming the key and the
file (or ``-p``). The values of the path parameters (:data:`PATH_PARAMETERS`) are paths:
relative ones are resolved against the parameter file's folder (the current directory for
overrides; a packaged file's ``outputs/`` paths against the current directory, where
``workbench demo`` writes). Run from a job folder, ``workbench report NAME`` takes
./notebooks/NAME.ipynb and ./params/NAME.yaml when they exist, else the packaged ones.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from workbench.config import load_yaml_params, load_yaml_text
from workbench.errors import ConfigError
from workbench.report.jupyter import fast_jupyter_imports
from workbench.resources import data_dir, data_root, report_names

__all__ = [
    "DEMO_REPORTS",
    "PATH_PARAMETERS",
    "REPORTS",
    "default_params",
    "find_notebook",
    "load_parameters",
    "notebook_parameters",
    "notebook_path",
    "notebooks_dir",
    "parse_overrides",
    "resolve_paths",
]

REPORTS = ("token_distribution", "format_validation", "explore")

DEMO_REPORTS = ("token_distribution", "format_validation")

PATH_PARAMETERS = ("run_dir", "tokenizer", "sweep_dir", "sweep_params", "compare_run_dir",
                   "decontaminate")  # decontaminate: a list of paths

_TYPE_NAMES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool,
                               "list": list, "dict": dict, "Any": Any}


def notebooks_dir() -> Path:
    """The report notebooks the package carries (see :mod:`workbench.resources`)."""
    return data_dir("notebooks")


def _looks_like_path(name: str) -> bool:
    return name.endswith(".ipynb") or "/" in name or os.sep in name


def notebook_path(name: str) -> Path:
    """The package's notebook NAME (ConfigError naming the known ones when there is none)."""
    return find_notebook(name, None)


def find_notebook(name: str, folder: Path | None) -> Path:
    """NAME's notebook: in `folder` when given, else ./notebooks/NAME.ipynb (a job folder made
    by `workbench init`) when it exists, else the packaged one. A path to a notebook file is
    taken as it is."""
    if _looks_like_path(name):
        path = Path(name).expanduser()
        if path.is_file() and path.suffix == ".ipynb":
            return path
        raise ConfigError("NAME", f"{name}: no such notebook file "
                                  f"(or give a report name: {', '.join(report_names())})")
    candidates = [folder] if folder is not None else [Path("notebooks"), notebooks_dir()]
    for candidate in candidates:
        if (candidate / f"{name}.ipynb").is_file():
            return candidate / f"{name}.ipynb"
    known = sorted({p.stem for c in candidates for p in c.glob("*.ipynb")}) or ["none"]
    raise ConfigError("NAME", f"no report named {name!r} (known: {', '.join(known)})")


def default_params(name: str) -> Path | None:
    """The parameter file `workbench report NAME` uses without --params: ./params/NAME.yaml
    (a job folder's) when it exists, else the packaged params/NAME.demo.yaml, else None."""
    local = Path("params") / f"{name}.yaml"
    if local.is_file():
        return local
    packaged = data_dir("params") / f"{name}.demo.yaml"
    return packaged if packaged.is_file() else None


def _parameters_source(notebook: Path) -> str:
    fast_jupyter_imports()
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return str(cell.source)
    raise ConfigError("", "no cell tagged 'parameters'", str(notebook))


def _annotation(node: ast.expr, where: str) -> Any:
    """The type an annotation names: plain types, None, ``Optional[T]`` and ``T | U``."""
    if isinstance(node, ast.Name) and node.id in _TYPE_NAMES:
        return _TYPE_NAMES[node.id]
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return _annotation(node.slice, where) | None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation(node.left, where) | _annotation(node.right, where)
    raise ConfigError("", f"parameter type {ast.unparse(node)!r} is not a plain type", where)


def _literal_type(value: object) -> Any:
    return Any if value is None else type(value)


def _assignment(node: ast.stmt, where: str) -> tuple[str, ast.expr, ast.expr | None]:
    """(name, value, annotation) of one statement of a parameters cell."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        return node.target.id, node.value, node.annotation
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value, None
    raise ConfigError("", f"parameters cell line {node.lineno}: expected name = literal", where)


def notebook_parameters(notebook: str | os.PathLike[str]) -> dict[str, tuple[Any, Any]]:
    """name -> (type, default) of the notebook's ``parameters`` cell.

    The type is the annotation when given (``x: Optional[int] = None``; papermill reads
    that spelling, not ``int | None``), else the default's type (Any for None). Imports
    (``from typing import Optional``) are skipped; any other statement that is not a
    literal assignment is a ConfigError.
    """
    where = str(notebook)
    found: dict[str, tuple[Any, Any]] = {}
    for node in ast.parse(_parameters_source(Path(notebook))).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        name, value, annotation = _assignment(node, where)
        try:
            default = ast.literal_eval(value)
        except ValueError:
            raise ConfigError(name, "default is not a plain literal", where) from None
        kind = _literal_type(default) if annotation is None else _annotation(annotation, where)
        found[name] = (kind, default)
    return found


@functools.lru_cache(maxsize=16)
def _struct(items: tuple[tuple[str, Any], ...]) -> type[msgspec.Struct]:
    """A struct of optional fields (UNSET when not given) for the given (name, type)."""
    fields = [(name, kind | msgspec.UnsetType, msgspec.UNSET) for name, kind in items]  # type: ignore[operator]
    return msgspec.defstruct("ReportParameters", fields, forbid_unknown_fields=True, kw_only=True)


def _struct_for(parameters: Mapping[str, tuple[Any, Any]]) -> type[msgspec.Struct]:
    return _struct(tuple((name, kind) for name, (kind, _) in parameters.items()))


def _given(value: msgspec.Struct) -> dict[str, Any]:
    return {k: v for k, v in msgspec.structs.asdict(value).items() if v is not msgspec.UNSET}


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` as a dict, each value read as a YAML scalar (``true``, ``3``,
    ``null``, ``a/b``) or a flow list of them (``[a.jsonl, b.jsonl]``), Python's ``None``
    also read as null (as the notebooks write it); ConfigError for an item without ``=`` or
    with a mapping or nested value."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("-p", f"expected key=value, got {item!r}")
        try:
            value = (None if text.strip() == "None"
                     else load_yaml_text(text, key.strip(), "-p") if text.strip() else "")
        except yaml.YAMLError:
            value = text
        if isinstance(value, dict) or isinstance(value, list) and any(
                isinstance(item, dict | list) for item in value):
            raise ConfigError(key.strip(), f"expected a value or a list of values, got {text!r}",
                              "-p")
        found[key.strip()] = value
    return found


def _check_overrides(overrides: Mapping[str, Any], struct: type[msgspec.Struct]) -> dict[str, Any]:
    known = struct.__struct_fields__
    checked: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(key, f"unknown parameter (known: {', '.join(known)})", "-p")
        try:
            checked.update(_given(_converted(key, value, struct)))
        except msgspec.ValidationError as exc:
            message = str(exc).split(" - at ")[0]
            raise ConfigError(key, f"{message[0].lower()}{message[1:]}", "-p") from None
    return checked


def _converted(key: str, value: Any, struct: type[msgspec.Struct]) -> msgspec.Struct:
    """{key: value} as the parameters' struct; a text given for a list parameter is its
    comma-separated items (``-p decontaminate=a.jsonl,b.jsonl``)."""
    try:
        return msgspec.convert({key: value}, struct, str_keys=True)
    except msgspec.ValidationError:
        if not isinstance(value, str):
            raise
        items = [item.strip() for item in value.split(",") if item.strip()]
        try:
            return msgspec.convert({key: items}, struct, str_keys=True)
        except msgspec.ValidationError:
            pass
        raise


def resolve_paths(values: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The path parameters made absolute against base; a relative path of a packaged file
    (base inside the packaged folder) that points into its ``outputs/`` (which the package
    does not carry: the demo parameter files and notebooks point there) is taken under the
    current folder instead, where `workbench demo` writes."""
    out = dict(values)
    root = data_root().resolve()
    packaged = base.resolve().is_relative_to(root)
    def resolved(value: str) -> str:
        given = Path(value).expanduser()
        path = (base / given).resolve()
        if packaged and not given.is_absolute() and path.is_relative_to(root / "outputs"):
            path = Path.cwd().resolve() / path.relative_to(root)
        return str(path)

    for key in PATH_PARAMETERS:
        value = out.get(key)
        if isinstance(value, str) and value:
            out[key] = resolved(value)
        elif isinstance(value, list):
            out[key] = [resolved(v) if isinstance(v, str) and v else v for v in value]
    return out


def load_parameters(
    notebook: str | os.PathLike[str],
    params_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters to inject: the file's, then the overrides', checked against the
    notebook's parameters cell, path parameters made absolute."""
    struct = _struct_for(notebook_parameters(notebook))
    values: dict[str, Any] = {}
    if params_file is not None:
        loaded = load_yaml_params(Path(params_file), struct, source=str(params_file))
        values = resolve_paths(_given(loaded), Path(params_file).resolve().parent)
    values.update(resolve_paths(_check_overrides(overrides or {}, struct), Path.cwd()))
    return values
