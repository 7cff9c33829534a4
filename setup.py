"""Packaging beyond pyproject.toml: the top-level notebooks/, params/ and examples/ folders
ship inside the wheel as ``workbench/_data/<folder>`` (one copy, mapped, never moved), where
:mod:`workbench.resources` reads them with importlib.resources."""

from setuptools import find_packages, setup

DATA = {"notebooks": ["*.ipynb"], "params": ["*.yaml"], "examples": ["**/*"]}

setup(
    package_dir={"": "src", **{f"workbench._data.{name}": name for name in DATA}},
    packages=find_packages("src") + [f"workbench._data.{name}" for name in DATA],
    package_data={"workbench": ["py.typed", "sim/corpus.json"], **{f"workbench._data.{n}": g for n, g in DATA.items()}},
    exclude_package_data={"": [".ipynb_checkpoints/*", "*.pyc"]},
)
