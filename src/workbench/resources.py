"""The files the package carries: report notebooks, parameter files and example data.

In the repository they live at the top (``notebooks/``, ``params/``, ``examples/``); the
wheel carries the same files as ``workbench/_data/<folder>`` (mapped by ``setup.py``, one
copy). :func:`data_root` finds the folder holding the three, through importlib.resources
in an installed package and in the checkout when running from the sources. The folders
keep their relative layout, so the demo parameter files' ``../examples/...`` paths hold in
both.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Literal

from workbench.errors import InputError

__all__ = ["DataKind", "data_dir", "data_root", "report_names"]

DataKind = Literal["notebooks", "params", "examples"]


def data_root() -> Path:
    """The folder holding notebooks/, params/ and examples/ (packaged, else the checkout's)."""
    packaged = importlib.resources.files("workbench") / "_data"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "notebooks").is_dir() and (checkout / "params").is_dir():
        return checkout
    raise InputError("the workbench package is missing its notebooks and parameter files "
                     "(reinstall it: pip install --force-reinstall workbench)")


def data_dir(kind: DataKind) -> Path:
    """One of the carried folders."""
    return data_root() / kind


def report_names() -> list[str]:
    """The report notebooks the package carries, by name."""
    return sorted(p.stem for p in data_dir("notebooks").glob("*.ipynb"))
