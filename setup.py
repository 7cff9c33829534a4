"""Packaging beyond pyproject.toml: the top-level notebooks/, params/ and examples/ folders
ship inside the wheel as ``workbench/_data/<folder>`` (one copy, mapped, never moved), where
:mod:`workbench.resources` reads them with importlib.resources.

examples/ ships whole, subfolders included. Each of its subfolders whose name could be a
Python package (examples/data, examples/tokenizer, ...) is listed as a package of its own
holding the files directly in it: setuptools takes such a folder for a package and warns
about one that holds package data without being listed."""

from pathlib import Path

from setuptools import find_packages, setup

FLAT = {"notebooks": "*.ipynb", "params": "*.yaml"}  # the files directly in the folder
TREES = ("examples",)                                # every file, at any depth
SKIPPED = {"__pycache__", ".ipynb_checkpoints"}


def tree_packages(folder: str) -> dict[str, list[str]]:
    """workbench._data.<folder> and one package per subfolder, each with its own files; a
    subfolder that cannot be a package (its name is not an identifier) ships with its parent."""
    packages = {}
    for path in [Path(folder), *sorted(p for p in Path(folder).rglob("*") if p.is_dir())]:
        parts = path.relative_to(folder).parts
        if SKIPPED & set(parts) or not all(part.isidentifier() for part in parts):
            continue
        odd = sorted(p.name for p in path.iterdir()
                     if p.is_dir() and p.name not in SKIPPED and not p.name.isidentifier())
        packages[".".join(("workbench", "_data", folder, *parts))] = ["*", *(f"{d}/**/*" for d in odd)]
    return packages


DATA = {f"workbench._data.{name}": [glob] for name, glob in FLAT.items()}
for tree in TREES:
    DATA |= tree_packages(tree)

setup(
    package_dir={"": "src", **{f"workbench._data.{name}": name for name in (*FLAT, *TREES)}},
    packages=find_packages("src") + list(DATA),
    package_data={"workbench": ["py.typed", "sim/corpus.json"], **DATA},
    exclude_package_data={"": [".ipynb_checkpoints/*", "*.pyc"]},
)
